// An impl that takes [B, T, H, D] (src/run/plugin_layout.hpp): its row prepares the case on
// permuted copies, the timed calls only call the prepared case, and reading the outputs permutes
// them back, so that the check sees the reference's layout; the record's bytes are the per-token
// tensors at their stored size. (The NumPy impl that runs through the executable in this layout
// is tests/python_kernels/bthd_kernel.py.)
#include <catch2/catch.hpp>

#include "core/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/run/plugin_layout.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

// A prepared case that counts what it is asked and hands back preset outputs.
struct Recorder final : PreparedCase {
  TensorSet inputs, outputs;
  int runs = 0, timed_calls = 0;
  void run() override { ++runs; }
  double time_ms(int calls) override {
    timed_calls += calls;
    return 1.0;
  }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet& out) override {
    for (const Tensor& t : outputs) out.at(t.name).data = t.data;
  }
};

}  // namespace

TEST_CASE("plugin layout: a per-token tensor is permuted to [B, T, H, ...] and back, states are not") {
  Tensor q{"q", Role::input, {2, 3, 4, 5}, {}};
  for (std::size_t i = 0; i < 2 * 3 * 4 * 5; ++i) q.data.push_back(float(i));
  Tensor moved = q;
  permute_tensor(moved, PluginLayout::bthd, true);
  // element (b, h, t, d) of ours is element (b, t, h, d) of theirs
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 3; ++h)
      for (std::size_t t = 0; t < 4; ++t)
        for (std::size_t d = 0; d < 5; ++d)
          REQUIRE(moved.data[((b * 4 + t) * 3 + h) * 5 + d] == q.data[((b * 3 + h) * 4 + t) * 5 + d]);
  permute_tensor(moved, PluginLayout::bthd, false);
  CHECK(moved.data == q.data);

  Tensor beta{"beta", Role::input, {1, 2, 3}, {0, 1, 2, 3, 4, 5}};
  permute_tensor(beta, PluginLayout::bthd, true);
  CHECK(beta.data == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor h0{"h0", Role::input, {1, 2, 3}, {0, 1, 2, 3, 4, 5}};
  permute_tensor(h0, PluginLayout::bthd, true);
  CHECK(h0.data == std::vector<float>{0, 1, 2, 3, 4, 5});
  permute_tensor(q, PluginLayout::bhtd, true);
  CHECK(q.data == moved.data);
}

TEST_CASE("plugin layout: the copy's bytes are the case's per-token tensors at their stored size") {
  Problem p{2, 3, 16, 8};
  p.decay = Decay::scalar;
  p.rule = Rule::delta;
  const Case fwd = test::kernel_case(p, "x:y", Mode::fwd, "cuda", "bf16");
  const std::size_t tokens = 2 * 3 * 16;
  // q k v o in bf16, g and beta float32
  CHECK(layout_copy_bytes(fwd, PluginLayout::bthd) == tokens * 8 * 2 * 4 + tokens * 4 * 2);
  const Case step = test::kernel_case(p, "x:y", Mode::fwd_bwd, "cuda", "bf16");
  // and dO dq dk dv, dg dbeta
  CHECK(layout_copy_bytes(step, PluginLayout::bthd) == tokens * 8 * 2 * 8 + tokens * 4 * 4);
  CHECK(layout_copy_bytes(step, PluginLayout::bhtd) == 0);
  const Case f32 = test::kernel_case(Problem{2, 3, 16, 8}, "x:y", Mode::fwd, "cpu", "float32");
  CHECK(layout_copy_bytes(f32, PluginLayout::bthd) == tokens * 8 * 4 * 4);
}

TEST_CASE("plugin layout: the impl's case gets permuted inputs, timed calls only call it, outputs come back") {
  const Case c = test::kernel_case(Problem{2, 3, 4, 5}, "x:y", Mode::fwd_bwd);
  const TensorSet inputs = make_case_inputs(c, 7);
  Recorder* recorder = nullptr;
  TensorSet theirs;  // the outputs the impl writes, in its layout
  auto prepared = prepare_in_layout(PluginLayout::bthd, c, inputs, [&](const TensorSet& in_layout) {
    auto r = std::make_unique<Recorder>();
    r->inputs = in_layout;
    r->outputs = make_case_outputs(c);
    for (const Tensor& t : r->outputs) {
      Tensor& out = *r->outputs.find(t.name);
      for (std::size_t i = 0; i < out.data.size(); ++i) out.data[i] = float(i);
      theirs.add(t.name, t.role, t.shape).data = out.data;
    }
    recorder = r.get();
    return std::unique_ptr<PreparedCase>(std::move(r));
  });
  REQUIRE(recorder);
  for (const Tensor& t : inputs) {
    Tensor expected = t;
    permute_tensor(expected, PluginLayout::bthd, true);
    INFO(t.name);
    CHECK(recorder->inputs.at(t.name).data == expected.data);
    CHECK((t.name == "h0" || t.name == "dhT" || recorder->inputs.at(t.name).data != t.data));
  }
  // Timing is the impl's calls alone: nothing is converted between them.
  const TensorSet before = recorder->inputs;
  CHECK(prepared->time_ms(5) == 1.0);
  prepared->run();
  CHECK(recorder->timed_calls == 5);
  CHECK(recorder->runs == 1);
  for (const Tensor& t : before) CHECK(recorder->inputs.at(t.name).data == t.data);

  TensorSet outputs = make_case_outputs(c);
  prepared->read_outputs(outputs);
  for (const Tensor& t : theirs) {
    Tensor expected = t;
    permute_tensor(expected, PluginLayout::bthd, false);
    INFO(t.name);
    CHECK(outputs.at(t.name).data == expected.data);
  }
  const MemoryUsage m = prepared->memory();
  CHECK(m.layout == "BTHD");
  CHECK(m.layout_copy_bytes == layout_copy_bytes(c, PluginLayout::bthd));
  CHECK(m.layout_copy_bytes > 0);
}

TEST_CASE("plugin layout: an impl in lattnbench's own layout is prepared on the inputs as they are") {
  const Case c = test::kernel_case(Problem{1, 2, 3, 4}, "x:y", Mode::fwd);
  const TensorSet inputs = make_case_inputs(c, 7);
  const TensorSet* seen = nullptr;
  auto prepared = prepare_in_layout(PluginLayout::bhtd, c, inputs, [&](const TensorSet& in_layout) {
    seen = &in_layout;
    return std::unique_ptr<PreparedCase>(std::make_unique<Recorder>());
  });
  CHECK(seen == &inputs);
  CHECK(prepared->memory().layout.empty());
}

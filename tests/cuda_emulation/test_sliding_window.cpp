// The sliding-window kernels (kernels/sliding_window/cuda.cu), run in the emulation, against the
// float64 sliding window of the layer reference (reference::sliding_window_forward / _backward in
// kernels/sliding_window/reference.cpp): O and the saved log-sum-exp L of the forward, dQ, dK, dV of
// the backward, float32 and bf16 (inputs rounded to bf16 for the reference too), window 1, window
// inside and past T, ragged T, Dh from 1 to 256; the backward's scratch against its closed form.
// And every block height (Bt) each of the three tiled kernels can be launched with under this
// run's device limit, read from the launch log.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "src/run/check.hpp"
#include "kernels/linear_attention/problem.hpp"
#include "kernels/sliding_window/cuda.hpp"
#include "kernels/sliding_window/op.hpp"
#include "cases.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "lattn_emu/control.hpp"
#include "kernels/sliding_window/reference.hpp"

using namespace lattn;
using namespace lattn::emulation_test;
using cuda::SwaProblem;

namespace {

std::string describe(const SwaProblem& p, cuda::Dtype dtype) {
  return std::string(dtype == cuda::Dtype::f32 ? "float32" : "bf16") + " B" + std::to_string(p.batch) + " H" +
         std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" + std::to_string(p.dim) + " W" +
         std::to_string(p.window);
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

void run_case(const SwaProblem& sp, cuda::Dtype dtype) {
  INFO(describe(sp, dtype));
  const Problem p{sp.batch, sp.heads, sp.seq, sp.dim, 1, Decay::none};
  const Case kase = test::window_case(p, sp.window, Mode::fwd_bwd, "cuda", dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  const TensorSet in = make_case_inputs(kase, 11);  // bf16 cases: rounded
  const DeviceBuffer q = upload_tokens(in.at("q").data, dtype), k = upload_tokens(in.at("k").data, dtype),
                     v = upload_tokens(in.at("v").data, dtype), dO = upload_tokens(in.at("dO").data, dtype);
  const DeviceBuffer o = output(sp.token_elems()), lse = output(sp.row_elems()), dq = output(sp.token_elems()),
                     dk = output(sp.token_elems()), dv = output(sp.token_elems());
  CountingDeviceAllocator allocator;
  cuda::swa_forward(sp, dtype, {q.get(), k.get(), v.get(), o.f(), lse.f()}, allocator, nullptr);
  cuda::swa_backward(sp, dtype, {q.get(), k.get(), v.get(), dO.get(), o.f(), lse.f(), dq.f(), dk.f(), dv.f()},
                     allocator, nullptr);
  CHECK(allocator.peak() == cuda::swa_backward_workspace_bytes(sp));

  const auto dq64 = widen(in.at("q").data), dk64 = widen(in.at("k").data), dv64 = widen(in.at("v").data),
             dO64 = widen(in.at("dO").data);
  std::vector<double> ro(sp.token_elems()), rl(sp.row_elems()), rdq(sp.token_elems()), rdk(sp.token_elems()),
      rdv(sp.token_elems());
  reference::sliding_window_forward(p, sp.window, dq64.data(), dk64.data(), dv64.data(), ro.data(), rl.data());
  reference::sliding_window_backward(p, sp.window, dq64.data(), dk64.data(), dv64.data(), dO64.data(), rdq.data(),
                                     rdk.data(), rdv.data());
  const double tolerance = kase.op->tolerance(kase.dtype);
  const std::map<std::string, std::pair<std::vector<float>, const std::vector<double>*>> outputs = {
      {"o", {o.floats(), &ro}}, {"lse", {lse.floats(), &rl}}, {"dq", {dq.floats(), &rdq}},
      {"dk", {dk.floats(), &rdk}}, {"dv", {dv.floats(), &rdv}}};
  for (const auto& [name, pair] : outputs) {
    const OutputError e = relative_l2_error(pair.first.data(), pair.second->data(), pair.first.size());
    INFO(name << ": rel_err " << e.rel_err << ", first non-finite " << e.first_non_finite);
    CHECK(e.first_non_finite < 0);
    CHECK(e.rel_err <= tolerance);
  }
}

// The block height of a tiled launch over `seq` rows: the one Bt the launcher's rule allows
// (64 and 32 only when seq is long enough) whose grid has the launch's row-block count.
int block_rows(int seq, unsigned row_blocks) {
  int found = 0, count = 0;
  for (int bt : {16, 32, 64})
    if ((bt == 16 || bt / 2 < (seq + 15) / 16 * 16) && unsigned((seq + bt - 1) / bt) == row_blocks) found = bt, ++count;
  return count == 1 ? found : 0;
}

}  // namespace

TEST_CASE("emulation: the sliding-window kernels match the float64 reference", "[emulation][swa]") {
  // (batch, heads, seq, dim, window): window 1; window past T (full causal); W = Bt + 2 and a
  // window across several blocks; ragged T (37, 100, 150); T = 1 and 5; Dh 1, 3, 20 (padded),
  // 64; two heads and two batches.
  const std::vector<SwaProblem> shapes = {{1, 1, 37, 64, 1},  {1, 2, 50, 32, 1000}, {2, 1, 100, 24, 17},
                                          {1, 1, 70, 1, 8},   {1, 1, 5, 3, 2},      {1, 1, 1, 7, 1},
                                          {1, 1, 20, 20, 5},  {1, 1, 150, 8, 66},   {1, 1, 40, 16, 34}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const SwaProblem& p : shapes) run_case(p, dtype);
}

TEST_CASE("emulation: every block height of the sliding-window kernels, under this run's device limit",
          "[emulation][tiles]") {
  const std::size_t limit = lattn_emu::shared_optin_limit();
  // T 12, 30 and 40 give Bt 16, 32 and 64 by the sequence rule; Dh 256 in float32 needs more
  // shared memory than the limits have at Bt 64 (and, for the dK/dV kernel, at 32 on A100's),
  // so there the limit chooses.
  struct Shape {
    SwaProblem p;
    cuda::Dtype dtype;
  };
  const std::vector<Shape> shapes = {{{1, 1, 12, 16, 5}, cuda::Dtype::f32},
                                     {{1, 1, 30, 16, 9}, cuda::Dtype::bf16},
                                     {{1, 1, 40, 16, 40}, cuda::Dtype::f32},
                                     {{1, 1, 40, 256, 20}, cuda::Dtype::f32}};
  std::map<std::string, std::set<int>> heights;
  std::set<std::string> limited;
  for (const Shape& s : shapes) {
    REQUIRE(!cuda::swa_unsupported(s.p, s.dtype, limit));
    lattn_emu::clear_launch_log();
    run_case(s.p, s.dtype);
    const int by_sequence = s.p.seq <= 16 ? 16 : s.p.seq <= 32 ? 32 : 64;
    for (const auto& launch : lattn_emu::launch_log()) {
      if (launch.kernel == "swa_delta_kernel") continue;  // one warp per row, no tiles
      const int bt = block_rows(s.p.seq, launch.grid.y);
      INFO(describe(s.p, s.dtype) << ": " << launch.kernel << " with " << launch.grid.y << " row blocks");
      REQUIRE(bt != 0);
      heights[launch.kernel].insert(bt);
      if (bt < by_sequence) limited.insert(launch.kernel);
    }
  }
  INFO("device limit " << limit);
  for (const char* kernel : {"swa_forward_kernel", "swa_dq_kernel", "swa_dkv_kernel"}) {
    INFO(kernel);
    CHECK(heights[kernel] == std::set<int>{16, 32, 64});
    CHECK(limited.count(kernel) == 1);
  }
}

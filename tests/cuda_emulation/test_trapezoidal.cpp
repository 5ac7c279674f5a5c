// The trapezoidal rule's CUDA rows (kernels/linear_attention/cuda/trapezoidal.cu: scan_trapezoidal
// on the scan, chunked_trapezoidal on the gated chunked kernels), run in the emulation through the
// variant table against the float64 reference with the runner's inputs and tolerances: every
// output and gradient (o, hT, dq, dk, dv, dh0, dg, ddt, dtrap), MIMO ranks 1, 2 and 4, float32 and
// bf16, weak and strong gates, on tests/trapezoidal_cases.hpp's shapes (T = 1, ragged last chunks,
// chunk 1, odd D, D 128, grouped heads with dim_v != dim, packed documents with one of a single
// token), the chunk states kept by the forward and recomputed by the backward; the scratch
// against the closed forms; and what the rows decline.
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "cases.hpp"
#include "core/op.hpp"
#include "device_buffers.hpp"
#include "kernels/linear_attention/cuda/trapezoidal.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "lattn_emu/control.hpp"
#include "src/run/check.hpp"
#include "trapezoidal_cases.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) {
    char text[48];
    std::snprintf(text, sizeof text, "%s=%.2e ", name.c_str(), e);
    s += text;
  }
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

std::string describe(const Case& c, bool keep) {
  return test::describe(c) + " mimo_rank " + c.option("mimo_rank") +
         (c.backward() && c.impl == "chunked" ? (keep ? " (states kept)" : " (states recomputed)") : "");
}

// One fwd or fwd_bwd of the form's row on `kase`, buffers sized by the op's tensor specs, every
// output held to the float64 reference; the scratch against the row's closed forms.
CheckResult run_trapezoidal(const Case& kase, bool keep) {
  const Problem p = linear_problem(kase);
  const cuda::Dtype dtype = kase.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32;
  const bool backward = kase.backward();
  const cuda::CudaVariant& row = cuda::cuda_variant_for(kase.impl, p);
  REQUIRE(row.name == (kase.impl == "scan" ? "scan_trapezoidal" : "chunked_trapezoidal"));
  keep = keep && backward && row.kept_states_bytes;
  const TensorSet in = make_case_inputs(kase, 7);  // bf16 cases: the token tensors rounded
  std::map<std::string, DeviceBuffer> device;
  for (const Tensor& t : in) {
    const bool token = t.name == "q" || t.name == "k" || t.name == "v" || t.name == "dO";
    device[t.name] = token ? upload_tokens(t.data, dtype) : upload(t.data);
  }
  TensorSet out = make_case_outputs(kase);
  for (const Tensor& t : out) device[t.name] = output(t.data.size());
  const auto at = [&](const char* name) -> void* { return device.count(name) ? device.at(name).get() : nullptr; };
  const auto f = [&](const char* name) { return static_cast<float*>(at(name)); };
  cuda::DeviceForward fwd{at("q"), at("k"), at("v"), f("h0"), f("o"), f("hT"), f("g")};
  fwd.dt = f("dt"), fwd.trap = f("trap");
  cuda::DeviceBackward bwd{at("q"), at("k"), at("v"), f("h0"), at("dO"), f("dhT"),
                           f("dq"), f("dk"), f("dv"), f("dh0"), f("g"), f("dg")};
  bwd.dt = f("dt"), bwd.trap = f("trap"), bwd.ddt = f("ddt"), bwd.dtrap = f("dtrap");
  CountingDeviceAllocator allocator;
  {
    const std::size_t kept_bytes = keep ? row.kept_states_bytes(p, dtype) : 0;
    Workspace<unsigned char> kept(allocator, kept_bytes);
    row.forward(p, dtype, fwd, allocator, nullptr, kept.data());
    // Kept states take the place of the forward's own (its closed form counts them either way).
    CHECK(allocator.peak() == row.forward_workspace_bytes(p, dtype));
    if (backward) {
      row.backward(p, dtype, bwd, allocator, nullptr, kept.data());
      const std::size_t expected = keep ? kept_bytes + row.backward_workspace_bytes(p, dtype, true)
                                        : std::max(row.forward_workspace_bytes(p, dtype),
                                                   row.backward_workspace_bytes(p, dtype, false));
      CHECK(allocator.peak() == expected);
    }
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, backward));
}

void expect_pass(const Case& c, bool keep) {
  INFO(describe(c, keep));
  const Problem p = linear_problem(c);
  const cuda::Dtype dtype = c.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32;
  if (c.impl == "chunked") REQUIRE_FALSE(cuda::trapezoidal_chunked_unsupported(p, dtype, lattn_emu::shared_optin_limit()));
  const CheckResult r = run_trapezoidal(c, keep);
  INFO(errors(r));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
  for (const char* name : {"o", "hT"}) CHECK(r.per_output.count(name) == 1);
  if (c.backward())
    for (const char* name : {"dq", "dk", "dv", "dh0", "dg", "ddt", "dtrap"}) CHECK(r.per_output.count(name) == 1);
}

}  // namespace

TEST_CASE("emulation: the CUDA trapezoidal rows match the float64 reference", "[emulation][trapezoidal]") {
  // Every shape in both forms, fwd_bwd, strong gates (gate_norm 1) in float32; on every other shape
  // bf16 too, in one form (the chunked one on the grouped, packed and ragged shapes), and on every
  // third shape weak gates (16) and the forward alone; the chunk states kept on even shapes and
  // recomputed on odd ones.
  const std::vector<Problem> shapes = test::trapezoidal_test_shapes();
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (const std::string impl : {"scan", "chunked"}) {
      const bool keep = i % 2 == 0;
      const std::string bf16_form = i % 4 == 1 ? "chunked" : "scan";
      expect_pass(test::trapezoidal_case(shapes[i], "1", impl, Mode::fwd_bwd, "cuda"), keep);
      if (i % 2 == 1 && impl == bf16_form)
        expect_pass(test::trapezoidal_case(shapes[i], "1", impl, Mode::fwd_bwd, "cuda", "bf16"), keep);
      if (i % 3 == 0) {
        expect_pass(test::trapezoidal_case(shapes[i], "16", impl, Mode::fwd_bwd, "cuda"), !keep);
        expect_pass(test::trapezoidal_case(shapes[i], "16", impl, Mode::fwd, "cuda"), false);
      }
    }
}

TEST_CASE("emulation: the CUDA trapezoidal rows take decay scalar and ranks up to their limit",
          "[emulation][trapezoidal]") {
  Problem p{1, 2, 24, 16, 8, Decay::scalar, Rule::trapezoidal};
  for (int rank : {1, 4, cuda::kTrapezoidalMaxRank}) {
    p.rank = rank;
    INFO("rank " << rank);
    const cuda::CudaVariant* scan = cuda::cuda_variant("scan", p);
    const cuda::CudaVariant* chunked = cuda::cuda_variant("chunked", p);
    REQUIRE(scan != nullptr);
    REQUIRE(chunked != nullptr);
    CHECK(scan->name == "scan_trapezoidal");
    CHECK(chunked->name == "chunked_trapezoidal");
  }
  // A rank past what the passes' shared memory holds, and every decay but scalar: declined with the reason.
  p.rank = cuda::kTrapezoidalMaxRank + 1;
  for (const std::string form : {"scan", "chunked"}) {
    std::string why;
    CHECK(cuda::cuda_variant(form, p, &why) == nullptr);
    CHECK_THAT(why, Catch::Matchers::Contains("mimo_rank <= " + std::to_string(cuda::kTrapezoidalMaxRank)));
  }
  p.rank = 2;
  for (Decay decay : {Decay::none, Decay::retnet, Decay::vector}) {
    p.decay = decay;
    for (const std::string form : {"scan", "chunked"}) {
      std::string why;
      CHECK(cuda::cuda_variant(form, p, &why) == nullptr);
      CHECK_THAT(why, Catch::Matchers::Contains(form + "_trapezoidal (decay scalar only)"));
    }
  }
}

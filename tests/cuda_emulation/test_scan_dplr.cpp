// The dplr rule's scan (kernels/linear_attention/cuda/scan_dplr.cu, the CUDA scan table's
// `scan_dplr` row) run in the emulation through the scan entry points, against the float64
// reference (kernels/linear_attention/reference_dplr.cpp) with the runner's inputs and tolerances:
// every output and gradient (o, hT; dq, dk, dv, dh0, da, db and, gated, dg), every decay, gates of
// the default strength and strong ones (gate_norm 1), float32 and bf16 token inputs (rounded before
// the reference sees them, as the runner does), ragged T, dims that leave lanes idle, take several
// warps or several column slices, and the shapes of docs/spec.md section 1c (grouped heads, dim_v !=
// dim, packed documents with one of length 1), fwd and fwd_bwd; the scratch against the row's
// closed forms and against the sizes the kernel's header gives.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>

#include "src/run/check.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "cases.hpp"
#include "cuda_backend_checks.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

Problem packed(Problem p, const std::vector<int>& lengths) {
  p.cu_seqlens = {0};
  for (int length : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + length);
  p.batch = 1;
  p.seq = p.cu_seqlens.back();
  return p;
}

Problem shaped(Problem p, int heads_k, int dim_v) {
  p.heads_k = heads_k;
  p.dim_v = dim_v;
  return p;
}

// The backward's scratch as the kernel's header lists it, written out: the documents' boundaries
// (N + 1 ints), U and Z (a value tensor of floats each), scalar gates' per-channel dg sums (a key
// tensor per value head) and, with grouped heads, dq and dk per value head (as many each).
std::size_t expected_backward_bytes(const Problem& p) {
  const std::size_t cu = p.packed() ? p.cu_seqlens.size() * sizeof(int) : 0;
  const std::size_t values = p.heads_total() * std::size_t(p.seq) * p.value_dim() * sizeof(float);
  const std::size_t keys = p.heads_total() * std::size_t(p.seq) * p.dim * sizeof(float);
  return cu + 2 * values + (p.decay == Decay::scalar ? keys : 0) + (p.group() > 1 ? 2 * keys : 0);
}

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) s += name + "=" + std::to_string(e) + " ";
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

// One call of the scan entry points on a dplr case of `p`, its buffers sized by the op's tensor
// specs; every output held to the float64 reference, the scratch to the closed forms.
void check_case(const Problem& p, Mode mode, cuda::Dtype dtype, const std::string& gate_norm) {
  Case kase = test::kernel_case(p, "scan", mode, "cuda", dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  if (gated(p.decay)) kase.options["gate_norm"] = gate_norm;
  INFO(test::describe(kase));
  const Problem settled = linear_problem(kase);
  REQUIRE(settled.dplr());
  REQUIRE(settled.qk_heads() == p.qk_heads());
  REQUIRE(settled.value_dim() == p.value_dim());
  REQUIRE(settled.cu_seqlens == p.cu_seqlens);
  const cuda::CudaVariant* row = cuda::cuda_variant("scan", settled);
  REQUIRE(row != nullptr);
  CHECK(row->name == "scan_dplr");

  const bool backward = kase.backward();
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
  REQUIRE(f("a") != nullptr);
  REQUIRE(f("b") != nullptr);
  cuda::DeviceForward fwd{at("q"), at("k"), at("v"), f("h0"), f("o"), f("hT"), f("g")};
  fwd.a = f("a"), fwd.b = f("b");
  cuda::DeviceBackward bwd{at("q"), at("k"), at("v"), f("h0"), at("dO"), f("dhT"), f("dq"), f("dk"),
                           f("dv"), f("dh0"), f("g"), f("dg")};
  bwd.a = f("a"), bwd.b = f("b"), bwd.da = f("da"), bwd.db = f("db");
  if (backward) {
    REQUIRE(bwd.da != nullptr);
    REQUIRE(bwd.db != nullptr);
  }

  CountingDeviceAllocator allocator;
  cuda::scan_forward(settled, dtype, fwd, allocator, nullptr);
  const std::size_t cu = settled.packed() ? settled.cu_seqlens.size() * sizeof(int) : 0;
  CHECK(allocator.peak() == cuda::scan_forward_workspace_bytes(settled));
  CHECK(cuda::scan_forward_workspace_bytes(settled) == cu);
  if (backward) {
    cuda::scan_backward(settled, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() == std::max(cu, cuda::scan_backward_workspace_bytes(settled)));
    CHECK(cuda::scan_backward_workspace_bytes(settled) == expected_backward_bytes(settled));
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  const CheckResult r = check_outputs(kase, out, kase.op->reference(kase, in, backward));
  INFO(errors(r));
  for (const char* name : {"o", "hT"}) CHECK(r.per_output.count(name) == 1);
  if (backward) {
    for (const char* name : {"dq", "dk", "dv", "dh0", "da", "db"}) CHECK(r.per_output.count(name) == 1);
    CHECK(r.per_output.count("dg") == (gated(p.decay) ? 1u : 0u));
  }
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
}

const Decay kDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};

}  // namespace

TEST_CASE("emulation: the dplr scan matches the float64 reference", "[emulation][scan_dplr]") {
  // (batch, heads, seq, dim): D = 1; D = 20 (idle lanes, two warps of rows); D = 40 (three warps,
  // two column slices, the second ragged); D = 72 (three column slices, five warps); ragged T;
  // two heads under retnet (two gammas), two sequences. Gated decays at gate_norm 16 and 1.
  const std::vector<Problem> shapes = {{1, 1, 9, 1, 4}, {1, 2, 23, 20, 4}, {2, 1, 17, 40, 4}, {1, 1, 11, 72, 4}};
  for (Decay decay : kDecays)
    for (Problem p : shapes)
      for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
        for (const std::string gate_norm : {"16", "1"}) {
          if (!gated(decay) && gate_norm == "1") continue;
          p.decay = decay;
          p.rule = Rule::dplr;
          check_case(p, Mode::fwd_bwd, dtype, gate_norm);
        }
}

TEST_CASE("emulation: the dplr scan takes grouped heads, rectangular states and packed documents",
          "[emulation][scan_dplr]") {
  // docs/spec.md section 1c: heads_k 1 and heads / 2 (dq and dk summed over a q/k head's value
  // heads); dim_v dim / 2 and 2 dim (the transposed passes' rows, Dv, other than Dk: another count
  // of warps and of column slices); packed documents of ragged lengths with one of length 1 (each
  // from its own h0 to its own hT), alone and with the other two. fwd and fwd_bwd.
  const std::vector<Problem> shapes = {
      packed(shaped({1, 4, 0, 16, 4}, 1, 40), {13, 1, 9}),  // all three: heads_k 1, dim_v > 32
      shaped({2, 4, 15, 20, 4}, 2, 10),                     // heads_k heads / 2, dim_v dim / 2
      packed(shaped({1, 2, 0, 8, 4}, 2, 8), {6, 1, 11}),    // packed only
  };
  for (Decay decay : kDecays)
    for (Problem p : shapes)
      for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          p.decay = decay;
          p.rule = Rule::dplr;
          check_case(p, mode, dtype, gated(decay) ? "1" : "16");
        }
}

TEST_CASE("emulation: each dplr scan kernel once", "[emulation][dplr_race]") {
  // The sanitizers' subset: every pass in both dtypes (vector gates), and the scalar gates' sum.
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    check_case({1, 2, 6, 20, 4, Decay::vector, Rule::dplr}, Mode::fwd_bwd, dtype, "16");
  check_case({1, 1, 5, 8, 4, Decay::scalar, Rule::dplr}, Mode::fwd_bwd, cuda::Dtype::f32, "16");
}

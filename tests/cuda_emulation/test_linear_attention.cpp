// The scan and chunked kernels (kernels/linear_attention/cuda/scan.cu; the chunked form of decay
// none and retnet, cuda/chunked_gated*.cu with fixed log-gates, through its host API), run in the
// emulation, against the float64 reference with the runner's inputs and tolerances (core/op.cpp,
// src/run/check.cpp): every output of fwd_bwd (o, hT, dq, dk, dv, dh0) on D = 1, D off multiples of
// 16 and 32, ragged last chunks, chunks of several row blocks, chunk > seq, both decays, float32
// and bf16 (inputs rounded to bf16 before the reference sees them, as the runner does), and the
// scratch the chunked form takes against its closed forms (test_chunked_gated.cpp has its tile
// choices and section 1c's shapes). And the scan on the shapes of docs/spec.md section 1c (grouped heads, dim_v != dim, packed
// documents), both rules, every decay, fwd and fwd_bwd, with its scratch against its closed forms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "src/run/check.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "cases.hpp"
#include "cuda_backend_checks.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "lattn_emu/control.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

enum class Kernel { scan, chunked };

std::string describe(const Problem& p, Kernel form, cuda::Dtype dtype, const std::string& gate_norm = "16") {
  return std::string(form == Kernel::scan ? "scan" : "chunked") + (dtype == cuda::Dtype::f32 ? " float32" : " bf16") +
         " B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" +
         std::to_string(p.dim) + " C" + std::to_string(p.chunk) + " " + to_string(p.decay) +
         (gated(p.decay) ? " gate_norm " + gate_norm : "");
}

// One fwd_bwd in the emulation, every output held to the reference; returns the check.
CheckResult run_case(const Problem& p, Kernel form, cuda::Dtype dtype, std::uint64_t seed = 7,
                     const std::string& gate_norm = "16") {
  Case kase = test::kernel_case(p, form == Kernel::scan ? "scan" : "chunked", Mode::fwd_bwd, "cuda",
                                dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  if (gated(p.decay)) kase.options["gate_norm"] = gate_norm;
  const TensorSet in = make_case_inputs(kase, seed);  // bf16 cases: the token tensors rounded
  const DeviceBuffer q = upload_tokens(in.at("q").data, dtype), k = upload_tokens(in.at("k").data, dtype),
                     v = upload_tokens(in.at("v").data, dtype), dO = upload_tokens(in.at("dO").data, dtype),
                     h0 = upload(in.at("h0").data), dhT = upload(in.at("dhT").data);
  const DeviceBuffer o = output(p.token_elems()), hT = output(p.state_elems()), dq = output(p.token_elems()),
                     dk = output(p.token_elems()), dv = output(p.token_elems()), dh0 = output(p.state_elems());
  // The gates (float32 whatever the dtype) and their gradient, for gated decays.
  const bool gates = gated(p.decay);
  const DeviceBuffer g = upload(gates ? in.at("g").data : std::vector<float>{0.0f});
  const DeviceBuffer dg = output(gates ? p.gate_elems() : 1);
  CountingDeviceAllocator allocator;
  const cuda::DeviceForward fwd{q.get(), k.get(), v.get(), h0.f(), o.f(), hT.f(), gates ? g.f() : nullptr};
  const cuda::DeviceBackward bwd{q.get(), k.get(), v.get(), h0.f(), dO.get(), dhT.f(), dq.f(), dk.f(), dv.f(), dh0.f(),
                                 gates ? g.f() : nullptr, gates ? dg.f() : nullptr};
  if (form == Kernel::scan) {
    cuda::scan_forward(p, dtype, fwd, allocator, nullptr);
    cuda::scan_backward(p, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() == std::max(cuda::scan_forward_workspace_bytes(p), cuda::scan_backward_workspace_bytes(p)));
  } else {
    cuda::chunked_gated_forward(p, dtype, fwd, allocator, nullptr);
    CHECK(allocator.peak() == cuda::chunked_gated_forward_workspace_bytes(p, dtype));
    CHECK(cuda::chunked_gated_forward_workspace_bytes(p, dtype) ==
          p.heads_total() * p.chunks() * p.dim * p.dim * (dtype == cuda::Dtype::f32 ? 4 : 2));
    cuda::chunked_gated_backward(p, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() == cuda::chunked_gated_backward_workspace_bytes(p, dtype, false));
    CHECK(cuda::chunked_gated_backward_workspace_bytes(p, dtype, false) ==
          2 * p.heads_total() * p.chunks() * p.dim * p.dim * (dtype == cuda::Dtype::f32 ? 4 : 2));
  }
  TensorSet out = make_case_outputs(kase);
  for (const auto& [name, buffer] : {std::pair{"o", &o}, {"hT", &hT}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dh0", &dh0}})
    out.at(name).data = buffer->floats();
  if (gates) out.at("dg").data = dg.floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, true));
}

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) s += name + "=" + std::to_string(e) + " ";
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

void expect_pass(const Problem& p, Kernel form, cuda::Dtype dtype) {
  INFO(describe(p, form, dtype));
  const CheckResult r = run_case(p, form, dtype);
  INFO(errors(r));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
}

// A scan case of `p` with the shape keys of docs/spec.md section 1c as the config writes them
// (heads_k, dim_v, lengths) and as settle_case leaves a packed case (batch 1, seq the documents' sum).
Case shaped_case(const Problem& p, Mode mode, cuda::Dtype dtype) {
  Case c = test::kernel_case(p, "scan", mode, "cuda", dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  c.options["heads_k"] = std::to_string(p.heads_k);
  c.options["dim_v"] = std::to_string(p.dim_v);
  std::string lengths;
  for (std::size_t n = 1; n < p.cu_seqlens.size(); ++n)
    lengths += (lengths.empty() ? "" : "+") + std::to_string(p.cu_seqlens[n] - p.cu_seqlens[n - 1]);
  if (!lengths.empty()) c.options["lengths"] = lengths;
  return c;
}

std::string describe_shape(const Case& c) {
  return std::string(to_string(c.mode)) + " " + c.dtype + " " + c.option("rule") + " " + c.decay + " B" +
         std::to_string(c.batch) + " H" + std::to_string(c.heads) + " heads_k " + c.option("heads_k") + " T" +
         std::to_string(c.seq) + " D" + std::to_string(c.dim) + " dim_v " + c.option("dim_v") +
         (c.options.count("lengths") ? " lengths " + c.option("lengths") : "");
}

// One call of the scan entry points (the variant table's row) on `kase`, its buffers sized by the
// op's tensor specs, every output held to the float64 reference; the scratch against the row's
// closed forms.
CheckResult run_scan(const Case& kase, std::uint64_t seed = 7) {
  const Problem p = linear_problem(kase);
  const cuda::Dtype dtype = kase.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32;
  const bool backward = kase.backward();
  const TensorSet in = make_case_inputs(kase, seed);  // bf16 cases: the token tensors rounded
  std::map<std::string, DeviceBuffer> device;
  for (const Tensor& t : in) {
    const bool token = t.name == "q" || t.name == "k" || t.name == "v" || t.name == "dO";
    device[t.name] = token ? upload_tokens(t.data, dtype) : upload(t.data);
  }
  TensorSet out = make_case_outputs(kase);
  for (const Tensor& t : out) device[t.name] = output(t.data.size());
  const auto at = [&](const char* name) -> void* { return device.count(name) ? device.at(name).get() : nullptr; };
  const auto f = [&](const char* name) { return static_cast<float*>(at(name)); };
  const cuda::DeviceForward fwd{at("q"), at("k"), at("v"), f("h0"), f("o"), f("hT"), f("g"), f("beta")};
  const cuda::DeviceBackward bwd{at("q"), at("k"), at("v"), f("h0"), at("dO"), f("dhT"), f("dq"), f("dk"),
                                 f("dv"), f("dh0"), f("g"), f("dg"), f("beta"), f("dbeta")};
  CountingDeviceAllocator allocator;
  cuda::scan_forward(p, dtype, fwd, allocator, nullptr);
  CHECK(allocator.peak() == cuda::scan_forward_workspace_bytes(p));
  if (backward) {
    cuda::scan_backward(p, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() == std::max(cuda::scan_forward_workspace_bytes(p), cuda::scan_backward_workspace_bytes(p)));
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, backward));
}

}  // namespace

TEST_CASE("emulation: scan and chunked match the float64 reference", "[emulation][linear]") {
  // (batch, heads, seq, dim, chunk, decay): D = 1; D = 20 and 33 (neither a multiple of 16 nor of
  // 32: padded tiles, idle lanes, element-wise staging); D = 72 (a second, narrower column slice:
  // chunked 64 + 16, scan 32 + 32 + 8); ragged last chunks (37 = 2 x 16 + 5, 45 = 32 + 13); chunk
  // > seq; chunk 1; chunks of two row blocks, the second ragged (100 = 64 + 36) and a last chunk of
  // 2 rows (130 = 128 + 2); two heads under retnet (two gammas).
  const std::vector<Problem> shapes = {
      {1, 1, 9, 1, 4, Decay::retnet},   {1, 2, 37, 20, 16, Decay::retnet}, {2, 1, 45, 33, 32, Decay::none},
      {1, 1, 20, 8, 64, Decay::none},   {1, 1, 50, 72, 48, Decay::retnet}, {1, 2, 7, 16, 1, Decay::retnet},
      {1, 1, 70, 32, 64, Decay::none},  {1, 1, 150, 24, 100, Decay::retnet}, {1, 1, 130, 40, 128, Decay::none}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const Problem& p : shapes)
      for (Kernel form : {Kernel::scan, Kernel::chunked}) expect_pass(p, form, dtype);
}

TEST_CASE("emulation: the gated scan matches the float64 reference", "[emulation][linear][gated]") {
  // Scalar and vector gates at gate_norm 16 and 1 (strong): D = 1; D = 20 and 33 (idle lanes, a
  // ragged last row group); D = 72 (a third, narrower column slice); T past several token stages
  // and not a multiple of them; two heads, one batch of two. dg included.
  const std::vector<Problem> shapes = {{1, 1, 9, 1, 4, Decay::scalar},   {1, 2, 37, 20, 16, Decay::vector},
                                       {2, 1, 45, 33, 32, Decay::scalar}, {1, 1, 50, 72, 48, Decay::vector},
                                       {1, 2, 7, 16, 1, Decay::vector},   {1, 1, 70, 32, 64, Decay::scalar}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const Problem& p : shapes)
      for (const std::string gate_norm : {"16", "1"}) {
        INFO(describe(p, Kernel::scan, dtype, gate_norm));
        const CheckResult r = run_case(p, Kernel::scan, dtype, 7, gate_norm);
        INFO(errors(r));
        CHECK(r.per_output.count("dg") == 1);
        CHECK(r.non_finite.empty());
        CHECK(r.passed);
      }
}

TEST_CASE("emulation: the scan takes grouped heads, rectangular states and packed documents",
          "[emulation][scan_shapes]") {
  // docs/spec.md section 1c, every rule x decay, float32 and bf16, fwd and fwd_bwd: heads_k 1, heads
  // / 2 and heads (each q/k head's dq and dk summed over its value heads, or none to sum); dim_v
  // dim / 2, dim and 2 dim (the state's rows in the transposed passes, Dv, differing from the
  // others', Dk; D = 20 and 40: idle lanes, a second column slice, more warps than the other
  // orientation); packed documents of ragged lengths with one of length 1 (each restarts from its
  // own h0 and ends in its own hT), with and without grouped heads and rectangular states.
  const auto packed = [](Problem p, const std::vector<int>& lengths) {
    p.cu_seqlens = {0};
    for (int length : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + length);
    p.batch = 1;
    p.seq = p.cu_seqlens.back();
    return p;
  };
  const auto shape = [](int batch, int heads, int seq, int dim, int heads_k, int dim_v) {
    Problem p{batch, heads, seq, dim, 64};
    p.heads_k = heads_k;
    p.dim_v = dim_v;
    return p;
  };
  const std::vector<Problem> shapes = {
      packed(shape(1, 4, 0, 16, 1, 32), {37, 1, 64, 90}),  // heads_k 1, dim_v 2 dim, packed
      shape(2, 4, 33, 20, 2, 10),                          // heads_k heads / 2, dim_v dim / 2
      packed(shape(1, 4, 0, 16, 4, 16), {5, 1, 26}),       // packed only
      packed(shape(1, 4, 0, 8, 2, 4), {13, 1, 6}),         // all three, dim_v dim / 2
      shape(1, 2, 19, 40, 1, 80),                          // heads_k 1, dim_v 2 dim, wide
  };
  for (const Problem& base : shapes)
    for (const std::string& rule : rule_names())
      for (const std::string& decay : decay_names())
        for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
          for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
            // No CUDA row takes the trapezoidal rule (test_backend.cpp checks the refusal); the dplr
            // rule's scan has these shapes in test_scan_dplr.cpp.
            if (rule == "trapezoidal" || rule == "dplr") continue;
            Problem p = base;
            p.rule = rule_from(rule);
            p.decay = decay_from(decay);
            const Case c = shaped_case(p, mode, dtype);
            INFO(describe_shape(c));
            const Problem settled = linear_problem(c);
            REQUIRE(settled.qk_heads() == p.qk_heads());
            REQUIRE(settled.value_dim() == p.value_dim());
            REQUIRE(settled.cu_seqlens == p.cu_seqlens);
            REQUIRE(!settled.square_dense());
            REQUIRE(cuda::cuda_variant("scan", settled) != nullptr);
            const CheckResult r = run_scan(c);
            INFO(errors(r));
            CHECK(r.per_output.count(mode == Mode::fwd ? "hT" : "dq") == 1);
            CHECK(r.non_finite.empty());
            CHECK(r.passed);
          }
}

TEST_CASE("emulation: the scan declines a dim or dim_v over its register tile with the reason",
          "[emulation][scan_shapes]") {
  for (const auto& [dim, dim_v] : {std::pair{cuda::kScanMaxDim + 1, 16}, std::pair{16, cuda::kScanMaxDim + 1}}) {
    Problem p{1, 2, 8, dim, 8};
    p.dim_v = dim_v;
    INFO("dim " << dim << " dim_v " << dim_v);
    std::string why;
    CHECK(cuda::cuda_variant("scan", p, &why) == nullptr);
    CHECK_THAT(why, Catch::Matchers::Contains("handles dim and dim_v <= " + std::to_string(cuda::kScanMaxDim)));
  }
  Problem widest{1, 2, 8, cuda::kScanMaxDim, 8};
  widest.dim_v = cuda::kScanMaxDim / 2;
  CHECK(cuda::cuda_variant("scan", widest) != nullptr);
}

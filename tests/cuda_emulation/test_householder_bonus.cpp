// DeltaProduct's CUDA rows (docs/spec.md section 1h: householder n > 1; the delta rule's scan and
// chunked WY form over the interleaved steps, kernels/linear_attention/cuda/householder.hpp) and
// RWKV-6's bonus form of the additive scan (section 1g, kernels/linear_attention/cuda/scan.cu), run
// in the emulation through their variant rows (cuda/variants.cpp) against the float64 reference with
// the runner's inputs and tolerances: fwd and fwd_bwd, every output and gradient (dbeta of every
// sub-step, dg, du), n 2 and 3, float32 and bf16, ragged T (T n off the chunk), strong gates
// (gate_norm 1), grouped heads, dim_v != dim and packed documents; the chunked rows' states kept
// and recomputed; the scratch against the rows' closed forms (and DeltaProduct's own part written
// out); and what the rows decline.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>

#include "backends/cuda/cuda_backend.hpp"
#include "cases.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "device_buffers.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/householder.hpp"
#include "kernels/linear_attention/op.hpp"
#include "lattn_emu/control.hpp"
#include "src/run/check.hpp"
#include "test_util.hpp"

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

cuda::Dtype dtype_of(const Case& c) { return c.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32; }

Case make_case(const Problem& p, const std::string& form, Mode mode, cuda::Dtype dtype, const std::string& gate_norm) {
  Case c = test::kernel_case(p, form, mode, "cuda", dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  if (gated(p.decay)) c.options["gate_norm"] = gate_norm;
  if (c.op->settle) c.op->settle(c);
  return c;
}

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) {
    char text[48];
    std::snprintf(text, sizeof text, "%s=%.2e ", name.c_str(), e);
    s += text;
  }
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

// One fwd or fwd_bwd of the row of `kase.impl`'s table that takes it, buffers sized by the op's
// tensor specs and bound as the backend binds them, every output held to the float64 reference;
// the allocator's peak against the row's closed forms (kept: the chunk states held across the two calls).
CheckResult run_row(const Case& kase, const std::string& row_name, bool keep) {
  const Problem p = linear_problem(kase);
  const cuda::Dtype dtype = dtype_of(kase);
  const bool backward = kase.backward();
  const cuda::CudaVariant& v = cuda::cuda_variant_for(kase.impl, p);
  CHECK(v.name == row_name);
  if (v.device_limits) REQUIRE_FALSE(v.device_limits(p, dtype, lattn_emu::shared_optin_limit()));
  keep = keep && backward && v.kept_states_bytes;
  const TensorSet in = make_case_inputs(kase, 7);  // bf16 cases: the token tensors rounded
  std::map<std::string, DeviceBuffer> device;
  for (const Tensor& t : in) {
    const bool token = t.name == "q" || t.name == "k" || t.name == "v" || t.name == "dO";
    device[t.name] = token ? upload_tokens(t.data, dtype) : upload(t.data);
  }
  TensorSet out = make_case_outputs(kase);
  for (const Tensor& t : out) device[t.name] = output(t.data.size());
  const LinearTensors tensors = bind_linear_tensors(
      kase, [&](const std::string& name) -> void* { return device.count(name) ? device.at(name).get() : nullptr; });
  CountingDeviceAllocator allocator;
  {
    const std::size_t kept_bytes = keep ? v.kept_states_bytes(p, dtype) : 0;
    Workspace<unsigned char> kept(allocator, kept_bytes);
    v.forward(p, dtype, cuda::device_forward_args(tensors), allocator, nullptr, kept.data());
    // A forward that keeps the states takes them from `kept` instead of its own scratch.
    CHECK(allocator.peak() == v.forward_workspace_bytes(p, dtype));
    if (backward) {
      v.backward(p, dtype, cuda::device_backward_args(tensors), allocator, nullptr, kept.data());
      const std::size_t expected =
          keep ? kept_bytes + v.backward_workspace_bytes(p, dtype, true)
               : std::max(v.forward_workspace_bytes(p, dtype), v.backward_workspace_bytes(p, dtype, false));
      CHECK(allocator.peak() == expected);
    }
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, backward));
}

// Every output and gradient the case has, checked and passing.
void expect_pass(const Case& c, const std::string& row_name, bool keep, const std::vector<std::string>& gradients) {
  INFO(test::describe(c) << (keep ? " (states kept)" : ""));
  const CheckResult r = run_row(c, row_name, keep);
  INFO(errors(r));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
  for (const char* name : {"o", "hT"}) CHECK(r.per_output.count(name) == 1);
  if (c.backward())
    for (const std::string& name : gradients) {
      INFO(name);
      CHECK(r.per_output.count(name) == 1);
    }
}

std::vector<std::string> delta_gradients(const Problem& p) {
  std::vector<std::string> names = {"dq", "dk", "dv", "dh0", "dbeta"};
  if (gated(p.decay)) names.push_back("dg");
  return names;
}

const char* delta_row(const std::string& form) { return form == "scan" ? "scan_delta+householder" : "chunked_delta+householder"; }

}  // namespace

TEST_CASE("emulation: DeltaProduct's CUDA rows match the float64 reference", "[emulation][householder_bonus]") {
  // T 13 at n 2 and 3: 26 and 39 steps, off the chunk of 16 (a token's writes across two chunks);
  // strong gates (gate_norm 1); the chunked row with its states kept and recomputed.
  for (const std::string form : {"scan", "chunked"})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (int n : {2, 3})
        for (Decay decay : {Decay::none, Decay::scalar, Decay::vector}) {
          Problem p{1, 2, 13, 8, 16, decay, Rule::delta};
          p.householder = n;
          const Case c = make_case(p, form, Mode::fwd_bwd, dtype, "1");
          REQUIRE(linear_problem(c).householder == n);
          expect_pass(c, delta_row(form), form == "chunked" && n == 2, delta_gradients(p));
        }
}

TEST_CASE("emulation: DeltaProduct's CUDA rows take grouped heads, Dk x Dv states and packed documents",
          "[emulation][householder_bonus]") {
  // Two q/k heads for four value heads, dim_v 12 != dim 8, documents of 9, 1 and 6 tokens (each from
  // its own h0); and B 2 dense with dim_v 2 dim; fwd alone (the forward's scratch) and fwd_bwd.
  const std::vector<Problem> shapes = {packed(shaped({1, 4, 0, 8, 16}, 2, 12), {9, 1, 6}),
                                       shaped({2, 2, 7, 4, 8}, 1, 8)};
  for (const std::string form : {"scan", "chunked"})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (Problem p : shapes)
        for (Decay decay : {Decay::scalar, Decay::vector})
          for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
            p.decay = decay;
            p.rule = Rule::delta;
            p.householder = decay == Decay::scalar ? 2 : 3;
            const Case c = make_case(p, form, mode, dtype, "1");
            const Problem settled = linear_problem(c);
            REQUIRE(settled.cu_seqlens == p.cu_seqlens);
            REQUIRE(settled.qk_heads() == p.qk_heads());
            REQUIRE(settled.value_dim() == p.value_dim());
            expect_pass(c, delta_row(form), false, delta_gradients(p));
          }
}

TEST_CASE("emulation: DeltaProduct's CUDA rows: their scratch and what they decline", "[emulation][householder_bonus]") {
  // The steps' q (token dtype), g and o of the forward; q and dO (token dtype), dq, g and dg of the
  // backward, beside the delta row's own scratch for the steps. B 1, H 2, T 10, D 8, n 2, scalar
  // gates: 20 steps, q 2 x 20 x 8 = 320 elements, g 40, o 320, dO 320.
  Problem p{1, 2, 10, 8, 16, Decay::scalar, Rule::delta};
  p.householder = 2;
  const Problem steps = householder_steps(p);
  REQUIRE(steps.seq == 20);
  for (const std::string form : {"scan", "chunked"}) {
    INFO(form);
    const cuda::CudaVariant& row = cuda::cuda_variant_for(form, p);
    const cuda::CudaVariant& inner = cuda::cuda_variant_for(form, steps);
    CHECK(row.name == delta_row(form));
    CHECK(inner.name == (form == "scan" ? "scan_delta" : "chunked_delta"));
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
      const std::size_t e = dtype == cuda::Dtype::f32 ? 4 : 2;
      CHECK(row.forward_workspace_bytes(p, dtype) == 320 * e + (40 + 320) * 4 + inner.forward_workspace_bytes(steps, dtype));
      for (bool kept : {false, true})
        CHECK(row.backward_workspace_bytes(p, dtype, kept) ==
              (320 + 320) * e + (320 + 2 * 40) * 4 + inner.backward_workspace_bytes(steps, dtype, kept));
      if (form == "chunked") CHECK(row.kept_states_bytes(p, dtype) == inner.kept_states_bytes(steps, dtype));
    }
    if (form == "scan") CHECK(row.kept_states_bytes == nullptr);
  }
  // What the delta rows decline for the steps, the DeltaProduct row declines with their reason: a
  // chunk past the WY solve's tile; a dim past the scan's registers.
  Problem long_chunk = p;
  long_chunk.chunk = cuda::kDeltaChunkLimit + 1;
  long_chunk.seq = 40;
  std::string why;
  CHECK(cuda::cuda_variant("chunked", long_chunk, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("chunked_delta+householder (no CUDA chunked variant takes rule delta"));
  CHECK_THAT(why, Catch::Matchers::Contains("take chunks of up to 64 rows"));
  Problem wide = p;
  wide.dim = cuda::kScanMaxDim + 1;
  CHECK(cuda::cuda_variant("scan", wide, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("handles dim and dim_v <= 256"));
  // One write per token stays the delta row's own.
  Problem one = p;
  one.householder = 1;
  CHECK(cuda::cuda_variant_for("scan", one).name == "scan_delta");
  CHECK(cuda::cuda_variant_for("chunked", one).name == "chunked_delta");
}

TEST_CASE("emulation: RWKV-6's bonus form of the CUDA scan matches the float64 reference",
          "[emulation][householder_bonus]") {
  // Ragged lengths, D 1 and D off multiples of 32 (20, 40: two column blocks), mild and strong gates,
  // B 2 (du summed over the batch), grouped heads, dim_v != dim (both ways) and packed documents
  // (du summed over the documents), fwd alone and fwd_bwd.
  const std::vector<Problem> shapes = {
      {1, 2, 37, 20, 16}, {2, 1, 9, 1, 4}, {2, 3, 20, 40, 64},
      packed(shaped({1, 4, 0, 16, 16}, 2, 40), {21, 1, 9}), shaped({2, 2, 11, 24, 16}, 1, 8)};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (Problem p : shapes)
      for (const std::string gate_norm : {"16", "1"})
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          p.decay = Decay::vector;
          p.bonus = true;
          const Case c = make_case(p, "scan", mode, dtype, gate_norm);
          REQUIRE(linear_problem(c).bonus);
          REQUIRE(linear_problem(c).cu_seqlens == p.cu_seqlens);
          expect_pass(c, "scan", false, {"dq", "dk", "dv", "dh0", "dg", "du"});
        }
}

TEST_CASE("emulation: RWKV-6's bonus form: the CUDA rows that decline it, and the scan's scratch",
          "[emulation][householder_bonus]") {
  Problem p{2, 2, 30, 16, 16, Decay::vector, Rule::additive};
  p.bonus = true;
  CHECK(cuda::cuda_variant_for("scan", p).name == "scan");
  // The backward's du per (sequence, value head), beside GLA's scratch: 2 x 2 x 16 floats.
  Problem gla = p;
  gla.bonus = false;
  CHECK(cuda::scan_additive_backward_workspace_bytes(p) == cuda::scan_additive_backward_workspace_bytes(gla) + 64 * 4);
  CHECK(cuda::scan_additive_forward_workspace_bytes(p) == cuda::scan_additive_forward_workspace_bytes(gla));
  // Gates other than vector ones: declined, saying so.
  std::string why;
  Problem scalar = p;
  scalar.decay = Decay::scalar;
  CHECK(cuda::cuda_variant("scan", scalar, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("the bonus form with vector gates only"));
  // The chunked table has no bonus form.
  CHECK(cuda::cuda_variant("chunked", p, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("chunked_gated (no bonus (RWKV-6) form)"));
}

TEST_CASE("emulation: the CUDA backend runs DeltaProduct and the bonus form through its rows",
          "[emulation][householder_bonus]") {
  // The impl rows of backends/cuda ask the tables: the variant they name, their checks against the
  // float64 reference (fwd_bwd, the chunked row's states kept and recomputed), and the chunked
  // row's decline of the bonus with the table's reason.
  const std::unique_ptr<Backend> keeping = cuda::make_cuda_backend(BackendOptions{0, 0, true});
  const std::unique_ptr<Backend> recomputing = cuda::make_cuda_backend(BackendOptions{0, 0, false});
  Problem product{1, 2, 11, 8, 16, Decay::vector, Rule::delta};
  product.householder = 2;
  Problem rwkv6{2, 2, 19, 8, 16, Decay::vector, Rule::additive};
  rwkv6.bonus = true;
  for (const std::string dtype : {"float32", "bf16"}) {
    for (const std::string form : {"scan", "chunked"})
      for (Backend* backend : {keeping.get(), recomputing.get()}) {
        const Case c = test::kernel_case(product, form, Mode::fwd_bwd, "cuda", dtype);
        INFO(test::describe(c));
        REQUIRE_FALSE(backend->unsupported(c));
        CHECK(backend->variant(c) == delta_row(form));
        const test::Outcome r = test::run_on(*backend, c, 5);
        INFO(errors(r.check));
        CHECK(r.check.passed);
        CHECK(r.check.per_output.count("dbeta") == 1);
        if (form == "chunked") CHECK(r.bwd_states == (backend == keeping.get() ? "kept" : "recomputed"));
      }
    const Case scan = test::kernel_case(rwkv6, "scan", Mode::fwd_bwd, "cuda", dtype);
    INFO(test::describe(scan));
    REQUIRE_FALSE(keeping->unsupported(scan));
    CHECK(keeping->variant(scan) == "scan");
    const test::Outcome r = test::run_on(*keeping, scan, 5);
    INFO(errors(r.check));
    CHECK(r.check.passed);
    CHECK(r.check.per_output.count("du") == 1);
    const Case chunked = test::kernel_case(rwkv6, "chunked", Mode::fwd_bwd, "cuda", dtype);
    REQUIRE(keeping->unsupported(chunked));
    CHECK_THAT(*keeping->unsupported(chunked), Catch::Matchers::Contains("chunked_gated (no bonus (RWKV-6) form)"));
  }
}

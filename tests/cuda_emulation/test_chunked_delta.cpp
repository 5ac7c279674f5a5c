// The delta rule's chunked CUDA kernels (kernels/linear_attention/cuda/chunked_delta*.cu), run in the
// emulation through their host API against the float64 reference with the runner's inputs and
// tolerances: every decay (DeltaNet, retnet's, Gated DeltaNet, KDA), float32 and bf16, fwd and
// fwd_bwd (o, hT, dq, dk, dv, dh0, dbeta and dg), the chunk states kept by the forward and
// recomputed by the backward; ragged last chunks, chunk > seq, chunk 1, D off multiples of 16,
// strong (gate_norm 1) and mild (16) gates, grouped heads, dim_v != dim, packed documents; the
// scratch against its closed forms; and the row's limits.
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "backends/cuda/cuda_backend.hpp"
#include "cases.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "cuda_backend_checks.hpp"
#include "device_buffers.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "lattn_emu/control.hpp"
#include "src/run/check.hpp"

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

// A delta-rule case of `p` (its rule set to delta) as the runner makes it.
Case delta_case(Problem p, Mode mode, cuda::Dtype dtype, const std::string& gate_norm) {
  p.rule = Rule::delta;
  Case c = test::kernel_case(p, "chunked", mode, "cuda", dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  if (gated(p.decay)) c.options["gate_norm"] = gate_norm;
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

// One fwd or fwd_bwd of the chunked delta row on `kase`, buffers sized by the op's tensor specs,
// every output held to the float64 reference; the scratch against the closed forms.
CheckResult run_delta(const Case& kase, bool keep, std::uint64_t seed = 7) {
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
  const cuda::DeviceBackward bwd{at("q"), at("k"), at("v"),  f("h0"), at("dO"), f("dhT"),  f("dq"),
                                 f("dk"), f("dv"), f("dh0"), f("g"),  f("dg"),  f("beta"), f("dbeta")};
  CountingDeviceAllocator allocator;
  {
    Workspace<unsigned char> kept(allocator, keep && backward ? cuda::chunked_delta_kept_bytes(p, dtype) : 0);
    cuda::chunked_delta_forward(p, dtype, fwd, allocator, nullptr, kept.data());
    if (keep && backward) {
      CHECK(allocator.peak() == cuda::chunked_delta_kept_bytes(p, dtype) +
                                    cuda::chunked_delta_forward_workspace_bytes(p, dtype) -
                                    cuda::chunked_delta_kept_bytes(p, dtype));
    } else {
      CHECK(allocator.peak() == cuda::chunked_delta_forward_workspace_bytes(p, dtype));
    }
    if (backward) {
      cuda::chunked_delta_backward(p, dtype, bwd, allocator, nullptr, kept.data());
      const std::size_t expected =
          keep ? cuda::chunked_delta_kept_bytes(p, dtype) + cuda::chunked_delta_backward_workspace_bytes(p, dtype, true)
               : std::max(cuda::chunked_delta_forward_workspace_bytes(p, dtype),
                          cuda::chunked_delta_backward_workspace_bytes(p, dtype, false));
      CHECK(allocator.peak() == expected);
    }
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, backward));
}

std::string describe(const Case& c, bool keep) {
  return test::describe(c) + (c.backward() ? (keep ? " (states kept)" : " (states recomputed)") : "");
}

void expect_pass(const Case& c, bool keep) {
  INFO(describe(c, keep));
  REQUIRE_FALSE(cuda::chunked_delta_unsupported(
      linear_problem(c), c.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32, lattn_emu::shared_optin_limit()));
  const CheckResult r = run_delta(c, keep);
  INFO(errors(r));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
  if (c.backward()) {
    CHECK(r.per_output.count("dbeta") == 1);
    if (gated(linear_problem(c).decay)) CHECK(r.per_output.count("dg") == 1);
  }
}

}  // namespace

TEST_CASE("emulation: the chunked delta rows take grouped heads, Dk x Dv states and packed documents",
          "[emulation][delta_chunked]") {
  // heads_k 1 and heads / 2 (a q/k head's rows read by each of its value heads), dim_v dim / 2 and
  // 2 dim (the state's columns in blocks of 32, a ragged last one), packed documents of ragged
  // lengths with one of length 1 (each from its own h0 to its own hT, its chunks from its first token).
  const std::vector<Problem> shapes = {
      packed(shaped({1, 4, 0, 16, 16}, 1, 40), {37, 1, 20, 9}),  // heads_k 1, dim_v 2.5 dim, packed
      shaped({2, 4, 33, 20, 8}, 2, 10),                          // heads_k heads / 2, dim_v dim / 2
      packed(shaped({1, 2, 0, 8, 64}, 2, 8), {70, 1, 6}),        // packed only: a chunk of 64 and a short one
  };
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (Problem p : shapes)
      for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
        p.decay = decay;
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          Case c = delta_case(p, mode, dtype, "1");
          c.options["heads_k"] = std::to_string(p.heads_k);
          c.options["dim_v"] = std::to_string(p.dim_v);
          std::string lengths;
          for (std::size_t n = 1; n < p.cu_seqlens.size(); ++n)
            lengths += (lengths.empty() ? "" : "+") + std::to_string(p.cu_seqlens[n] - p.cu_seqlens[n - 1]);
          c.options["lengths"] = lengths;
          if (c.op->settle) c.op->settle(c);
          const Problem settled = linear_problem(c);
          REQUIRE(settled.cu_seqlens == p.cu_seqlens);
          REQUIRE(settled.qk_heads() == p.qk_heads());
          REQUIRE(settled.value_dim() == p.value_dim());
          expect_pass(c, mode == Mode::fwd_bwd);
        }
      }
}

TEST_CASE("emulation: the chunked delta rows match the float64 reference", "[emulation][delta_chunked]") {
  // fwd_bwd (every output; the forward's own outputs o and hT too), the chunk states kept by the
  // forward and recomputed by the backward. (batch, heads, seq, dim, chunk): a ragged last chunk
  // (37 = 2 x 16 + 5), chunk > seq, chunk 1, D off multiples of 16 (20, 33), a chunk of 64 with a
  // ragged second one (100 = 64 + 36), D 72 (two slabs of the key dim in bf16, three in float32,
  // the last ragged; two blocks of value columns in the output kernel, two of key channels in
  // dq / dk), two heads (retnet's two gammas); gates of gate_norm 16 and 1.
  const std::vector<Problem> shapes = {
      {1, 2, 37, 20, 16}, {2, 1, 20, 8, 64}, {1, 2, 7, 16, 1}, {1, 1, 100, 33, 64}, {1, 1, 50, 72, 48}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (Problem p : shapes)
      for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector})
        for (const std::string gate_norm : {"16", "1"}) {
          if (!gated(decay) && gate_norm == "1") continue;
          p.decay = decay;
          for (bool keep : {true, false}) expect_pass(delta_case(p, Mode::fwd_bwd, dtype, gate_norm), keep);
        }
}

TEST_CASE("emulation: every chunked delta kernel once per gate kind and dtype, for the sanitizers",
          "[emulation][delta_chunked][delta_race]") {
  // What the sanitizer builds run of this group (the threads runner makes every barrier a wake-up
  // of every CUDA thread, and the full group takes minutes there): each kernel instance on a shape
  // that takes all of its paths at once: grouped heads (key parts and their sums), dim_v != dim,
  // packed documents with a ragged chunk and one of a single token, states recomputed (the forward
  // kernels twice).
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (Decay decay : {Decay::retnet, Decay::scalar, Decay::vector}) {
      Problem p = packed(shaped({1, 2, 0, 20, 16}, 1, 24), {21, 1, 9});
      p.decay = decay;
      Case c = delta_case(p, Mode::fwd_bwd, dtype, "1");
      c.options["heads_k"] = "1";
      c.options["dim_v"] = "24";
      c.options["lengths"] = "21+1+9";
      if (c.op->settle) c.op->settle(c);
      expect_pass(c, false);
    }
}

TEST_CASE("emulation: the chunked delta rows at wide key dims and very strong gates", "[emulation][delta_chunked]") {
  // Dk 160: the state pass's wide instance (4 x 2 state tiles per warp), three blocks of key
  // channels in dq / dk; and gate_norm 0.25 (log-gates of about -3 per token: a chunk of 64 sums to
  // about -200, past float32's exp range were any factor not an exp of a difference <= 0).
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
    for (Decay decay : {Decay::none, Decay::vector}) {
      Problem p{1, 1, 40, 160, 32};
      p.decay = decay;
      expect_pass(delta_case(p, Mode::fwd_bwd, dtype, "1"), true);
    }
    for (Decay decay : {Decay::scalar, Decay::vector}) {
      Problem p{1, 2, 130, 24, 64};
      p.decay = decay;
      expect_pass(delta_case(p, Mode::fwd_bwd, dtype, "0.25"), false);
    }
  }
}

TEST_CASE("emulation: the chunked delta row declines what its kernels cannot take, with the reason",
          "[emulation][delta_chunked]") {
  const std::size_t limit = lattn_emu::shared_optin_limit();
  Problem p{1, 2, 200, 16, 64, Decay::scalar, Rule::delta};
  CHECK_FALSE(cuda::chunked_delta_unsupported(p, cuda::Dtype::f32, limit));
  CHECK(cuda::cuda_variant("chunked", p)->name == "chunked_delta");
  // A chunk over the solve's tile; the same chunk over a shorter sequence is that sequence's length.
  p.chunk = cuda::kDeltaChunkLimit + 1;
  std::string why;
  CHECK(cuda::cuda_variant("chunked", p, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("take chunks of up to 64 rows"));
  p.seq = cuda::kDeltaChunkLimit;
  CHECK(cuda::cuda_variant("chunked", p) != nullptr);
  // A key dim over the state pass's channels per thread (a value dim of any size is taken).
  Problem wide{1, 1, 8, cuda::kDeltaMaxDim + 1, 8, Decay::none, Rule::delta};
  CHECK(cuda::cuda_variant("chunked", wide, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("dim (the key dim) up to 256"));
  wide.dim = 16;
  wide.dim_v = 2 * cuda::kDeltaMaxDim;
  CHECK(cuda::cuda_variant("chunked", wide) != nullptr);
  // bf16 at dims under 4, and only bf16.
  const Problem tiny{1, 1, 8, cuda::kDeltaMinBf16Dim - 1, 8, Decay::none, Rule::delta};
  REQUIRE(cuda::chunked_delta_unsupported(tiny, cuda::Dtype::bf16, limit));
  CHECK_THAT(*cuda::chunked_delta_unsupported(tiny, cuda::Dtype::bf16, limit),
             Catch::Matchers::Contains("take bf16 from dim 4"));
  CHECK_FALSE(cuda::chunked_delta_unsupported(tiny, cuda::Dtype::f32, limit));
  // The scratch's closed forms written out, for B 2, H 2, T 100, D 16, chunk 32, bf16, scalar gates:
  // 4 chunks per sequence, 16 state slots of 16 x 16 bf16 (8192 bytes), W and U 2 x 2 x 100 x 16
  // bf16 (12800 each, whole 256-byte blocks); the backward's state gradients, dV_new and dW in
  // float32 (6400 floats each) and dg's row sums (one block of 32 columns x 16 slots x 16 floats).
  const Problem dense{2, 2, 100, 16, 32, Decay::scalar, Rule::delta};
  CHECK(cuda::chunked_delta_kept_bytes(dense, cuda::Dtype::bf16) == 8192 + 12800 + 12800);
  CHECK(cuda::chunked_delta_forward_workspace_bytes(dense, cuda::Dtype::bf16) == 33792);
  CHECK(cuda::chunked_delta_backward_workspace_bytes(dense, cuda::Dtype::bf16, true) == 8192 + (6400 + 6400 + 256) * 4);
  CHECK(cuda::chunked_delta_backward_workspace_bytes(dense, cuda::Dtype::bf16, false) == 33792 + 60416);
  // The chunked table's check for the delta rule is the delta row's own (not the additive kernels' tiles).
  CHECK(cuda::cuda_variant_for("chunked", tiny).device_limits(tiny, cuda::Dtype::bf16, limit) ==
        cuda::chunked_delta_unsupported(tiny, cuda::Dtype::bf16, limit));
}

TEST_CASE("emulation: the chunked delta kernels' shapes and occupancy", "[emulation][delta_chunked]") {
  // Threads, shared memory and the launch bounds' blocks per multiprocessor at the headline shape;
  // the resident blocks here count threads and shared memory only (a GPU's count also registers).
  test::report_chunked_delta_kernels(
      lattn_emu::shared_optin_limit() == lattn_emu::kH100SharedOptin ? "emulated H100/H200" : "emulated A100");
}

TEST_CASE("emulation: the CUDA backend runs the chunked delta row on section 1c's shapes",
          "[emulation][delta_chunked]") {
  // Through the backend: its tensors sized by the op's specs and bound by the op's binder, the row
  // chosen by the variant table, and temp_mb the row's closed forms (the kept set beside the
  // backward's own scratch, or the larger of the forward's and the recomputing backward's).
  Problem p{2, 4, 30, 16, 16, Decay::scalar, Rule::delta};
  for (const bool keep : {true, false}) {
    auto backend = cuda::make_cuda_backend(BackendOptions{0, 0, keep});
    Case c = test::kernel_case(p, "chunked", Mode::fwd_bwd, "cuda", "bf16");
    c.options["heads_k"] = "2";
    c.options["dim_v"] = "24";
    c.options["lengths"] = "17+1+12";
    if (c.op->settle) c.op->settle(c);
    const Problem lp = linear_problem(c);
    INFO(test::describe(c) << (keep ? " kept" : " recomputed"));
    REQUIRE(lp.packed());
    REQUIRE_FALSE(backend->unsupported(c));
    CHECK(backend->variant(c) == "chunked_delta");
    const test::Outcome r = test::run_on(*backend, c, 5);
    INFO(test::errors(r.check));
    CHECK(r.check.passed);
    CHECK(r.bwd_states == (keep ? "kept" : "recomputed"));
    const cuda::Dtype bf16 = cuda::Dtype::bf16;
    CHECK(r.memory.temp_bytes == (keep ? cuda::chunked_delta_kept_bytes(lp, bf16) +
                                             cuda::chunked_delta_backward_workspace_bytes(lp, bf16, true)
                                       : std::max(cuda::chunked_delta_forward_workspace_bytes(lp, bf16),
                                                  cuda::chunked_delta_backward_workspace_bytes(lp, bf16, false))));
  }
}

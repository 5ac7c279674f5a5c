// The gated chunked kernels (kernels/linear_attention/cuda/chunked_gated*.cu, the CUDA chunked
// table's chunked_gated row, and its chunked row: decay none and retnet as fixed log-gates), run in
// the emulation, against the float64 reference with the runner's inputs and tolerances: every
// output of fwd_bwd (o, hT, dq, dk, dv, dh0, dg), none, retnet, and scalar and vector gates at
// gate_norm 16 and 1 (strong: a chunk's gates sum to -50 and less), float32 and
// bf16, the chunk states kept by the forward and recomputed by the backward, on ragged last
// chunks, chunks of several row blocks, chunk > seq, chunk 1, dims off multiples of 16, and the
// shapes of docs/spec.md section 1c (grouped heads, dim_v != dim, packed documents); the scratch
// against the row's closed forms; every tile choice under the run's device limit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "src/run/check.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "cases.hpp"
#include "cuda_backend_checks.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "lattn_emu/control.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

struct GatedCase {
  Problem p;
  std::string gate_norm = "16";
  cuda::Dtype dtype = cuda::Dtype::f32;
  bool keep = true;  // the chunk states kept by the forward, or recomputed by the backward
};

std::string describe(const GatedCase& g) {
  const Problem& p = g.p;
  std::string lengths;
  for (std::size_t n = 1; n < p.cu_seqlens.size(); ++n)
    lengths += (lengths.empty() ? " lengths " : "+") + std::to_string(p.cu_seqlens[n] - p.cu_seqlens[n - 1]);
  return std::string(g.dtype == cuda::Dtype::f32 ? "float32" : "bf16") + " " + to_string(p.decay) + " gate_norm " +
         g.gate_norm + " B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " heads_k " +
         std::to_string(p.qk_heads()) + " T" + std::to_string(p.seq) + " D" + std::to_string(p.dim) + " dim_v " +
         std::to_string(p.value_dim()) + " C" + std::to_string(p.chunk) + lengths +
         (g.keep ? " (states kept)" : " (states recomputed)");
}

// The case as the config writes it (heads_k, dim_v, lengths), settled as a run settles it.
Case gated_kase(const GatedCase& g) {
  Case c = test::kernel_case(g.p, "chunked", Mode::fwd_bwd, "cuda", g.dtype == cuda::Dtype::f32 ? "float32" : "bf16");
  if (gated(g.p.decay)) c.options["gate_norm"] = g.gate_norm;
  c.options["heads_k"] = std::to_string(g.p.qk_heads());
  c.options["dim_v"] = std::to_string(g.p.value_dim());
  std::string lengths;
  for (std::size_t n = 1; n < g.p.cu_seqlens.size(); ++n)
    lengths += (lengths.empty() ? "" : "+") + std::to_string(g.p.cu_seqlens[n] - g.p.cu_seqlens[n - 1]);
  if (!lengths.empty()) c.options["lengths"] = lengths;
  if (c.op->settle) c.op->settle(c);
  return c;
}

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) s += name + "=" + std::to_string(e) + " ";
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

// One fwd_bwd through the chunked table's row, every output held to the float64 reference, the
// scratch to the row's closed forms.
CheckResult run_gated(const GatedCase& g, std::uint64_t seed = 7) {
  const Case kase = gated_kase(g);
  const Problem p = linear_problem(kase);
  REQUIRE(p.qk_heads() == g.p.qk_heads());
  REQUIRE(p.value_dim() == g.p.value_dim());
  REQUIRE(p.cu_seqlens == g.p.cu_seqlens);
  const cuda::CudaVariant& v = cuda::cuda_variant_for("chunked", p);
  const bool fixed = !gated(p.decay);  // none, retnet: fixed log-gates, no g and no dg
  REQUIRE(v.name == (fixed ? "chunked" : "chunked_gated"));
  const TensorSet in = make_case_inputs(kase, seed);  // bf16 cases: the token tensors rounded
  std::map<std::string, DeviceBuffer> device;
  for (const Tensor& t : in) {
    const bool token = t.name == "q" || t.name == "k" || t.name == "v" || t.name == "dO";
    device[t.name] = token ? upload_tokens(t.data, g.dtype) : upload(t.data);
  }
  TensorSet out = make_case_outputs(kase);
  for (const Tensor& t : out) device[t.name] = output(t.data.size());
  const auto at = [&](const char* name) -> void* { return device.count(name) ? device.at(name).get() : nullptr; };
  const auto f = [&](const char* name) { return static_cast<float*>(at(name)); };
  const cuda::DeviceForward fwd{at("q"), at("k"), at("v"), f("h0"), f("o"), f("hT"), f("g")};
  const cuda::DeviceBackward bwd{at("q"), at("k"), at("v"), f("h0"), at("dO"), f("dhT"), f("dq"), f("dk"),
                                 f("dv"), f("dh0"), f("g"), f("dg")};
  // The scratch, written out: a packed problem's tables (the documents' boundaries and first
  // chunks), one set of chunk states (chunks x H x Dk x Dv in the token dtype), and in the backward
  // the states' gradients, dg's row sums (chunks x H x ceil(Dv / 32) x Dk floats) and with grouped
  // heads dq and dk per value head. Fixed gates take no row sums.
  const int C = std::min(p.chunk, p.seq);
  std::size_t chunks = 0;
  for (int n = 0; n < p.sequences(); ++n) chunks += std::size_t((p.slice(std::size_t(n) * p.heads).seq + C - 1) / C);
  const std::size_t es = g.dtype == cuda::Dtype::f32 ? 4 : 2, Dk = p.dim, Dv = p.value_dim();
  const std::size_t tables = p.packed() ? 2 * p.cu_seqlens.size() * 4 : 0;
  const std::size_t states = chunks * p.heads * Dk * Dv * es,
                    rowsums = fixed ? 0 : chunks * p.heads * ((Dv + 31) / 32) * Dk * 4;
  const std::size_t parts = p.group() > 1 ? 2 * p.heads_total() * p.seq * Dk * 4 : 0;
  CHECK(v.kept_states_bytes(p, g.dtype) == states);
  CHECK(v.forward_workspace_bytes(p, g.dtype) == tables + states);
  CHECK(v.backward_workspace_bytes(p, g.dtype, true) == tables + states + rowsums + parts);
  CHECK(v.backward_workspace_bytes(p, g.dtype, false) == tables + 2 * states + rowsums + parts);
  CountingDeviceAllocator allocator;
  {
    Workspace<unsigned char> kept(allocator, g.keep ? states : 0);
    v.forward(p, g.dtype, fwd, allocator, nullptr, kept.data());
    CHECK(allocator.peak() == tables + states);
    v.backward(p, g.dtype, bwd, allocator, nullptr, kept.data());
    CHECK(allocator.peak() == tables + 2 * states + rowsums + parts);
  }
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) out.at(name).data = device.at(name).floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, true));
}

void expect_pass(const GatedCase& g) {
  INFO(describe(g));
  const CheckResult r = run_gated(g);
  INFO(errors(r));
  CHECK(r.per_output.count("dg") == (gated(g.p.decay) ? 1u : 0u));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
}

Problem shaped(int batch, int heads, int seq, int dim, int chunk, Decay decay, int heads_k = 0, int dim_v = 0) {
  Problem p{batch, heads, seq, dim, chunk, decay};
  p.heads_k = heads_k;
  p.dim_v = dim_v;
  return p;
}

Problem packed(Problem p, const std::vector<int>& lengths) {
  p.cu_seqlens = {0};
  for (int length : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + length);
  p.batch = 1;
  p.seq = p.cu_seqlens.back();
  return p;
}

}  // namespace

TEST_CASE("emulation: the gated chunked kernels match the float64 reference", "[emulation][chunked_gated]") {
  // (batch, heads, seq, dim, chunk): ragged last chunks (37 = 2 x 16 + 5; 45), a chunk of two row
  // blocks, the second ragged (100 = 64 + 36), a last chunk of 2 rows (130 = 128 + 2), a chunk of
  // four row blocks (200 = 3 x 64 + 8: blocks walked past others), chunk > seq, chunk 1, D 1, 20,
  // 33 (off multiples of 16), 72 (two key-channel tiles, a second value tile).
  const std::vector<Problem> shapes = {shaped(1, 2, 37, 20, 16, Decay::none), shaped(2, 1, 45, 33, 32, Decay::none),
                                       shaped(1, 1, 20, 8, 64, Decay::none),  shaped(1, 1, 150, 24, 100, Decay::none),
                                       shaped(1, 1, 130, 40, 128, Decay::none), shaped(1, 2, 7, 16, 1, Decay::none),
                                       shaped(1, 1, 9, 1, 4, Decay::none),    shaped(1, 1, 50, 72, 48, Decay::none),
                                       shaped(1, 1, 230, 16, 200, Decay::none)};
  for (Decay decay : {Decay::scalar, Decay::vector})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (const Problem& base : shapes)
        for (const std::string gate_norm : {"16", "1"}) {
          Problem p = base;
          p.decay = decay;
          expect_pass({p, gate_norm, dtype, gate_norm == "16"});
        }
}

// The shapes of the two tests above with decay none and retnet (the chunked row: fixed log-gates,
// two heads' gammas where H is 2), states kept and recomputed. Not in the sanitizer builds' groups:
// `linear` runs the same kernel instances (test_linear_attention.cpp's chunked cases).
TEST_CASE("emulation: the chunked row (decay none, retnet) on the gated kernels matches the float64 reference",
          "[emulation][chunked_fixed]") {
  const std::vector<Problem> shapes = {shaped(1, 2, 37, 20, 16, Decay::none), shaped(2, 1, 45, 33, 32, Decay::none),
                                       shaped(1, 1, 20, 8, 64, Decay::none),  shaped(1, 1, 150, 24, 100, Decay::none),
                                       shaped(1, 1, 130, 40, 128, Decay::none), shaped(1, 2, 7, 16, 1, Decay::none),
                                       shaped(1, 1, 9, 1, 4, Decay::none),    shaped(1, 1, 50, 72, 48, Decay::none),
                                       shaped(1, 1, 230, 16, 200, Decay::none),
                                       packed(shaped(1, 4, 0, 16, 32, Decay::none, 1, 32), {37, 1, 70, 20}),
                                       shaped(2, 4, 33, 20, 16, Decay::none, 2, 10),
                                       packed(shaped(1, 2, 0, 24, 16, Decay::none, 2, 24), {5, 1, 40}),
                                       shaped(1, 2, 40, 40, 64, Decay::none, 1, 80)};
  for (Decay decay : {Decay::none, Decay::retnet})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (const Problem& base : shapes)
        for (bool keep : {true, false}) {
          Problem p = base;
          p.decay = decay;
          expect_pass({p, "16", dtype, keep});
        }
}

TEST_CASE("emulation: the gated chunked kernels take grouped heads, rectangular states and packed documents",
          "[emulation][chunked_gated]") {
  // heads_k 1 and heads / 2 (dq and dk summed over a group's value heads), dim_v dim / 2 and 2 dim
  // (the value tiles and the state's Dk x Dv), packed documents of ragged lengths with one of
  // length 1 and one over two chunks (each restarts from its own h0 and ends in its own hT).
  const std::vector<Problem> shapes = {
      packed(shaped(1, 4, 0, 16, 32, Decay::none, 1, 32), {37, 1, 70, 20}),
      shaped(2, 4, 33, 20, 16, Decay::none, 2, 10),
      packed(shaped(1, 2, 0, 24, 16, Decay::none, 2, 24), {5, 1, 40}),
      shaped(1, 2, 40, 40, 64, Decay::none, 1, 80),
  };
  for (Decay decay : {Decay::scalar, Decay::vector})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (const Problem& base : shapes) {
        Problem p = base;
        p.decay = decay;
        expect_pass({p, "1", dtype, dtype == cuda::Dtype::f32});
      }
}

TEST_CASE("emulation: the state pass split over 64 x 32 slices of the state, every gate mode",
          "[emulation][chunked_gated]") {
  // The state pass's blocks each walk one 64-row x 32-column slice of a head's Dk x Dv state (and of
  // dS in reverse, with dg's row sums per 32-column slice). These shapes make several slices both
  // ways with ragged last ones: Dk 72 (64 + 8 rows) x Dv 100 (32 + 32 + 32 + 4 columns), Dk 130
  // (64 + 64 + 2) x Dv 40 (32 + 8), Dk 24 x Dv 66 (32 + 32 + 2) with grouped heads; chunks of
  // several staged steps (100 rows: steps of 64 and 36 in bf16 with scalar or fixed gates, 32 + 32
  // + 32 + 4 otherwise) and ragged last chunks; vector and scalar gates at gate_norm 1 (strong: a
  // chunk's log-gates sum to -50 and less) and 16, none and retnet; float32 and bf16; states kept
  // and recomputed.
  const std::vector<Problem> shapes = {shaped(1, 2, 150, 72, 100, Decay::none, 1, 100),
                                       shaped(1, 1, 90, 130, 64, Decay::none, 1, 40),
                                       shaped(2, 2, 70, 24, 48, Decay::none, 1, 66)};
  for (Decay decay : {Decay::vector, Decay::scalar, Decay::none, Decay::retnet})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (const Problem& base : shapes) {
        Problem p = base;
        p.decay = decay;
        for (const std::string gate_norm : {"1", "16"}) {
          if (!gated(decay) && gate_norm == "16") continue;
          expect_pass({p, gate_norm, dtype, gate_norm == "1"});
        }
        if (!gated(decay)) expect_pass({p, "1", dtype, false});
      }
}

TEST_CASE("emulation: the dV/dK kernel's edges: ragged column tiles, grouped heads, strong gates, several chunks",
          "[emulation][chunked_gated]") {
  // The dV/dK kernel's blocks own 64 columns of dV and 64 channels of dK each: Dk 72 x Dv 20 (a
  // block past Dv computes dK alone, its second tile 8 channels), Dk 20 x Dv 130 (blocks past Dk
  // compute dV alone, a last tile of 2 columns), with grouped heads (dK summed over a group's value
  // heads); chunks of several row blocks with ragged last chunks (several walked query blocks);
  // vector gates at gate_norm 1 (strong: the pieces of the own rows' gates and the channel
  // factors), scalar gates and none; float32 and bf16.
  const std::vector<Problem> shapes = {shaped(1, 4, 150, 72, 64, Decay::none, 2, 20),
                                       shaped(2, 2, 90, 20, 48, Decay::none, 1, 130),
                                       shaped(1, 2, 200, 40, 100, Decay::none, 2, 72)};
  for (Decay decay : {Decay::vector, Decay::scalar, Decay::none})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
      for (const Problem& base : shapes) {
        Problem p = base;
        p.decay = decay;
        expect_pass({p, "1", dtype, true});
      }
}

TEST_CASE("emulation: every gated chunked kernel once per gate and dtype, for the sanitizers",
          "[emulation][chunked_gated][gated_race]") {
  // What the sanitizer builds run of this group (every emulated barrier wakes every CUDA thread, and
  // the full group takes minutes there): each kernel instance on one shape that takes all of its
  // paths: grouped heads (dq and dk per value head, then their sums), dim_v != dim, packed documents
  // with a single-token one, a chunk of several row blocks (80 = 64 + 16 in bf16, 32 + 32 + 16 in
  // float32: blocks walked past others) and a ragged last chunk, states recomputed.
  for (Decay decay : {Decay::scalar, Decay::vector})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
      Problem p = packed(shaped(1, 4, 0, 16, 80, decay, 2, 24), {90, 1, 20});
      expect_pass({p, "1", dtype, false});
    }
}

TEST_CASE("emulation: the gated chunked launch code's every tile choice, under this run's device limit",
          "[emulation][tiles]") {
  // Each chunk-parallel kernel takes RB 64 with two blocks per multiprocessor, else RB 32 with two,
  // else RB 32 alone (chunks of at most 32 rows: RB 32). Under either limit (H100's 227 KiB,
  // A100's 163) these shapes make all three: bf16 at D 24 (64 rows, two blocks), float32 vector
  // gates at D 128 and 256 (32 rows, two blocks or one), a chunk of 20 rows (32 rows).
  const std::size_t limit = lattn_emu::shared_optin_limit();
  const std::vector<GatedCase> cases = {{shaped(1, 1, 70, 24, 64, Decay::scalar), "16", cuda::Dtype::bf16},
                                        {shaped(1, 1, 70, 24, 64, Decay::retnet), "16", cuda::Dtype::bf16},
                                        {shaped(1, 1, 40, 192, 64, Decay::none), "16", cuda::Dtype::f32},
                                        {shaped(1, 1, 40, 128, 64, Decay::vector), "16", cuda::Dtype::f32},
                                        {shaped(1, 1, 40, 256, 64, Decay::vector), "16", cuda::Dtype::f32},
                                        {shaped(1, 1, 40, 16, 20, Decay::vector), "16", cuda::Dtype::bf16}};
  std::set<std::pair<int, int>> choices;  // (rows per block, blocks per multiprocessor)
  for (const GatedCase& g : cases) {
    INFO(describe(g));
    REQUIRE(!cuda::chunked_gated_unsupported(g.p, g.dtype, limit));
    lattn_emu::clear_launch_log();
    expect_pass(g);
    // Forward: states, output; backward: dV and dK (one launch), then dQ among the chunk-parallel
    // launches.
    std::vector<std::string> kernels;
    for (const auto& launch : lattn_emu::launch_log()) {
      const std::string name = launch.kernel == "gated_output_kernel" ? "output"
                               : launch.kernel == "gated_dkv_kernel"  ? "dkv"
                               : launch.kernel == "gated_dq_kernel"   ? "dq"
                                                                      : "";
      if (name.empty()) continue;
      kernels.push_back(name);
      const cuda::GatedTiles tiles = cuda::gated_tiles(name, g.p, g.dtype, limit);
      INFO(name << " with " << launch.shared << " bytes");
      CHECK(launch.shared == cuda::gated_shared_bytes(name, g.p, g.dtype, tiles.rows_per_block));
      const int blocks = 2 * (launch.shared + 1024) <= limit + 1024 ? 2 : 1;  // what fits, as launched
      CHECK(blocks == tiles.blocks_per_sm);
      CHECK(launch.block.x == 256);
      choices.insert({tiles.rows_per_block, blocks});
    }
    CHECK(kernels == std::vector<std::string>{"output", "dkv", "dq"});
  }
  INFO("device limit " << limit);
  CHECK(choices == std::set<std::pair<int, int>>{{32, 1}, {32, 2}, {64, 2}});
}

TEST_CASE("emulation: the gated chunked kernels' shapes and occupancy", "[emulation][tiles]") {
  // The launch figures from the launch code, the resident blocks from the emulation's occupancy
  // query (threads and shared memory only; a GPU's count also registers).
  test::report_gated_chunked_kernels(lattn_emu::shared_optin_limit() == lattn_emu::kH100SharedOptin
                                         ? "emulated H100/H200"
                                         : "emulated A100");
}

TEST_CASE("emulation: the gated chunked row declines a dim whose tiles do not fit, with the reason",
          "[emulation][tiles]") {
  // Dims up to 256 fit under either limit (the scan's limit too); dim 1024 with vector gates in
  // float32 fits under neither. The backend's skip carries the row's reason as it is.
  const std::size_t limit = lattn_emu::shared_optin_limit();
  for (Decay decay : {Decay::scalar, Decay::vector})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
      const Problem fits = shaped(1, 1, 40, 256, 64, decay);
      INFO(to_string(decay) << (dtype == cuda::Dtype::f32 ? " float32" : " bf16"));
      CHECK_FALSE(cuda::chunked_gated_unsupported(fits, dtype, limit));
    }
  const Problem wide = shaped(1, 1, 40, 1024, 64, Decay::vector);
  REQUIRE(cuda::cuda_variant("chunked", wide) != nullptr);
  const std::optional<std::string> why = cuda::chunked_gated_unsupported(wide, cuda::Dtype::f32, limit);
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Matchers::Contains("the CUDA chunked_gated output kernel's tiles for dim 1024, dim_v 1024 need") &&
                       Catch::Matchers::Contains("bytes of shared memory per block; this device has " + std::to_string(limit)));
  auto backend = cuda::make_cuda_backend(BackendOptions{});
  Case c = test::kernel_case(wide, "chunked", Mode::fwd, "cuda", "float32");
  c.options["gate_norm"] = "16";
  const std::optional<std::string> skip = backend->unsupported(c);
  REQUIRE(skip);
  CHECK(*skip == *why);
}

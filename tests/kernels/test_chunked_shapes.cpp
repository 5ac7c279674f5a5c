// The additive rule's chunked kernels (chunked_tiled, chunked_gated) on the shapes of docs/spec.md
// section 1c, taken natively (no gather adapter): grouped q/k heads, a Dk x Dv state, packed
// documents whose lengths straddle chunk multiples. Each against the float64 reference with the
// chunk states kept by the forward and recomputed by the backward, over thread counts that take
// each threading path (items per thread, chunks split over threads, a group's value heads split
// into parts with partial dq/dk), and each one's scratch against its closed form.
#include <omp.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

struct Shape {
  int batch, heads, heads_k, seq, dim, dim_v, chunk;
  std::vector<int> lengths;  // packed documents; empty: dense
};

// The canonical form the case option holds ("37+1+64+90").
std::string lengths_text(const std::vector<int>& lengths) {
  std::string text;
  for (int length : lengths) text += (text.empty() ? "" : "+") + std::to_string(length);
  return text;
}

Case shape_case(const Shape& s, Decay decay) {
  Problem p{s.batch, s.heads, s.seq, s.dim, s.chunk, decay, Rule::additive};
  if (!s.lengths.empty()) {
    p.batch = 1;
    p.seq = std::accumulate(s.lengths.begin(), s.lengths.end(), 0);
  }
  Case c = test::kernel_case(p, "chunked", Mode::fwd_bwd);
  c.options["heads_k"] = std::to_string(s.heads_k);
  c.options["dim_v"] = std::to_string(s.dim_v);
  if (!s.lengths.empty()) c.options["lengths"] = lengths_text(s.lengths);
  return c;
}

// The section 1c shapes: grouped heads (heads_k 1, 2, 4 of 4), dim_v 16, 32, 64 with dim 32, and
// packed documents "37 1 64 90" at chunk 16 and 64 (with grouped heads and dim_v != dim).
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int hk : {1, 2, 4}) out.push_back({2, 4, hk, 75, 32, 32, 32, {}});
  for (int dv : {16, 32, 64}) out.push_back({1, 4, 2, 70, 32, dv, 16, {}});
  for (int chunk : {16, 64}) {
    out.push_back({1, 4, 4, 0, 32, 32, chunk, {37, 1, 64, 90}});
    out.push_back({1, 4, 2, 0, 32, 16, chunk, {37, 1, 64, 90}});
    out.push_back({1, 2, 1, 0, 32, 64, chunk, {37, 1, 64, 90}});
  }
  return out;
}

std::vector<Decay> decays_of_this_machine() {
  std::vector<Decay> out = {Decay::scalar, Decay::vector};  // chunked_gated runs at every vector width
  if (cpu::chunked_uses_tiles()) out.insert(out.begin(), {Decay::none, Decay::retnet});
  return out;
}

// Whether the active vector width runs this decay natively (chunked_tiled needs the AVX-512 tiles).
bool native_here(Decay decay) {
  const std::vector<Decay> here = decays_of_this_machine();
  return std::find(here.begin(), here.end(), decay) != here.end();
}

struct Args {
  ForwardArgs<float> fwd;
  BackwardArgs<float> bwd;
};

Args bind(const Case& c, TensorSet& in, TensorSet& out) {
  const LinearTensors t = bind_linear_tensors(c, [&](const std::string& name) -> void* {
    if (TensorSet* set = in.find(name) ? &in : out.find(name) ? &out : nullptr) return set->data(name);
    return nullptr;
  });
  const auto f = [](void* x) { return static_cast<float*>(x); };
  return {{f(t.q), f(t.k), f(t.v), t.h0, t.o, t.hT, t.g},
          {f(t.q), f(t.k), f(t.v), t.h0, f(t.dO), t.dhT, t.dq, t.dk, t.dv, t.dh0, t.g, t.dg}};
}

std::size_t peak_of(const std::function<void(Allocator&)>& call) {
  CountingAllocator allocator;
  call(allocator);
  CHECK(allocator.live_bytes() == 0);
  return allocator.peak_bytes();
}

}  // namespace

TEST_CASE("chunked_tiled and chunked_gated take grouped, rectangular and packed problems natively",
          "[chunked][shapes]") {
  // 1 thread: whole items, a group's value heads on one thread. 3 and 5: groups split into parts
  // with partial dq/dk where (sequence, q/k head) pairs are fewer than threads (batch 2 of one q/k
  // head; 4 documents of one); 5: dense problems of fewer items than threads split over chunks
  // (chunked_tiled), a group's value heads one after another adding to dq and dk.
  // Every vector width: chunked_gated runs the tile products' portable form where the AVX-512 tiles
  // are not active (chunked_tiled is not chosen there).
  // Each shape and decay at every width and thread count in turn: its inputs and reference are
  // made once.
  for (const Shape& s : shapes())
    for (const Decay decay : decays_of_this_machine()) {
      const Case c = shape_case(s, decay);
      const Problem p = linear_problem(c);
      REQUIRE(p.sequences() == (s.lengths.empty() ? s.batch : int(s.lengths.size())));
      const TensorSet in = make_case_inputs(c, 7);
      const Reference reference = c.op->reference(c, in, true);
      for (const cpu::Vec vec : cpu::available_vecs())
        for (int threads : {1, 3, 5}) {
          const test::VecOverride width(vec);
          if (!native_here(decay)) continue;
          omp_set_num_threads(threads);
          INFO(cpu::to_string(vec) << " threads " << threads << " " << test::describe(p) << " heads_k " << s.heads_k
                                   << " dim_v " << s.dim_v << " lengths " << lengths_text(s.lengths));
          const cpu::CpuVariant variant = cpu::cpu_variant_for("chunked", p);
          CHECK(variant.name == (gated(decay) ? "chunked_gated" : "chunked_tiled"));
          REQUIRE(variant.takes.shapes);
          const cpu::GradParts parts(p, threads);
          if (threads == 3 && s.heads_k == 1 && s.lengths.empty()) CHECK(parts.parts > 1);

          std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / sizeof(float));
          REQUIRE(!kept.empty());
          TensorSet inputs = in;
          for (const bool keeps : {true, false}) {
            TensorSet out = make_case_outputs(c);
            const Args a = bind(c, inputs, out);
            float* keep = keeps ? kept.data() : nullptr;
            const std::size_t fwd_peak = peak_of([&](Allocator& m) { cpu::chunked_forward(p, a.fwd, m, keep); });
            const std::size_t bwd_peak = peak_of([&](Allocator& m) { cpu::chunked_backward(p, a.bwd, m, keep); });
            CHECK(fwd_peak == cpu::chunked_forward_workspace_bytes(p, keeps));
            CHECK(bwd_peak == cpu::chunked_backward_workspace_bytes(p, keeps));
            const CheckResult check = check_outputs(c, out, reference);
            INFO((keeps ? "kept" : "recomputed") << " worst " << check.worst_output << " " << test::errors(check));
            CHECK(check.passed);
            CHECK(check.rel_err < 1e-4);
          }
        }
    }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("a packed batch's documents are independent of their neighbours", "[chunked][shapes]") {
  // Each document of a packed run equals the same document run alone: nothing leaks across a
  // boundary that falls inside what would have been one chunk.
  omp_set_num_threads(2);
  const std::vector<int> lengths = {37, 1, 64, 90};
  for (const Decay decay : decays_of_this_machine()) {
    const Shape packed{1, 2, 1, 0, 32, 16, 16, lengths};
    const Case c = shape_case(packed, decay);
    const Problem p = linear_problem(c);
    TensorSet in = make_case_inputs(c, 11);
    TensorSet out = make_case_outputs(c);
    const Args a = bind(c, in, out);
    CountingAllocator allocator;
    cpu::chunked_forward(p, a.fwd, allocator, nullptr);
    int start = 0;
    for (std::size_t n = 0; n < lengths.size(); ++n) {
      INFO(to_string(decay) << " document " << n);
      Shape alone = packed;
      alone.lengths = {lengths[n]};
      const Case ca = shape_case(alone, decay);
      const Problem pa = linear_problem(ca);
      TensorSet ina = make_case_inputs(ca, 1), outa = make_case_outputs(ca);
      // The document's rows of every input, per head, from the packed batch.
      for (const Tensor& t : ina) {
        Tensor& dst = ina.at(t.name);
        const Tensor& src = in.at(t.name);
        if (t.name == "h0" || t.name == "dhT") {
          const std::size_t per = dst.data.size();
          std::copy(src.data.begin() + std::ptrdiff_t(n * per), src.data.begin() + std::ptrdiff_t((n + 1) * per),
                    dst.data.begin());
          continue;
        }
        const std::size_t rows = dst.data.size() / lengths[n];  // heads x width per token
        const std::size_t heads = t.name == "q" || t.name == "k" ? 1 : 2, width = rows / heads;
        for (std::size_t h = 0; h < heads; ++h)
          std::copy(src.data.begin() + std::ptrdiff_t((h * p.seq + start) * width),
                    src.data.begin() + std::ptrdiff_t((h * p.seq + start + lengths[n]) * width),
                    dst.data.begin() + std::ptrdiff_t(h * lengths[n] * width));
      }
      const Args aa = bind(ca, ina, outa);
      cpu::chunked_forward(pa, aa.fwd, allocator, nullptr);
      for (std::size_t h = 0; h < 2; ++h)
        for (int t = 0; t < lengths[n] * 16; ++t)
          REQUIRE(outa.at("o").data[h * lengths[n] * 16 + t] ==
                  Approx(out.at("o").data[(h * p.seq + start) * 16 + t]).margin(1e-6));
      start += lengths[n];
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("the rectangular packed transpose gives the panels of X^T", "[chunked][shapes][tile]") {
  // K x N states (Dk x Dv): multiples of 16 take the in-register blocks, the others the scalar
  // loop; the last panel's padding columns are zero either way.
  for (const auto& [K, N] :
       std::vector<std::pair<int, int>>{{32, 64}, {64, 16}, {16, 48}, {128, 64}, {40, 24}, {8, 33}}) {
    INFO("K " << K << " N " << N);
    std::vector<float> x(std::size_t(K) * N);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 97) - 48.0f;
    std::vector<float> packed(std::size_t(K) * cpu::tile::panel_cols(N)),
        expected(std::size_t(N) * cpu::tile::panel_cols(K));
    std::vector<float> got(expected.size(), 1e30f);
    cpu::tile::pack(x.data(), N, false, K, N, nullptr, packed.data());
    cpu::tile::pack(x.data(), N, true, N, K, nullptr, expected.data());  // X^T(j, i) = x[i * N + j]
    cpu::tile::transpose_packed(packed.data(), K, N, got.data());
    CHECK(got == expected);
  }
}

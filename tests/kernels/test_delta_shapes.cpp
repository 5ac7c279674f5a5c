// The delta rule's chunked WY form (cpu/chunked/chunked_delta_forward.cpp and _backward.cpp) on the shapes
// of docs/spec.md section 1c, taken natively (no gather adapter): grouped q/k heads, Dk x Dv states
// and packed documents, every decay, held to the float64 reference with the chunk states kept by
// the forward and recomputed by the backward, on thread counts that take both of the backward's
// schemes for shared q/k heads; and its scratch against its closed form, written out here
// independently of the kernel.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/packing.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

constexpr Decay kDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};

// A delta-rule case of the chunked form with the section 1c keys, settled as the plan settles it
// (a packed case is batch 1 of its documents' tokens).
struct ShapeCase {
  int batch, heads, heads_k, seq, dim, dim_v, chunk;
  std::string lengths = "";
  std::string varlen = "";
};

Case case_of(const ShapeCase& s, Decay decay) {
  Problem p{s.batch, s.heads, s.seq, s.dim, s.chunk, decay, Rule::delta};
  Case c = test::kernel_case(p, "chunked", Mode::fwd_bwd);
  c.options["heads_k"] = std::to_string(s.heads_k);
  c.options["dim_v"] = std::to_string(s.dim_v);
  if (!s.lengths.empty()) c.options["lengths"] = canonical_lengths(s.lengths);
  if (!s.varlen.empty()) c.options["varlen"] = canonical_varlen(s.varlen);
  if (c.op->settle) c.op->settle(c);
  return c;
}

std::string describe(const ShapeCase& s, Decay decay) {
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " Hk" + std::to_string(s.heads_k) + " T" +
         std::to_string(s.seq) + " Dk" + std::to_string(s.dim) + " Dv" + std::to_string(s.dim_v) + " C" +
         std::to_string(s.chunk) + " " + to_string(decay) + (s.lengths.empty() ? "" : " lengths " + s.lengths) +
         (s.varlen.empty() ? "" : " varlen " + s.varlen);
}

// The shapes of the proof: grouped heads (every q/k head count dividing 4), Dv below, at and above
// Dk, packed documents of 1 token up to more than a chunk (chunk 16: several chunks and a short last
// one; 64: one chunk each), and a drawn batch.
std::vector<ShapeCase> shapes() {
  std::vector<ShapeCase> out;
  for (int hk : {1, 2, 4}) out.push_back({2, 4, hk, 45, 32, 32, 16});
  for (int dv : {16, 32, 64}) out.push_back({1, 4, 2, 40, 32, dv, 16});
  for (int chunk : {16, 64}) out.push_back({1, 4, 2, 1, 32, 16, chunk, "37 1 64 90"});
  out.push_back({1, 4, 1, 1, 16, 24, 16, "", "300 1 80 uniform 5"});
  out.push_back({1, 4, 1, 1, 32, 32, 16, "70 5"});  // 2 documents x 1 q/k head: fewer groups than 3 threads
  return out;
}

}  // namespace

TEST_CASE("chunked delta rule on grouped, rectangular and packed shapes matches the reference natively",
          "[delta][shapes]") {
  double worst = 0;
  for (const ShapeCase& shape : shapes())
    for (Decay decay : kDecays) {
      const Case kase = case_of(shape, decay);
      const Problem p = linear_problem(kase);
      // The row itself takes the shape: no "+gather".
      CHECK(cpu::cpu_variant_for("chunked", p).name == "chunked_delta");
      // 1 thread: the backward's items are (sequence, q/k head); 3: where those would take more
      // rounds of threads (B2 Hk1, B2 Hk2, "70 5", the draw), (sequence, value head) with partial dq
      // and dk for the group's later value heads.
      for (int threads : {1, 3})
        for (bool keep : {true, false}) {
          INFO(describe(shape, decay) << " threads " << threads << (keep ? " kept" : " recomputed") << " states");
          auto backend = make_backend("cpu", BackendOptions{threads, 0, keep});
          const test::Outcome run = test::run_on(*backend, kase);
          INFO(test::errors(run.check));
          CHECK(run.bwd_states == (keep ? "kept" : "recomputed"));
          CHECK(run.check.non_finite.empty());
          CHECK(run.check.passed);
          CHECK(run.check.rel_err < 1e-5);
          worst = std::max(worst, run.check.rel_err);
        }
    }
  WARN("chunked delta rule, section 1c shapes: worst rel_err " << worst);
}

TEST_CASE("chunked delta rule on the section 1c shapes matches the reference at every vector width",
          "[delta][shapes][paths]") {
  // Below AVX-512 the tile products run their portable form, on the same packed operands.
  for (const cpu::Vec vec : cpu::available_vecs()) {
    const test::VecOverride force(vec);
    for (const ShapeCase& shape : shapes())
      for (Decay decay : kDecays) {
        INFO(describe(shape, decay) << " " << cpu::to_string(vec));
        const test::Outcome run = test::run_on(*make_backend("cpu", BackendOptions{3}), case_of(shape, decay));
        INFO(test::errors(run.check));
        CHECK(run.check.passed);
        CHECK(run.check.rel_err < 1e-5);
      }
  }
}

TEST_CASE("chunked delta rule's scratch on the section 1c shapes equals its closed form", "[delta][shapes][memory]") {
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (const ShapeCase& shape : shapes())
      for (Decay decay : kDecays) {
        const Case kase = case_of(shape, decay);
        const Problem p = linear_problem(kase);
        INFO(describe(shape, decay) << " threads " << threads);
        // The lengths of the sequences: packed documents, else batch sequences of seq.
        std::vector<std::size_t> lengths;
        for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) lengths.push_back(p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
        if (lengths.empty()) lengths.assign(std::size_t(p.batch), std::size_t(p.seq));
        const std::size_t longest = *std::max_element(lengths.begin(), lengths.end());
        const std::size_t Dk = p.dim, Dv = p.value_dim(), G = p.heads / p.qk_heads(), N = lengths.size();
        const std::size_t C = std::min<std::size_t>(p.chunk, longest), most_chunks = (longest + p.chunk - 1) / p.chunk;
        std::size_t all_chunks = 0;
        for (std::size_t length : lengths) all_chunks += (length + p.chunk - 1) / p.chunk;
        auto lines = [](std::size_t floats) { return (floats + 15) / 16 * 16; };
        auto panels = [](std::size_t n) { return (n + 31) / 32 * 32; };
        const bool vector = decay == Decay::vector;
        const std::size_t L = C + 16, PK = panels(Dk), PV = panels(Dv), PC = panels(C), g = vector ? Dk : 1;
        const std::size_t SF = Dk * PV;  // a packed Dk x Dv state
        // Per thread (test_delta.cpp's list with the dims apart): b (C g doubles), dg's Dk doubles,
        // exp(g) for vector gates, EQ and EK (C g), two Dk vectors, the mask, A_qk, A_kk, T, six
        // C x Dk operands and the lanes for vector gates, X R W (C x Dv), K^T (Dk x PC), W^T
        // (Dv x PC), three C x PV panels and the state; the backward adds dP_qk, dP_kk, dW (C x Dv),
        // dK_read and dK_write (C x Dk), K and Q panels (C x PK), dO and Z panels (C x PV), S^T and
        // dS^T (Dv x PK), dS, every chunk's state of the longest sequence when recomputing, and a
        // chunk of dq (C x Dk) when a thread runs a group's value heads one after another, and for
        // vector gates three C x Dk rows for the score gradients' products.
        const std::size_t fwd_floats = (2 * C * g + 2 * Dk + (vector ? C * Dk : 0) + 2 * C * g + 2 * Dk + 4 * C * L +
                                      (vector ? 6 * C * Dk + 2 * Dk * 32 : 0) + 3 * C * Dv + Dk * PC + Dv * PC +
                                      3 * C * PV + SF);
        const std::size_t fwd = lines(fwd_floats);
        auto bwd_thread = [&](bool kept, bool grouped) {
          return lines(fwd_floats + 2 * C * L + C * Dv + 2 * C * Dk + 2 * C * PK + 2 * C * PV + 2 * Dv * PK + SF +
                       (kept ? 0 : most_chunks * SF) + (grouped ? C * Dk : 0) + (vector ? 3 * C * Dk : 0));
        };
        // The documents' order table (one int each, on a cache line) when packed.
        const std::size_t order = p.packed() ? lines(N) : 0;
        const std::size_t items = N * p.heads, groups = N * p.qk_heads();
        // A group runs on one thread where that takes no more rounds of threads than its value heads apart.
        auto rounds = [&](std::size_t n) { return (n + threads - 1) / threads; };
        const bool grouped = G > 1 && rounds(groups) * G <= rounds(items);
        const std::size_t bwd_threads = std::min<std::size_t>(threads, grouped ? groups : items);
        const std::size_t partial = G > 1 && !grouped ? lines(2 * (G - 1) * p.key_elems()) : 0;
        const std::size_t fwd_threads = std::min<std::size_t>(threads, items);
        CHECK(cpu::chunked_kept_states_bytes(p) == p.heads * all_chunks * SF * 4);
        CHECK(cpu::chunked_forward_workspace_bytes(p) == (fwd_threads * fwd + order) * 4);
        CHECK(cpu::chunked_forward_workspace_bytes(p, true) == (fwd_threads * fwd + order) * 4);
        for (bool kept : {false, true})
          CHECK(cpu::chunked_backward_workspace_bytes(p, kept) ==
                (bwd_threads * bwd_thread(kept, grouped) + partial + order) * 4);

        // And the kernels' counted peaks are those.
        const TensorSet t = make_case_inputs(kase, 0);
        std::vector<float> o(p.value_elems()), hT(p.state_elems()), dq(p.key_elems()), dk(p.key_elems()),
            dv(p.value_elems()), dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.beta_elems());
        const float* gates = gated(decay) ? t.data("g") : nullptr;
        const ForwardArgs<float> fa{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data(), gates,
                                    t.data("beta")};
        const BackwardArgs<float> ba{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), t.data("dO"),
                                     t.data("dhT"), dq.data(), dk.data(), dv.data(), dh0.data(), gates,
                                     gated(decay) ? dg.data() : nullptr, t.data("beta"), dbeta.data()};
        auto peak_of = [](auto&& call) {
          CountingAllocator allocator;
          call(allocator);
          CHECK(allocator.live_bytes() == 0);
          return allocator.peak_bytes();
        };
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fa, a); }) == cpu::chunked_forward_workspace_bytes(p));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, ba, a); }) == cpu::chunked_backward_workspace_bytes(p));
        std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / 4);
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fa, a, kept.data()); }) ==
              cpu::chunked_forward_workspace_bytes(p, true));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, ba, a, kept.data()); }) ==
              cpu::chunked_backward_workspace_bytes(p, true));
      }
  }
}

// The CPU scan variants (scan_columns, scan_delta) on the shapes of docs/spec.md section 1c, which
// they take natively (no gather adapter): grouped q/k heads, Dk x Dv states, packed documents. Each
// is held to the float64 reference, and its scratch to its closed form, written out here
// independently of the kernels' own *_workspace_bytes.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/packing.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

struct Shape {
  int batch, heads, heads_k, seq, dim, dim_v;
  std::string lengths = "", varlen = "";  // a packed batch (batch and seq then come from it)
};

std::string describe(const Shape& s) {
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " Hk" + std::to_string(s.heads_k) + " T" +
         std::to_string(s.seq) + " Dk" + std::to_string(s.dim) + " Dv" + std::to_string(s.dim_v) +
         (s.lengths.empty() ? "" : " lengths " + s.lengths) + (s.varlen.empty() ? "" : " varlen " + s.varlen);
}

// heads_k {1, 2, 4} of 4 heads with dim_v {16, 32, 64} of dim 32 (T 70: past a tile of either rule,
// not a multiple of one); packed documents, one of a single token, and a varlen draw; Dk and Dv not
// multiples of any vector width; fewer units of work than threads (one q/k head, one document),
// where threads split a unit's columns.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int heads_k : {1, 2, 4})
    for (int dim_v : {16, 32, 64}) out.push_back({2, 4, heads_k, 70, 32, dim_v});
  out.push_back({1, 4, 2, 1, 32, 16, "37 1 64 90"});
  out.push_back({1, 4, 1, 1, 32, 64, "37 1 64 90"});
  out.push_back({1, 4, 4, 1, 32, 32, "37 1 64 90"});
  out.push_back({1, 4, 1, 1, 32, 16, "", "300 1 120 log 5"});
  out.push_back({1, 4, 2, 1, 32, 64, "", "300 1 120 uniform 9"});
  out.push_back({1, 4, 2, 45, 20, 36});
  out.push_back({1, 2, 1, 70, 32, 64});
  out.push_back({1, 2, 1, 1, 32, 64, "150"});
  return out;
}

Case shape_case(const Shape& s, Rule rule, Decay decay, Mode mode) {
  Case c = test::kernel_case(Problem{s.batch, s.heads, s.seq, s.dim, 64, decay, rule}, "scan", mode);
  c.options["heads_k"] = std::to_string(s.heads_k);
  c.options["dim_v"] = std::to_string(s.dim_v);
  if (!s.lengths.empty()) c.options["lengths"] = canonical_lengths(s.lengths);
  if (!s.varlen.empty()) c.options["varlen"] = canonical_varlen(s.varlen);
  c.op->settle(c);
  return c;
}

constexpr Rule kRules[] = {Rule::additive, Rule::delta};
constexpr Decay kDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

int longest_document(const Problem& p) {
  if (!p.packed()) return p.seq;
  int most = 0;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) most = std::max(most, p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  return most;
}

// The scratch of scan_columns, in floats, with `threads` threads. Per thread a packed Dk x Dv
// state (in the backward one per value head of a group) and, gated, a tile's gates ((tile + 1) x
// width); the backward adds a state per slice and, with grouped heads, a tile x Dk buffer of dq or
// dk per value head of a group, per thread, and its dg sums (Dk doubles per thread over slices)
// come after. Items: (slice, block of W value columns) forward; (group, block
// of W key and value columns) backward, a whole group with scalar gates and grouped heads.
struct Floats {
  std::size_t forward, backward;
};

Floats scan_columns_floats(const Problem& p, cpu::Vec vec, std::size_t threads) {
  const std::size_t Dk = p.dim, Dv = p.value_dim(), G = p.group(), slices = p.slices(), groups = slices / G;
  const std::size_t W = cpu::scan_column_block(vec), u = cpu::scan_tokens_per_walk(vec);
  const std::size_t tile = round_up(32, u) + (u > 2 ? 2 * u : 0);
  const std::size_t gate = gated(p.decay) ? (tile + 1) * p.gate_width() : 0;
  const std::size_t blocks_k = (Dk + W - 1) / W, blocks_v = (Dv + W - 1) / W;
  const std::size_t fwd_threads = std::min(threads, slices * blocks_v);
  const bool whole_groups = G > 1 && p.decay == Decay::scalar;
  const std::size_t bwd_threads = std::min(threads, groups * (whole_groups ? 1 : std::max(blocks_k, blocks_v)));
  const std::size_t passes = slices * Dk * Dv + bwd_threads * (G * Dk * Dv + gate + (G > 1 ? G * tile * Dk : 0));
  const std::size_t sums = gated(p.decay) ? std::min(threads, slices) * 2 * Dk : 0;
  return {fwd_threads * (Dk * Dv + gate), std::max(passes, sums)};
}

// The scratch of scan_delta, in floats: per thread (whole cache lines of 16 floats) a Dk x Dvp
// state (Dvp, Dkp: Dv, Dk rounded up to the walk's W), a tile's gates ((64 + 2) x gw, gw = Dkp or
// 1), the two pending updates (Dvp each), six W-float operands, 64 q . k and the forward's 32 pairs
// (three Dk rows each, a fourth for vector gates, and three scalars); the backward's thread adds a
// Dv x Dkp state, e of a tile (64 Dv), with gates dg's Dkp doubles, and e of the longest slice (T
// x Dv) unless e fits in dq (one value head per q/k head, Dv <= Dk). Items: (slice, block of value
// columns) forward, whole groups backward.
Floats scan_delta_floats(const Problem& p, cpu::Vec vec, std::size_t threads) {
  const std::size_t Dk = p.dim, Dv = p.value_dim(), G = p.group(), slices = p.slices();
  const std::size_t W = cpu::delta_walk_width(vec), Dkp = round_up(Dk, W), Dvp = round_up(Dv, W);
  const std::size_t gw = p.decay == Decay::vector ? Dkp : p.decay == Decay::scalar ? 1 : 0;
  const std::size_t e = G > 1 || Dv > Dk ? std::size_t(longest_document(p)) * Dv : 0;
  const std::size_t pairs = 32 * ((p.decay == Decay::vector ? 4 : 3) * Dk + 3);
  const std::size_t fwd = round_up(Dk * Dvp + 66 * gw + 2 * Dvp + 6 * W + 64 + pairs, 16);
  const std::size_t bwd =
      round_up((gw ? 2 * Dkp : 0) + Dk * Dvp + Dv * Dkp + 66 * gw + 64 * Dv + 2 * Dvp + 6 * W + 64 + pairs + e, 16);
  return {std::min(threads, slices * ((Dv + W - 1) / W)) * fwd, std::min(threads, slices / G) * bwd};
}

}  // namespace

TEST_CASE("the scan variants take the section 1c shapes themselves", "[scan][shapes]") {
  for (const Shape& shape : shapes())
    for (Rule rule : kRules) {
      const Problem p = linear_problem(shape_case(shape, rule, Decay::scalar, Mode::fwd_bwd));
      INFO(describe(shape) << " " << to_string(rule));
      CHECK(p.square_dense() == (shape.heads_k == shape.heads && shape.dim_v == shape.dim && shape.lengths.empty() &&
                                 shape.varlen.empty()));
      const cpu::CpuVariant v = cpu::cpu_variant_for("scan", p);
      CHECK(v.name == (rule == Rule::delta ? "scan_delta" : "scan_columns"));
      CHECK(v.takes.shapes);
    }
}

TEST_CASE("the scan variants match the float64 reference on grouped, rectangular and packed shapes",
          "[scan][shapes]") {
  const cpu::Vec active = cpu::active_vec();
  // Every vector width on the first dense shapes and the packed ones; the rest at the widest. The
  // widths innermost: a case's inputs and reference are made once for all of them.
  const std::vector<Shape> all = shapes();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Shape& shape = all[i];
    for (Rule rule : kRules)
      for (Decay decay : kDecays)
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd})
          for (const cpu::Vec vec : cpu::available_vecs()) {
            if (vec != active && i % 3 != 0) continue;
            const test::VecOverride force(vec);
            const Case kase = shape_case(shape, rule, decay, mode);
            INFO(describe(shape) << " " << to_string(rule) << " " << to_string(decay) << " " << to_string(mode) << " "
                                 << cpu::to_string(vec));
            const CheckResult check = test::run_cpu_case(kase, 3);
            INFO(test::errors(check));
            CHECK(check.passed);
          }
  }
}

TEST_CASE("the scan variants' scratch on the section 1c shapes equals its closed form", "[scan][shapes][memory]") {
  for (const int threads : {2, 3}) {
    omp_set_num_threads(threads);
    for (const cpu::Vec vec : cpu::available_vecs()) {
      if (threads == 3 && vec != cpu::active_vec()) continue;  // the vector widths' blocks at 2 threads
      const test::VecOverride force(vec);
      for (const Shape& shape : shapes())
        for (Rule rule : kRules)
          for (Decay decay : kDecays) {
            const Case kase = shape_case(shape, rule, decay, Mode::fwd_bwd);
            const Problem p = linear_problem(kase);
            INFO(describe(shape) << " " << to_string(rule) << " " << to_string(decay) << " " << cpu::to_string(vec)
                                 << " threads " << threads);
            const Floats want = rule == Rule::delta ? scan_delta_floats(p, vec, std::size_t(threads))
                                                    : scan_columns_floats(p, vec, std::size_t(threads));
            CHECK(cpu::scan_forward_workspace_bytes(p) == want.forward * 4);
            CHECK(cpu::scan_backward_workspace_bytes(p) == want.backward * 4);

            const TensorSet t = make_case_inputs(kase, 0);
            std::vector<float> o(p.value_elems()), hT(p.state_elems()), dq(p.key_elems()), dk(p.key_elems()),
                dv(p.value_elems()), dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.beta_elems());
            const float* gates = gated(decay) ? t.data("g") : nullptr;
            const float* beta = p.delta() ? t.data("beta") : nullptr;
            const ForwardArgs<float> fa{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data(),
                                        gates, beta};
            const BackwardArgs<float> ba{t.data("q"),  t.data("k"),  t.data("v"),  t.data("h0"),
                                         t.data("dO"), t.data("dhT"), dq.data(),   dk.data(),
                                         dv.data(),    dh0.data(),   gates,       gated(decay) ? dg.data() : nullptr,
                                         beta,         p.delta() ? dbeta.data() : nullptr};
            auto peak_of = [](auto&& call) {
              CountingAllocator allocator;
              call(allocator);
              CHECK(allocator.live_bytes() == 0);
              return allocator.peak_bytes();
            };
            CHECK(peak_of([&](Allocator& a) { cpu::scan_forward(p, fa, a); }) == cpu::scan_forward_workspace_bytes(p));
            CHECK(peak_of([&](Allocator& a) { cpu::scan_backward(p, ba, a); }) ==
                  cpu::scan_backward_workspace_bytes(p));
          }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

// The trapezoidal rule's decode step (docs/spec.md sections 1d and 1e; kernels/decode/reference.cpp
// and cpu/trapezoidal.cpp): its float64 reference against the kernel suite's over a whole
// sequence, the step carrying the previous token's rows across a cut, and the CPU step against the
// reference on every vector width and thread count, MIMO ranks 1, 2 and 4.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/decode/op.hpp"
#include "kernels/decode/reference.hpp"
#include "kernels/linear_attention/reference.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

std::vector<double> normals(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = normal(rng);
  return x;
}

// Token rows [heads][T][width] -> those of tokens [from, from + count).
std::vector<double> tokens_of(const std::vector<double>& x, std::size_t heads, int T, std::size_t width, int from,
                              int count) {
  std::vector<double> out;
  for (std::size_t h = 0; h < heads; ++h) {
    const auto start = x.begin() + std::ptrdiff_t((h * T + std::size_t(from)) * width);
    out.insert(out.end(), start, start + std::ptrdiff_t(std::size_t(count) * width));
  }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("decode trapezoidal: steps after a cut continue the kernel suite's sequence", "[decode][trapezoidal]") {
  // A sequence of 1 + T tokens through the kernel suite's reference, against its first token as one
  // step from h0 with no previous token (k_prev = v_prev = 0), then the other T as a second step
  // from that step's state and last rows: o of every token, the final state, the snapshots of the
  // second step (slot i: the kernel suite's state after 1 + T - i tokens) and the last rows.
  for (int rank : {1, 2, 4})
    for (const auto& [heads_k, dim_v] : {std::pair{2, 5}, std::pair{1, 3}}) {
      const int B = 2, H = 2, Dk = 4, T = 3, R = rank, total = 1 + T;
      Problem whole{B, H, total, Dk, 64, Decay::scalar, Rule::trapezoidal};
      whole.rank = R;
      whole.heads_k = heads_k;
      whole.dim_v = dim_v;
      std::mt19937_64 rng(std::uint64_t(7 + rank));
      const auto q = normals(whole.key_elems(), rng), k = normals(whole.key_elems(), rng);
      const auto v = normals(whole.value_elems(), rng), h0 = normals(whole.state_elems(), rng);
      auto g = normals(whole.gate_elems(), rng), dt = normals(whole.beta_elems(), rng);
      const auto trap = normals(whole.beta_elems(), rng);
      for (double& x : g) x = -std::log1p(std::exp(-x));
      for (double& x : dt) x = std::log1p(std::exp(x));
      std::vector<double> o(whole.value_elems()), hT(whole.state_elems());
      ForwardArgs<double> fa{q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data(), g.data()};
      fa.dt = dt.data(), fa.trap = trap.data();
      reference::forward(whole, fa);

      const std::size_t BH = std::size_t(B) * H, BHk = std::size_t(B) * heads_k;
      const std::size_t RK = std::size_t(R) * Dk, RV = std::size_t(R) * dim_v;
      std::vector<double> state = h0, zero_k(BH * RK, 0.0), zero_v(BH * RV, 0.0);
      std::vector<double> k_last(BH * RK), v_last(BH * RV), k_end(BH * RK), v_end(BH * RV);
      const auto step = [&](int from, int count, int snapshots, const double* kp, const double* vp, double* kl,
                            double* vl, std::vector<double>& out, std::vector<double>& snaps) {
        DecodeProblem p{B, H, count, Dk, snapshots, Decay::scalar, Rule::trapezoidal, heads_k, dim_v};
        p.rank = R;
        const auto qs = tokens_of(q, BHk, total, RK, from, count), ks = tokens_of(k, BHk, total, RK, from, count);
        const auto vs = tokens_of(v, BH, total, RV, from, count);
        const auto gs = tokens_of(g, BH, total, 1, from, count), dts = tokens_of(dt, BH, total, 1, from, count);
        const auto traps = tokens_of(trap, BH, total, 1, from, count);
        out.assign(p.value_elems(), 0.0);
        snaps.assign(p.snapshot_elems(), 0.0);
        DecodeArgs<double, double> a{qs.data(), ks.data(), vs.data(), state.data(), out.data(), gs.data(), nullptr,
                                     snaps.data()};
        a.dt = dts.data(), a.trap = traps.data(), a.k_prev = kp, a.v_prev = vp, a.k_last = kl, a.v_last = vl;
        reference::decode_step(p, a);
      };
      std::vector<double> o1, o2, snaps1, snaps2;
      step(0, 1, 1, zero_k.data(), zero_v.data(), k_last.data(), v_last.data(), o1, snaps1);
      step(1, T, T, k_last.data(), v_last.data(), k_end.data(), v_end.data(), o2, snaps2);
      INFO("rank " << rank << " heads_k " << heads_k << " dim_v " << dim_v);
      CHECK(max_abs_diff(o1, tokens_of(o, BH, total, RV, 0, 1)) < 1e-12);
      CHECK(max_abs_diff(o2, tokens_of(o, BH, total, RV, 1, T)) < 1e-12);
      CHECK(max_abs_diff(state, hT) < 1e-12);
      // The last rows: value head bh's own v, its q/k head's k.
      CHECK(max_abs_diff(v_end, tokens_of(v, BH, total, RV, total - 1, 1)) < 1e-15);
      for (std::size_t bh = 0; bh < BH; ++bh) {
        const std::size_t key_head = (bh / H) * heads_k + (bh % H) / (H / heads_k);
        for (std::size_t e = 0; e < RK; ++e) CHECK(k_end[bh * RK + e] == k[(key_head * total + total - 1) * RK + e]);
      }
      // Slot i of the second step: the state after 1 + T - i tokens.
      const std::size_t DD = std::size_t(Dk) * dim_v;
      for (int slot = 1; slot < T; ++slot) {
        Problem prefix = whole;
        prefix.seq = total - slot;
        const auto qp = tokens_of(q, BHk, total, RK, 0, prefix.seq), kp = tokens_of(k, BHk, total, RK, 0, prefix.seq);
        const auto vp = tokens_of(v, BH, total, RV, 0, prefix.seq), gp = tokens_of(g, BH, total, 1, 0, prefix.seq);
        const auto dtp = tokens_of(dt, BH, total, 1, 0, prefix.seq), trp = tokens_of(trap, BH, total, 1, 0, prefix.seq);
        std::vector<double> op(prefix.value_elems()), hp(prefix.state_elems());
        ForwardArgs<double> pa{qp.data(), kp.data(), vp.data(), h0.data(), op.data(), hp.data(), gp.data()};
        pa.dt = dtp.data(), pa.trap = trp.data();
        reference::forward(prefix, pa);
        std::vector<double> mine;
        for (std::size_t bh = 0; bh < BH; ++bh) {
          const auto start = snaps2.begin() + std::ptrdiff_t((bh * (T - 1) + std::size_t(slot - 1)) * DD);
          mine.insert(mine.end(), start, start + std::ptrdiff_t(DD));
        }
        INFO("slot " << slot);
        CHECK(max_abs_diff(mine, hp) < 1e-12);
      }
    }
}

TEST_CASE("decode trapezoidal: the CPU step matches the reference on every vector width and thread count",
          "[decode][trapezoidal]") {
  for (const DecodeProblem& p : test::decode_trapezoidal_test_shapes())
    for (const cpu::Vec vec : cpu::available_vecs()) {
      test::VecOverride force(vec);
      for (const int threads : {1, 3}) {
        const Case c = test::trapezoidal_decode_case(p);
        INFO(test::describe(c) << " rank " << p.rank << " vec " << cpu::to_string(vec) << " threads " << threads);
        const CheckResult r = test::run_cpu_case(c, threads);
        INFO(test::errors(r));
        CHECK(r.passed);
        CHECK(r.rel_err < 1e-5);
        for (const char* name : {"o", "hT", "k_last", "v_last"}) CHECK(r.per_output.count(name) == 1);
      }
    }
}

TEST_CASE("decode trapezoidal: the byte model counts the previous token's rows", "[decode][trapezoidal]") {
  // B 64, H 16, Dk = Dv = 128, one token: beside the additive step's bytes, dt and trap (4 bytes
  // each per head) and the previous rows read and the last written (4 R (Dk + Dv) bytes each way);
  // q, k, v and o are R times as many.
  for (int rank : {1, 4}) {
    DecodeProblem p{64, 16, 1, 128, 1, Decay::scalar, Rule::trapezoidal};
    p.rank = rank;
    DecodeProblem additive = p;
    additive.rule = Rule::additive;
    additive.rank = 1;
    const double BH = 64.0 * 16, R = rank;
    const double tokens_extra = (R - 1) * (2 * 4.0 * 64 * 16 * 128 + BH * 128 * 8.0);
    const double expected = decode_step_bytes(test::decode_case(additive)) + tokens_extra + 8.0 * BH +
                            2 * 4.0 * BH * R * (128 + 128);
    CHECK(decode_step_bytes(test::trapezoidal_decode_case(p)) == Approx(expected).epsilon(1e-12));
  }
}

// The delta rule's scan forward on the CPU, float32, every decay and the shapes of docs/spec.md
// section 1c (the method: cpu/scan/scan_delta.cpp's header; what it shares with the backward, which runs
// forward_columns again as F1: cpu/scan/scan_delta_parts.hpp).
//
// The forward (and F1) walks two tokens at once (run_delta_pair_walk). With u_t = S'_t^T k_t read out
// of S'_t and S'_{t+1} = A_{t+1} (S'_t + k_t w_t^T), token t + 1's readouts come from S'_t too:
//   u_{t+1}        = S'_t^T (a_{t+1} . k_{t+1}) + (k_t . (a_{t+1} . k_{t+1})) w_t
//   S'^T_{t+1} q_{t+1} = S'_t^T (a_{t+1} . q_{t+1}) + (k_t . (a_{t+1} . q_{t+1})) w_t
// (a_t: the decay's factor per key channel; for scalar decays every channel's), so the pass over
// the rows for tokens t, t+1 reads out four vectors, and applies the two updates pending from the
// pass before, w_{t-2} and w_{t-1}:
//   S'_t = (S'_{t-2} + k_{t-2} w_{t-2}^T) . (a_{t-1} a_t) + (a_t . k_{t-1}) w_{t-1}^T
// one multiply per row register for both decays. Pairs start at even tokens (tiles hold an even
// number of them); the token before the first is h0's, with no update pending and a_{-1} = 1.
// A pair's row operands, made once per tile for every column block: a_{t-1} a_t (per channel for
// vector gates; a scalar else), a_t . k_{t-1}, a_{t+1} . k_{t+1}, a_{t+1} . q_{t+1} (zero past the
// slice's last token), and the dot products k_t . (a_{t+1} . k_{t+1}), k_t . (a_{t+1} . q_{t+1}).
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/delta.hpp"
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"
#include "kernels/linear_attention/cpu/scan/scan_delta_parts.hpp"
#include "kernels/linear_attention/cpu/scan/scan_split.hpp"

namespace lattn::cpu {
namespace scan_delta {
namespace {

// The decay's factor of token t on every key channel, for scalar decays (1 for none and t < 0).
float scalar_gate(const Ctx& x, const Head& h, const float* buf, int first, int t) {
  if (t < 0) return 1.0f;
  switch (x.decay) {
    case Decay::retnet: return h.gamma;
    case Decay::scalar: return buf[t - first];
    default: return 1.0f;
  }
}

// The pairs of tokens [t0, t0 + n): their operands (the file's header) into the scratch, and q_t . k_t into
// s.qk when the forward makes o. The gates buffer takes tokens t0 - 1 .. t0 + n - 1.
void prepare_pairs(const Ctx& x, const Head& h, const Scratch& s, int t0, int n, bool with_o) {
  const int Dk = x.Dk, T = h.T, first = t0 - 1;
  const bool vector = x.decay == Decay::vector;
  if (t0 == 0) {
    if (x.gw) std::fill_n(s.gates, x.gw, 1.0f);
    take_gates(x, h, s.gates + x.gw, t0, n);
  } else {
    take_gates(x, h, s.gates, first, n + 1);
  }
  auto gate_row = [&](int t) { return s.gates + std::size_t(t - first) * x.gw; };
  if (with_o)
    for (int u = 0; u < n; ++u) s.qk[u] = dot(h.q + std::size_t(t0 + u) * Dk, h.k + std::size_t(t0 + u) * Dk, Dk);
  for (int j = 0; 2 * j < n; ++j) {
    const int t = t0 + 2 * j;
    const bool second = t + 1 < T;
    float* __restrict b2 = s.pair_b2 + std::size_t(j) * Dk;
    float* __restrict xk = s.pair_k + std::size_t(j) * Dk;
    float* __restrict xq = s.pair_q + std::size_t(j) * Dk;
    const float* k_prev = t > 0 ? h.k + std::size_t(t - 1) * Dk : nullptr;
    const float *k_next = second ? h.k + std::size_t(t + 1) * Dk : nullptr,
                *q_next = second ? h.q + std::size_t(t + 1) * Dk : nullptr;
    if (vector) {
      const float *__restrict a_prev = gate_row(t - 1), *__restrict a_t = gate_row(t);
      float* __restrict a = s.pair_a + std::size_t(j) * Dk;
#pragma omp simd
      for (int d = 0; d < Dk; ++d) a[d] = a_prev[d] * a_t[d];
      if (k_prev) multiply_into(b2, a_t, k_prev, Dk);
      if (second) {
        multiply_into(xk, gate_row(t + 1), k_next, Dk);
        if (with_o) multiply_into(xq, gate_row(t + 1), q_next, Dk);
      }
    } else {
      const float a_t = scalar_gate(x, h, s.gates, first, t);
      const float a_next = second ? scalar_gate(x, h, s.gates, first, t + 1) : 0.0f;
      s.pair_decay[j] = scalar_gate(x, h, s.gates, first, t - 1) * a_t;
      if (k_prev) scale_into(b2, a_t, k_prev, Dk);
      if (second) {
        scale_into(xk, a_next, k_next, Dk);
        if (with_o) scale_into(xq, a_next, q_next, Dk);
      }
    }
    if (!k_prev) std::fill_n(b2, Dk, 0.0f);
    if (!second) {
      std::fill_n(xk, Dk, 0.0f);
      std::fill_n(xq, Dk, 0.0f);
    }
    const float* kt = h.k + std::size_t(t) * Dk;
    s.pair_kk[j] = dot(kt, xk, Dk);
    s.pair_kq[j] = with_o ? dot(kt, xq, Dk) : 0.0f;
  }
}

// A pair's tail on a block's m columns, from its readouts y[0..3] (S'_t^T of k_t, q_t, a_{t+1} .
// k_{t+1}, a_{t+1} . q_{t+1}; the q ones only with o): the pending updates w_t = beta_t e_t (carry1)
// and w_{t+1} (carry2, 0 past the last token), e (when given, rows e_step apart) and o (when given,
// rows Dv apart). One restrict-qualified loop per output, so that each vectorises.
struct PairTail {
  const float* v;  // v_t's columns; v_{t+1}'s Dv further
  std::size_t Dv;
  float beta0, beta1, qk0, qk1, kk, kq;  // beta, q . k of both tokens; k_t . (a k_{t+1}), k_t . (a q_{t+1})
  bool second;
  float scale;
};

void pair_tail(const PairTail& p, float* const (&y)[4], float* __restrict carry1, float* __restrict carry2,
               float* __restrict e, std::size_t e_step, float* __restrict o, int m) {
  const float *__restrict v0 = p.v, *__restrict v1 = p.v + p.Dv, *__restrict y0 = y[0], *__restrict y2 = y[2];
  const float beta0 = p.beta0, beta1 = p.beta1, kk = p.kk;
#pragma omp simd
  for (int j = 0; j < m; ++j) carry1[j] = beta0 * (v0[j] - y0[j]);
  if (p.second) {
#pragma omp simd
    for (int j = 0; j < m; ++j) carry2[j] = beta1 * (v1[j] - y2[j] - kk * carry1[j]);
  } else {
    std::fill_n(carry2, m, 0.0f);
  }
  if (e) {
    float *__restrict e0 = e, *__restrict e1 = e + e_step;
#pragma omp simd
    for (int j = 0; j < m; ++j) e0[j] = v0[j] - y0[j];
    if (p.second) {
#pragma omp simd
      for (int j = 0; j < m; ++j) e1[j] = v1[j] - y2[j] - kk * carry1[j];
    }
  }
  if (o) {
    const float *__restrict y1 = y[1], *__restrict y3 = y[3];
    float *__restrict o0 = o, *__restrict o1 = o + p.Dv;
    const float s = p.scale, qk0 = p.qk0, qk1 = p.qk1, kq = p.kq;
#pragma omp simd
    for (int j = 0; j < m; ++j) o0[j] = s * (y1[j] + qk0 * carry1[j]);
    if (p.second) {
#pragma omp simd
      for (int j = 0; j < m; ++j) o1[j] = s * (y3[j] + kq * carry1[j] + qk1 * carry2[j]);
    }
  }
}

}  // namespace

void forward_columns(const Ctx& x, const Head& h, const float* h0, int c0, int c1, const Scratch& s, float* o, float* e,
                     std::size_t e_step, float* hT) {
  const int Dk = x.Dk, Dv = x.Dv, W = x.W, T = h.T;
  const bool vector = x.decay == Decay::vector, decayed = x.decay != Decay::none;
  const int cend = std::min(x.Dvp, (c1 + W - 1) / W * W);
  pack_blocks(h0, false, s.S, Dk, Dv, W, c0, c1);
  std::fill(s.carry + c0, s.carry + cend, 0.0f);
  std::fill(s.carry2 + c0, s.carry2 + cend, 0.0f);
  // The pair's decay on a walk: a_{t-1} a_t.
  auto set_pair_decay = [&](DeltaPairWalk& w, int j) {
    w.decay = vector ? WalkDecay::rows : decayed ? WalkDecay::scalar : WalkDecay::none;
    w.a_rows = vector ? s.pair_a + std::size_t(j) * Dk : nullptr;
    w.a_scalar = s.pair_decay[j];
  };
  int last_pair = 0;  // the first token of the slice's last pair
  for (int t0 = 0; t0 < T; t0 += kTile) {
    const int n = std::min(kTile, T - t0);
    prepare_pairs(x, h, s, t0, n, o != nullptr);
    // Pair by pair, each over every block: consecutive walks on different blocks are independent,
    // so one block's walk runs while the one before waits for its readouts and tail (a walk's
    // first row needs the pending updates, which need every row of the walk before).
    for (int j = 0; 2 * j < n; ++j)
      for (int c = c0; c < c1; c += W) {
        const int m = std::min(W, Dv - c);
        const int t = t0 + 2 * j;
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        DeltaPairWalk w;
        w.D = Dk;
        w.S = s.S + std::size_t(c) * Dk;
        w.b1 = h.k + (t >= 2 ? rk - 2 * std::size_t(Dk) : rk);  // w_{t-2} (none before token 2: carry 0)
        w.c1 = s.carry + c;
        set_pair_decay(w, j);
        w.b2 = s.pair_b2 + std::size_t(j) * Dk;
        w.c2 = s.carry2 + c;
        float* const y[4] = {s.y1, s.y2, s.y3, s.y4};
        if (o) {
          w.readouts = 4;
          w.x[0] = h.k + rk;
          w.x[1] = h.q + rk;
          w.x[2] = s.pair_k + std::size_t(j) * Dk;
          w.x[3] = s.pair_q + std::size_t(j) * Dk;
          std::copy(y, y + 4, w.y);
        } else {
          w.readouts = 2;
          w.x[0] = h.k + rk;
          w.x[1] = s.pair_k + std::size_t(j) * Dk;
          w.y[0] = s.y1;
          w.y[1] = s.y3;
        }
        run_delta_pair_walk(w, x.vec);
        const bool second = t + 1 < T;
        const PairTail tail{h.v + rv + c,
                            std::size_t(Dv),
                            h.beta[t],
                            second ? h.beta[t + 1] : 0.0f,
                            o ? s.qk[2 * std::size_t(j)] : 0.0f,
                            o && second ? s.qk[2 * std::size_t(j) + 1] : 0.0f,
                            s.pair_kk[j],
                            s.pair_kq[j],
                            second,
                            x.s};
        pair_tail(tail, y, s.carry + c, s.carry2 + c, e ? e + std::size_t(t) * e_step + c : nullptr, e_step,
                  o ? o + rv + c : nullptr, m);
      }
    last_pair = t0 + (n - 1) / 2 * 2;
  }
  if (!hT) return;
  // hT = S_{T-1}: the last pair's updates, with token t + 1's decay between them when it exists.
  const int t = last_pair;
  const bool second = t + 1 < T;
  const float* a_next = nullptr;
  if (second && vector) {
    // The gates buffer holds the last tile's tokens from one before its first.
    const int first = (T - 1) / kTile * kTile - 1;
    a_next = s.gates + std::size_t(t + 1 - first) * x.gw;
  }
  for (int c = c0; c < c1; c += W) {
    DeltaPairWalk w;
    w.D = Dk;
    w.S = s.S + std::size_t(c) * Dk;
    w.b1 = h.k + std::size_t(t) * Dk;
    w.c1 = s.carry + c;
    w.decay = !second || !decayed ? WalkDecay::none : vector ? WalkDecay::rows : WalkDecay::scalar;
    w.a_rows = a_next;
    w.a_scalar = second ? scalar_gate(x, h, s.gates, (T - 1) / kTile * kTile - 1, t + 1) : 1.0f;
    w.b2 = h.k + std::size_t(second ? t + 1 : t) * Dk;  // carry2 is 0 without a second token
    w.c2 = s.carry2 + c;
    run_delta_pair_walk(w, x.vec);
  }
  unpack_blocks(s.S, hT, Dk, Dv, W, c0, c1);
}

}  // namespace scan_delta

using namespace scan_delta;

std::size_t scan_delta_forward_floats(const Problem& p) {
  const Ctx x = context(p);
  return std::size_t(scan_split(p, 1, column_blocks(x.Dv, x.W)).threads) * carve(x, nullptr, false).used;
}

void scan_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const Split split = scan_split(p, 1, column_blocks(x.Dv, x.W));
  run_split(
      p, split, carve(x, nullptr, false).used, allocator, [&](float* floats) { return carve(x, floats, false); },
      [&](const Scratch& s, long slice, int b0, int b1) {
        const HeadSlice h = p.slice(std::size_t(slice));
        const Columns v = block_columns(b0, b1, x.W, x.Dv);
        forward_columns(x, head_of(p, h, a.q, a.k, a.v, a.beta, a.g), a.h0 + h.state, v.first, v.last, s,
                        a.o + h.value, nullptr, 0, a.hT + h.state);
      });
}

}  // namespace lattn::cpu

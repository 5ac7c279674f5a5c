// The delta rule's scan on the CPU, float32, forward and backward (docs/spec.md section 1b), for every
// decay and the shapes of section 1c: S'_t = A_t S_{t-1}, u_t = S'_t^T k_t, w_t = beta_t (v_t - u_t),
// S_t = S'_t + k_t w_t^T, o_t = s S_t^T q_t = s (S'_t^T q_t + (q_t . k_t) w_t), S: Dk x Dv, rows
// the key channels, one per slice (Problem::slice: a sequence, or a packed document, and a value
// head), whose q and k rows are read in place from its q/k head.
//
// Over 500 lines: the forward and the backward's four passes share the walks' setup, the tails and
// the scratch carve, and read best together.
//
// Every pass is a sequence of walks (cpu_delta_walk.hpp) over column blocks of a packed state; the
// columns of S (and of G, S^T, G^T) are independent in every pass, so each token (or pair of
// tokens) is walked over every block before the next: a walk cannot start before the previous
// token's tail on its block is done (its pending update needs all of that walk's readouts), and a
// walk on the next block, which needs nothing of it, fills that wait. S and G have Dv columns, S^T
// and G^T Dk.
//
// Forward (one walk per pair of tokens, each row loaded and stored once per pair; the algebra at
// prepare_pairs): the walk for tokens t, t+1 applies the pending updates of t-2 and t-1 with the
// decays between, and reads out S'_t^T of k_t, q_t, a_{t+1} . k_{t+1} and a_{t+1} . q_{t+1}; w_t,
// w_{t+1}, o_t and o_{t+1} follow from them, and a last walk applies the last pair's updates for hT.
//
// Backward, with G_t = dL/dS_t, P_t = dL/dS'_t = G_t - k_t dv_t^T (dv_t = beta_t G_t^T k_t), and
// e_t = v_t - u_t:
//   F1 (S, forward):   e_t, kept in dq's storage until F2 overwrites it (with one value head per
//                      q/k head and Dv <= Dk; otherwise in T x Dv floats of the thread's scratch).
//   R1 (G, reverse):   G_t = A_{t+1} P_{t+1} + s q_t do_t^T; dv_t = beta_t G_t^T k_t; dbeta_t =
//                      (G_t^T k_t) . e_t; dh0 = A_0 P_0. G's recurrence needs no forward state.
//   R2 (G^T, reverse): the same recurrence transposed; dk_t's write part beta_t G_t e_t.
//   F2 (S^T, forward): dk_t's read part -S'_t dv_t (S'^T read out before token t's update) and
//                      dq_t = s S_t do_t.
//   dg from the identity (docs/kernels.md): with the gates' cumulative sums b_t, o and hT depend on
//   them only through q_t . exp(b_t), the write key k_t . exp(-b_t) and the read key k_t .
//   exp(b_t), so dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q . dq - k . dk_write + k . dk_read)_tau,
//   per key channel (the columns of G^T and S^T), in double. The write parts are summed in R2, in
//   reverse: it leaves -sum_{tau >= t} k . dk_write in dg_t and the total in the sums, and F2 adds
//   rowsum(dh0 . h0) + total - sum_{tau < t} (q . dq + k . dk_read) to dg_t.
// No state per token and no checkpoints: the only forward state the backward needs is h0, from
// which F1 and F2 recompute the forward recurrence (2 of the backward's 4 passes). The passes of a
// slice depend on each other's full columns (R2 reads all of dv_t, F2 all of e_t), so the
// backward's threads take whole groups: the value heads of one sequence that share a q/k head, one
// after another, the first writing dq and dk, the later adding theirs (dq and dk of a q/k head
// sum over its value heads), so that no two threads write the same rows. The forward's threads
// take (slice, block of value columns) items as the additive scan's.
#include <omp.h>

#include <algorithm>
#include <initializer_list>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_chunk_products.hpp"
#include "kernels/linear_attention/cpu_delta.hpp"
#include "kernels/linear_attention/cpu_delta_walk.hpp"
#include "kernels/linear_attention/cpu_scan_split.hpp"

namespace lattn::cpu {
namespace {

constexpr int kTile = 64;  // tokens per tile: 64 tokens of ~5 row operands of D = 128 are 160 KiB, in L2
constexpr int kPairs = kTile / 2;  // the forward's pairs of tokens per tile

struct Ctx {
  Vec vec;
  int Dk, Dv, W;
  int Dkp, Dvp;  // Dk, Dv rounded up to W
  int gw;        // gate floats per token in the tile buffer
  Decay decay;
  float s;
  // Where the backward keeps e_t: in dq (false), or in T x Dv floats of the thread's scratch, T the
  // longest slice's tokens (e_tokens).
  bool e_scratch;
  int e_tokens;
};

int longest_slice(const Problem& p) {
  int most = 0;
  for (int n = 0; n < p.sequences(); ++n) most = std::max(most, p.slice(std::size_t(n) * p.heads).seq);
  return most;
}

Ctx context(const Problem& p) {
  Ctx x;
  x.vec = active_vec();
  x.Dk = p.dim;
  x.Dv = p.value_dim();
  x.W = delta_walk_width(x.vec);
  x.Dkp = (x.Dk + x.W - 1) / x.W * x.W;
  x.Dvp = (x.Dv + x.W - 1) / x.W * x.W;
  x.gw = p.decay == Decay::vector ? x.Dkp : p.decay == Decay::scalar ? 1 : 0;
  x.decay = p.decay;
  x.s = float(attention_scale(p.dim));
  x.e_scratch = p.group() > 1 || x.Dv > x.Dk;
  x.e_tokens = x.e_scratch ? longest_slice(p) : 0;
  return x;
}

// One thread's buffers, carved from its block (base null: only counted).
struct Scratch {
  double* dg_acc;  // Dkp: dg's running sums per key channel
  float *S, *ST;   // packed states, Dk x Dvp and (backward only) Dv x Dkp
  float *gates;    // exp(g) of a tile's tokens and the ones before and after it, (kTile + 2) x gw
  float *stage;    // e of a tile's tokens, kTile x Dv (backward only)
  float *carry, *carry2;  // Dvp each: the pending updates' column operands of each block
  float *c1, *c2, *y1, *y2, *y3, *y4;  // W each
  float* qk;       // kTile: q_t . k_t (forward)
  // The forward's pairs (prepare_pairs), kPairs of each: a_{t-1} a_t (vector gates), a_t . k_{t-1},
  // a_{t+1} . k_{t+1}, a_{t+1} . q_{t+1} (Dk floats each), and three scalars (a_{t-1} a_t for scalar
  // decays, k_t . (a_{t+1} . k_{t+1}), k_t . (a_{t+1} . q_{t+1})).
  float *pair_a, *pair_b2, *pair_k, *pair_q, *pair_decay, *pair_kk, *pair_kq;
  float* e;        // e_tokens x Dv: e_t (backward, Ctx::e_scratch)
  std::size_t used = 0;
};

Scratch carve(const Ctx& x, float* base, bool backward) {
  Scratch s;
  auto take = [&](std::size_t n) {
    float* out = base ? base + s.used : nullptr;
    s.used += n;
    return out;
  };
  const std::size_t Dk = x.Dk, Dv = x.Dv, Dkp = x.Dkp, Dvp = x.Dvp, W = x.W;
  s.dg_acc = reinterpret_cast<double*>(take(backward && x.gw ? 2 * Dkp : 0));
  s.S = take(Dk * Dvp);
  s.ST = take(backward ? Dv * Dkp : 0);
  s.gates = take(std::size_t(kTile + 2) * x.gw);
  s.stage = take(backward ? kTile * Dv : 0);
  s.carry = take(Dvp);
  s.carry2 = take(Dvp);
  for (float** p : {&s.c1, &s.c2, &s.y1, &s.y2, &s.y3, &s.y4}) *p = take(W);
  s.qk = take(kTile);
  s.pair_a = take(x.decay == Decay::vector ? std::size_t(kPairs) * Dk : 0);
  for (float** p : {&s.pair_b2, &s.pair_k, &s.pair_q}) *p = take(std::size_t(kPairs) * Dk);
  for (float** p : {&s.pair_decay, &s.pair_kk, &s.pair_kq}) *p = take(kPairs);
  s.e = take(backward ? std::size_t(x.e_tokens) * Dv : 0);
  s.used = (s.used + 15) / 16 * 16;  // each thread's block on its own cache line
  return s;
}

// Columns [c0, c1) of a rows x cols matrix (src [rows][cols], or with `transposed` the transpose
// of src [cols][rows]) into blocks of W columns, zero-padded: block c / W at dst + c * rows, row i
// at i * W.
void pack_blocks(const float* src, bool transposed, float* dst, int rows, int cols, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    float* blk = dst + std::size_t(c) * rows;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < W; ++j)
        blk[std::size_t(i) * W + j] = c + j >= cols ? 0.0f
                                      : transposed   ? src[std::size_t(c + j) * rows + i]
                                                     : src[std::size_t(i) * cols + c + j];
  }
}

void unpack_blocks(const float* src, float* dst, int rows, int cols, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    const float* blk = src + std::size_t(c) * rows;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < std::min(W, cols - c); ++j)
        dst[std::size_t(i) * cols + c + j] = blk[std::size_t(i) * W + j];
  }
}

// W floats of x (n of them) from column c, scaled, zero past the last.
void padded(float* out, const float* x, float scale, int n, int W, int c) {
  for (int j = 0; j < W; ++j) out[j] = c + j < n ? scale * x[c + j] : 0.0f;
}

// One slice's inputs.
struct Head {
  const float *q, *k, *v, *beta, *g;  // g: this slice's log-gates, or null
  float gamma;                         // retnet's (1 otherwise)
  int T;
};

Head head_of(const Problem& p, const HeadSlice& h, const float* q, const float* k, const float* v,
             const float* beta, const float* g) {
  return {q + h.key, k + h.key, v + h.value, beta + h.beta, g ? g + h.gate : nullptr,
          float(decay_gamma(p.decay, h.head)), h.seq};
}

// exp(g) of tokens [first, first + count) (those before T) into the tile buffer.
void take_gates(const Ctx& x, const Head& h, float* buf, int first, int count) {
  if (!x.gw) return;
  const int last = std::min(h.T, first + count), width = x.decay == Decay::vector ? x.Dk : 1;
  for (int t = first; t < last; ++t) {
    const float* g = h.g + std::size_t(t) * width;
    float* out = buf + std::size_t(t - first) * x.gw;
#pragma omp simd
    for (int d = 0; d < width; ++d) out[d] = exp_nonpositive(g[d]);
    for (int d = width; d < x.gw; ++d) out[d] = 0.0f;
  }
}

// A_t on a walk over block c of S or G (rows: the key channels) or of S^T or G^T (columns); no
// decay for t past the last token (the first step of a reverse pass). buf holds tokens from first.
void set_decay(const Ctx& x, const Head& h, const float* buf, int first, int t, int c, bool transposed, DeltaWalk& w) {
  w.decay = WalkDecay::none;
  if (t >= h.T) return;
  switch (x.decay) {
    case Decay::none: return;
    case Decay::retnet:
      w.decay = WalkDecay::scalar;
      w.a_scalar = h.gamma;
      return;
    case Decay::scalar:
      w.decay = WalkDecay::scalar;
      w.a_scalar = buf[t - first];
      return;
    case Decay::vector:
      w.decay = transposed ? WalkDecay::columns : WalkDecay::rows;
      if (transposed) w.a_cols = buf + std::size_t(t - first) * x.gw + c;
      else w.a_rows = buf + std::size_t(t - first) * x.gw;
      return;
  }
}

// The decay's factor of token t on every key channel, for scalar decays (1 for none and t < 0).
float scalar_gate(const Ctx& x, const Head& h, const float* buf, int first, int t) {
  if (t < 0) return 1.0f;
  switch (x.decay) {
    case Decay::retnet: return h.gamma;
    case Decay::scalar: return buf[t - first];
    default: return 1.0f;
  }
}

// The pairs of tokens [t0, t0 + n): their operands (above) into the scratch, and q_t . k_t into
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

// The forward recurrence on value columns [c0, c1) of one slice from h0: o (when given), e_t = v_t -
// u_t (when given, rows e_step apart) and hT (when given).
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

// R1's tail on a block's m columns: dv = beta G^T k (y3), the carry -dv that the next walk applies,
// and dbeta's part y3 . e. Restrict-qualified, with the sum a reduction, so that it vectorises (as
// a loop over dv and the carry, which might alias, and an ordered float sum it ran scalar).
float dv_tail(const float* __restrict y3, const float* __restrict e, float beta, float* __restrict dv,
              float* __restrict carry, int m) {
  float db = 0.0f;
#pragma omp simd reduction(+ : db)
  for (int j = 0; j < m; ++j) {
    const float d = beta * y3[j];
    dv[j] = d;
    carry[j] = -d;
    db += y3[j] * e[j];
  }
  return db;
}

// The per-token tails of R2 and F2 on one block's m columns (c onwards): plain loops over
// restrict-qualified rows, one per case, so that they vectorise (with the branches and the
// possible aliasing of dk, dg and the sums inside one loop they ran scalar, a sizeable share of a
// walk of D rows). dg's sums stay in double.

// out = scale x, or out += scale x (the first value head of a group stores, the later ones add).
void store_scaled(float* __restrict out, const float* __restrict x, float scale, int m) {
#pragma omp simd
  for (int j = 0; j < m; ++j) out[j] = scale * x[j];
}

void add_scaled(float* __restrict out, const float* __restrict x, float scale, int m) {
#pragma omp simd
  for (int j = 0; j < m; ++j) out[j] += scale * x[j];
}

// R2: dk's write part beta_t G_t e_t (the group's first value head stores it, later ones add it),
// and -sum_{tau >= t} k . dk_write in dg_t.
void write_tail(const Ctx& x, float beta, const float* __restrict y3, const float* __restrict k, bool first,
                float* __restrict dk, float* dg, int t, int c, int m, double* __restrict acc) {
  if (first) store_scaled(dk, y3, beta, m);
  else add_scaled(dk, y3, beta, m);
  if (!dg) return;
  if (x.decay == Decay::vector) {
    float* __restrict g = dg + std::size_t(t) * x.Dk + c;
#pragma omp simd
    for (int j = 0; j < m; ++j) {
      acc[j] += double(k[j]) * double(beta * y3[j]);
      g[j] = float(-acc[j]);
    }
    return;
  }
  double part = 0;
#pragma omp simd reduction(+ : part)
  for (int j = 0; j < m; ++j) {
    acc[j] += double(k[j]) * double(beta * y3[j]);
    part += acc[j];
  }
  dg[t] = float(c == 0 ? -part : dg[t] - part);
}

// F2: dq_t = s S_t do_t (stored or added as dk above), dk's read part, and dg_t's remaining terms.
void read_tail(const Ctx& x, const float* __restrict y1, const float* __restrict y3, const float* __restrict q,
               const float* __restrict k, bool first, float* __restrict dq, float* __restrict dk, float* dg, int t,
               int c, int m, double* __restrict acc) {
  const float s = x.s;
  if (first) store_scaled(dq, y3, s, m);
  else add_scaled(dq, y3, s, m);
#pragma omp simd
  for (int j = 0; j < m; ++j) dk[j] -= y1[j];
  if (!dg) return;
  if (x.decay == Decay::vector) {
    float* __restrict g = dg + std::size_t(t) * x.Dk + c;
#pragma omp simd
    for (int j = 0; j < m; ++j) {
      g[j] = float(acc[j] + double(g[j]));
      acc[j] -= double(q[j]) * double(s * y3[j]) - double(k[j]) * double(y1[j]);
    }
    return;
  }
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int j = 0; j < m; ++j) {
    total += acc[j];
    acc[j] -= double(q[j]) * double(s * y3[j]) - double(k[j]) * double(y1[j]);
  }
  dg[t] = float(dg[t] + total);
}

int backward_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices() / std::size_t(p.group())));
}

// The backward of one slice; `first`: the first value head of its group (it writes dq and dk,
// the later ones add to them).
void backward_slice(const Ctx& x, const Problem& p, const HeadSlice& slice, bool first, const BackwardArgs<float>& a,
                    const Scratch& s) {
  const int Dk = x.Dk, Dv = x.Dv, W = x.W, T = slice.seq;
  const Head h = head_of(p, slice, a.q, a.k, a.v, a.beta, a.g);
  const float* dO = a.dO + slice.value;
  float *dq = a.dq + slice.key, *dk = a.dk + slice.key, *dv = a.dv + slice.value, *dbeta = a.dbeta + slice.beta;
  float* dg = a.dg ? a.dg + slice.gate : nullptr;
  const float *h0 = a.h0 + slice.state, *dhT = a.dhT + slice.state;
  float* dh0 = a.dh0 + slice.state;
  // e_t, until F2 writes dq over it (or in scratch).
  float* E = x.e_scratch ? s.e : dq;
  const std::size_t e_step = x.e_scratch ? Dv : Dk;

  forward_columns(x, h, h0, 0, Dv, s, nullptr, E, e_step, nullptr);  // F1

  // R1 and R2, a tile of tokens at a time in reverse: R1 on every block (dv of the tile complete),
  // then R2, which reads all of dv_{t+1}.
  pack_blocks(dhT, false, s.S, Dk, Dv, W, 0, Dv);
  pack_blocks(dhT, true, s.ST, Dv, Dk, W, 0, Dk);
  std::fill_n(s.carry, x.Dvp, 0.0f);  // -dv_{t+1} of each block
  if (dg) std::fill_n(s.dg_acc, Dk, 0.0);
  for (int t1 = T; t1 > 0; t1 -= kTile) {
    const int t0 = std::max(0, t1 - kTile);
    take_gates(x, h, s.gates, t0 + 1, t1 - t0);  // A_{t+1}
    for (int t = t1 - 1; t >= t0; --t)
      for (int c = 0; c < Dv; c += W) {
        const int m = std::min(W, Dv - c);
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        DeltaWalk w;
        w.D = Dk;
        w.S = s.S + std::size_t(c) * Dk;
        w.b1 = h.k + (t + 1 < T ? rk + Dk : rk);  // the carry is 0 at T - 1
        w.c1 = s.carry + c;
        set_decay(x, h, s.gates, t0 + 1, t + 1, c, false, w);
        padded(s.c2, dO + rv, x.s, Dv, W, c);
        w.b2 = h.q + rk;
        w.c2 = s.c2;
        w.x3 = h.k + rk;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        const float db = dv_tail(s.y3, E + std::size_t(t) * e_step + c, h.beta[t], dv + rv + c, s.carry + c, m);
        dbeta[t] = c == 0 ? db : dbeta[t] + db;
      }
    for (int t = t1 - 1; t >= t0; --t)
      for (int c = 0; c < Dk; c += W) {
        const int m = std::min(W, Dk - c);
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        const bool last = t + 1 == T;
        DeltaWalk w;
        w.D = Dv;
        w.S = s.ST + std::size_t(c) * Dv;
        w.b1 = dv + (last ? rv : rv + Dv);
        if (last)
          std::fill_n(s.c1, W, 0.0f);
        else
          padded(s.c1, h.k + rk + Dk, -1.0f, Dk, W, c);
        w.c1 = s.c1;
        set_decay(x, h, s.gates, t0 + 1, t + 1, c, true, w);
        padded(s.c2, h.q + rk, x.s, Dk, W, c);
        w.b2 = dO + rv;
        w.c2 = s.c2;
        w.x3 = E + std::size_t(t) * e_step;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        write_tail(x, h.beta[t], s.y3, h.k + rk + c, first, dk + rk + c, dg, t, c, m, s.dg_acc + c);
      }
  }
  // dh0 = A_0 P_0: token 0's pending update and its decay.
  take_gates(x, h, s.gates, 0, 1);
  for (int c = 0; c < Dv; c += W) {
    DeltaWalk w;
    w.D = Dk;
    w.S = s.S + std::size_t(c) * Dk;
    w.b1 = h.k;
    w.c1 = s.carry + c;
    set_decay(x, h, s.gates, 0, 0, c, false, w);
    run_delta_walk(w, x.vec);
  }
  unpack_blocks(s.S, dh0, Dk, Dv, W, 0, Dv);

  // F2 on S^T from h0^T; dg's sums, the write parts' total, take rowsum(dh0 . h0).
  if (dg)
    for (int i = 0; i < Dk; ++i) {
      double sum = 0;
      for (int j = 0; j < Dv; ++j) sum += double(dh0[std::size_t(i) * Dv + j]) * h0[std::size_t(i) * Dv + j];
      s.dg_acc[i] += sum;
    }
  pack_blocks(h0, true, s.ST, Dv, Dk, W, 0, Dk);
  for (int t0 = 0; t0 < T; t0 += kTile) {
    const int n = std::min(kTile, T - t0);
    for (int u = 0; u < n; ++u) std::copy_n(E + std::size_t(t0 + u) * e_step, Dv, s.stage + std::size_t(u) * Dv);
    take_gates(x, h, s.gates, t0, n);
    for (int t = t0; t < t0 + n; ++t)
      for (int c = 0; c < Dk; c += W) {
        const int m = std::min(W, Dk - c);
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        DeltaWalk w;
        w.D = Dv;
        w.S = s.ST + std::size_t(c) * Dv;
        set_decay(x, h, s.gates, t0, t, c, true, w);
        w.x1 = dv + rv;
        w.y1 = s.y1;
        padded(s.c2, h.k + rk, h.beta[t], Dk, W, c);
        w.b2 = s.stage + std::size_t(t - t0) * Dv;
        w.c2 = s.c2;
        w.x3 = dO + rv;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        read_tail(x, s.y1, s.y3, h.q + rk + c, h.k + rk + c, first, dq + rk + c, dk + rk + c, dg, t, c, m,
                  s.dg_acc + c);
      }
  }
}

}  // namespace

std::size_t scan_delta_forward_floats(const Problem& p) {
  const Ctx x = context(p);
  return std::size_t(scan_split(p, 1, column_blocks(x.Dv, x.W)).threads) * carve(x, nullptr, false).used;
}

std::size_t scan_delta_backward_floats(const Problem& p) {
  return std::size_t(backward_threads(p)) * carve(context(p), nullptr, true).used;
}

void scan_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const Split split = scan_split(p, 1, column_blocks(x.Dv, x.W));
  const std::size_t per_thread = carve(x, nullptr, false).used;
  Workspace<float> scratch(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
  {
    const Scratch s = carve(x, scratch.data() + omp_get_thread_num() * per_thread, false);
    for_each_share(p, split, [&](long slice, int b0, int b1) {
      const HeadSlice h = p.slice(std::size_t(slice));
      const Columns v = block_columns(b0, b1, x.W, x.Dv);
      forward_columns(x, head_of(p, h, a.q, a.k, a.v, a.beta, a.g), a.h0 + h.state, v.first, v.last, s,
                      a.o + h.value, nullptr, 0, a.hT + h.state);
    });
  }
}

void scan_delta_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const int threads = backward_threads(p), group = p.group();
  const long groups = long(p.slices()) / group;
  const std::size_t per_thread = carve(x, nullptr, true).used;
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Scratch s = carve(x, scratch.data() + omp_get_thread_num() * per_thread, true);
#pragma omp for schedule(dynamic, 1)
    for (long unit = 0; unit < groups; ++unit)
      for (int member = 0; member < group; ++member)
        backward_slice(x, p, p.slice(std::size_t(unit) * group + member), member == 0, a, s);
  }
}

}  // namespace lattn::cpu

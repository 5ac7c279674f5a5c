// The delta rule's scan on the CPU, float32, forward and backward (docs/spec.md section 1b), for every
// decay and the shapes of section 1c: S'_t = A_t S_{t-1}, u_t = S'_t^T k_t, w_t = beta_t (v_t - u_t),
// S_t = S'_t + k_t w_t^T, o_t = s S_t^T q_t = s (S'_t^T q_t + (q_t . k_t) w_t), S: Dk x Dv, rows
// the key channels, one per slice (Problem::slice: a sequence, or a packed document, and a value
// head), whose q and k rows are read in place from its q/k head.
//
// This file: the method (below), what the forward and the backward share (declared in
// cpu/scan/scan_delta_parts.hpp), and the backward; the forward's pairs of tokens and its recurrence,
// which the backward runs again as F1, are in cpu/scan/scan_delta_forward.cpp.
//
// Every pass is a sequence of walks (cpu/scan/delta_walk.hpp) over column blocks of a packed state; the
// columns of S (and of G, S^T, G^T) are independent in every pass, so each token (or pair of
// tokens) is walked over every block before the next: a walk cannot start before the previous
// token's tail on its block is done (its pending update needs all of that walk's readouts), and a
// walk on the next block, which needs nothing of it, fills that wait. S and G have Dv columns, S^T
// and G^T Dk.
//
// Forward (one walk per pair of tokens, each row loaded and stored once per pair; the algebra in
// cpu/scan/scan_delta_forward.cpp): the walk for tokens t, t+1 applies the pending updates of t-2 and t-1 with the
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

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/delta.hpp"
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"
#include "kernels/linear_attention/cpu/scan/scan_delta_parts.hpp"

namespace lattn::cpu {
namespace scan_delta {
namespace {

int longest_slice(const Problem& p) {
  int most = 0;
  for (int n = 0; n < p.sequences(); ++n) most = std::max(most, p.slice(std::size_t(n) * p.heads).seq);
  return most;
}

}  // namespace

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

Head head_of(const Problem& p, const HeadSlice& h, const float* q, const float* k, const float* v,
             const float* beta, const float* g) {
  return {q + h.key, k + h.key, v + h.value, beta + h.beta, g ? g + h.gate : nullptr,
          float(decay_gamma(p.decay, h.head)), h.seq};
}

// exp(g) of tokens [first, first + count) (those before T) into the tile buffer.
void take_gates(const Ctx& x, const Head& h, float* buf, int first, int count) {
  if (x.gw) take_exp_gates(h.g, h.T, x.decay == Decay::vector ? x.Dk : 1, x.gw, buf, first, count);
}

}  // namespace scan_delta

namespace {

using namespace scan_delta;

// W floats of x (n of them) from column c, scaled, zero past the last.
void padded(float* out, const float* x, float scale, int n, int W, int c) {
  for (int j = 0; j < W; ++j) out[j] = c + j < n ? scale * x[c + j] : 0.0f;
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

using namespace scan_delta;

std::size_t scan_delta_backward_floats(const Problem& p) {
  return std::size_t(backward_threads(p)) * carve(context(p), nullptr, true).used;
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

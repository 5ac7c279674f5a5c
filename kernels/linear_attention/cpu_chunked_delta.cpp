// The delta rule's chunked form on the CPU (docs/spec.md section 1b), float32, forward and backward, every
// decay, in the WY / UT-transform representation (DeltaNet: Yang et al. 2024; with gates, Gated
// DeltaNet: Yang, Kautz, Hatamizadeh 2025), on every shape of docs/spec.md section 1c.
// Over 500 lines: forward and backward share the gates' operands, the scores and the solve, and
// read best side by side.
//
// Per chunk of n rows with S the Dk x Dv state entering it and b_i the cumulative log-gates from the
// chunk's start (per key channel for vector gates; none and retnet are scalar gates 0 and log
// gamma), write Gi = exp(b_i) and, for m <= i, the gated scores
//   A_qk[i][m] = q_i . exp(b_i - b_m) . k_m,   A_kk[i][m] = k_i . exp(b_i - b_m) . k_m (m < i only).
// Token m's pending value w_m = beta_m (v_m - S'_m^T k_m) and S'_m = Gm S + sum_{l<m} exp(b_m - b_l) k_l w_l^T
// give (I + diag(beta) A_kk) W = diag(beta) (V - (K . G) S), a unit lower-triangular system of size
// n; with T = (I + diag(beta) A_kk)^-1 (forward substitution, once per chunk):
//   E = V - (K . G) S,   W = T diag(beta) E,   O = s ((Q . G) S + A_qk W)
//   S_next = exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W
// The scores, T and the gates are Dk wide (key channels); E, W, O and the state's columns are Dv
// wide (value columns). Every gate factor is exp of a difference <= 0 (formed in double where the
// gated form does), so strong gates stay finite. Scalar gates make exp(b_i - b_m) a mask the tile
// products apply; vector gates cannot be a mask (the factor is per channel inside the dot product):
// their scores come from lane_scores (cpu_chunk_products.hpp: a running product of exp(g), the rows
// in the vector lanes) and the scores' gradients are summed pair by pair (the gated form's products
// between sub-chunks are not used here yet: docs/kernels.md).
//
// Backward, walking the chunks in reverse with dS the gradient of the state leaving the chunk:
//   dW    = s A_qk^T dO + (K . exp(b_{n-1} - b)) dS
//   dR    = T^T dW                 (R = diag(beta) E, the system's right-hand side)
//   dV    = diag(beta) dR,   dbeta_i = E_i . dR_i + sum_{m<i} dM_im A_kk[i][m],   dM = -dR W^T
//   dP_qk = s dO W^T,   dP_kk = diag(beta) dM   (strictly lower), both times the mask for scalar gates
//   dQ    = G . s dO S^T + dP_qk K-side,   dK_read = G . (-dV S^T) + dP_kk row side,
//   dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_kk^T and dP_qk^T sides
//   dS   <- exp(b_{n-1}) dS + s (Q . G)^T dO - (K . G)^T dV
//   dg_i  = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau
// (dS_c, S_c: the chunk's entering state and its gradient; the scan's identity, cpu_scan_delta.cpp,
// applied to the chunk's tokens).
//
// Items and shapes. An item is one (sequence, value head) pair, Problem::slice: its q/k rows are
// those of its q/k head, read in place (never copied), and a packed batch's documents are items of
// their own, each from its own h0 to its own hT. The forward's items are independent. In the
// backward a q/k head's dq and dk are the sums over the value heads it serves. Where items
// (sequence, q/k head) take no more rounds of the schedule than the value heads apart would (they
// fill every thread, evenly), one thread runs the group's value heads one after another, the first
// writing dq and dk and the rest adding (a member's own dq goes through a chunk-sized buffer first:
// its dg needs q . dq of that member alone). Otherwise the items stay (sequence, value head) and the
// value heads after a group's first write into partial copies of dq and dk (2 (G - 1) copies of q's
// size), summed into them once every item is done. Packed documents are taken longest first, so
// that the dynamic schedule ends on short items.
//
// A document's chunks start at its first token, every p.chunk tokens: a chunk never straddles two
// documents, and a document whose length is not a multiple of the chunk ends in a short chunk of
// n < C rows, run as it is (nothing is padded, no rows are masked). Its scores and T are n x n and
// its products n rows deep (the tile products still work in tiles of 8 rows and panels of 32
// columns); what does not shrink with n is the chunk's state work: the O(Dk Dv) copies (the kept
// state, and in the backward the transposes of S and dS) and the state update's full Dk x Dv
// output. So over the same tokens unpacked, a packed batch pays at most one extra chunk of state
// work per document and value head (its short chunk), plus its h0 and hT.
//
// The states entering the chunks are kept by the forward (packed S, per item at the item's offset)
// or recomputed by the backward.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_chunk_products.hpp"
#include "kernels/linear_attention/cpu_delta.hpp"

namespace lattn::cpu {
namespace {

using tile::kNR;
using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::seg;

std::size_t lines(std::size_t floats) { return (floats + 15) / 16 * 16; }

// The sizes every item of a problem shares.
struct Shape {
  int Dk = 0, Dv = 0;  // key channels, value columns
  int C = 0;           // rows of the buffers' chunk: p.chunk, or the longest sequence when shorter
  int L = 0;           // score_ld(C)
  int chunks = 0;      // the most chunks an item has
  std::size_t SF = 0;  // floats of one packed Dk x P(Dv) state
};

int longest_sequence(const Problem& p) {
  if (!p.packed()) return p.seq;
  int most = 0;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) most = std::max(most, p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  return most;
}

int chunks_of(int seq, int chunk) { return (seq + chunk - 1) / chunk; }

Shape shape_of(const Problem& p) {
  Shape s;
  s.Dk = p.dim;
  s.Dv = p.value_dim();
  const int longest = longest_sequence(p);
  s.C = std::max(1, std::min(p.chunk, longest));
  s.L = score_ld(s.C);
  s.chunks = chunks_of(longest, p.chunk);
  s.SF = std::size_t(s.Dk) * panel_cols(s.Dv);
  return s;
}

// One thread's buffers, carved from its block; with base null, carve only counts.
struct Buffers {
  double *b, *sums;                    // cumulative log-gates, C x gw; dg's sums, Dk
  float *a, *EQ, *EK, *decay, *row;    // exp(g), exp(b), exp(b_{n-1} - b): C x gw; Dk; Dk (vector gates' pair factors)
  float *mask, *ones, *Aqk, *Akk, *T;  // C x score_ld
  float *Qx, *Kx, *Ke;                 // vector gates: Q . G, K . G, K . exp(b_{n-1} - b), C x Dk
  float *X, *R, *Wm;                   // C x Dv: (K . G) S then E; R; W
  float *Bp, *WTp;                     // K^T panels Dk x P(C), W^T panels Dv x P(C)
  float *Rp, *Wp, *Wep;                // C x P(Dv) panels
  float *Sp;                           // packed state, Dk x P(Dv)
  float *lanes;                        // vector gates: 2 x Dk x kLaneRows, the scores' rows in lanes
  // backward
  float *dPqk, *dPkk;                  // C x score_ld
  float *dW, *dKr, *dKw;               // C x Dv; C x Dk; C x Dk
  float *Kp, *Qp, *dOp, *Zp;           // C x P(Dk); C x P(Dk); C x P(Dv); C x P(Dv)
  float *STp, *dSp, *dSTp, *states;    // Dv x P(Dk), Dk x P(Dv), Dv x P(Dk); states: chunks of them, when recomputed
  float *dQ;                           // C x Dk: a group member's own dq, when members add into a shared dq
  std::size_t used = 0;
};

Buffers carve(const Problem& p, float* base, bool backward, bool own_states, bool own_dq) {
  const Shape s = shape_of(p);
  const std::size_t C = s.C, Dk = s.Dk, Dv = s.Dv, L = s.L;
  const bool vector = p.decay == Decay::vector;
  const std::size_t gw = vector ? Dk : 1, PK = panel_cols(s.Dk), PV = panel_cols(s.Dv), PC = panel_cols(s.C);
  Buffers b{};
  auto take = [&](std::size_t n) {
    float* out = base ? base + b.used : nullptr;
    b.used += n;
    return out;
  };
  auto take_doubles = [&](std::size_t n) { return reinterpret_cast<double*>(take(2 * n)); };
  b.b = take_doubles(C * gw);
  b.sums = take_doubles(Dk);
  b.a = take(vector ? C * Dk : 0);
  for (float** x : {&b.EQ, &b.EK}) *x = take(C * gw);
  for (float** x : {&b.decay, &b.row}) *x = take(Dk);
  b.mask = take(vector ? 0 : C * L);
  b.ones = take(vector ? C * L : 0);
  for (float** x : {&b.Aqk, &b.Akk, &b.T}) *x = take(C * L);
  for (float** x : {&b.Qx, &b.Kx, &b.Ke}) *x = take(vector ? C * Dk : 0);
  for (float** x : {&b.X, &b.R, &b.Wm}) *x = take(C * Dv);
  b.Bp = take(Dk * PC);
  b.WTp = take(Dv * PC);
  for (float** x : {&b.Rp, &b.Wp, &b.Wep}) *x = take(C * PV);
  b.Sp = take(s.SF);
  b.lanes = take(vector ? 2 * Dk * kLaneRows : 0);
  if (backward) {
    for (float** x : {&b.dPqk, &b.dPkk}) *x = take(C * L);
    b.dW = take(C * Dv);
    for (float** x : {&b.dKr, &b.dKw}) *x = take(C * Dk);
    for (float** x : {&b.Kp, &b.Qp}) *x = take(C * PK);
    for (float** x : {&b.dOp, &b.Zp}) *x = take(C * PV);
    b.STp = take(Dv * PK);
    b.dSp = take(s.SF);
    b.dSTp = take(Dv * PK);
    b.states = take(own_states ? std::size_t(s.chunks) * s.SF : 0);
    b.dQ = take(own_dq ? C * Dk : 0);
  }
  b.used = lines(b.used);  // each thread's block on a cache line (and its doubles aligned)
  return b;
}

// Y = beta Y + alpha X^T Z for a packed Dk x Dv state Y, X (n x Dk rows), Z packed n x P(Dv) panels.
void state_product(float* Yp, int Dk, int Dv, int n, const float* X, const float* Zp, float alpha, float beta) {
  Product u = rows_product(Yp, kNR, Dk, Dv, seg(Range::full, n, X, 1, Dk, Zp), alpha);
  u.cps = long(Dk) * kNR;
  u.beta = beta;
  tile::run(u);
}

// Row d of a packed Dk x Dv state times w[d].
void scale_state_rows(float* Yp, int Dk, int Dv, const float* w) {
  for (int panel = 0; panel < panel_cols(Dv) / kNR; ++panel)
    for (int d = 0; d < Dk; ++d) {
      float* row = Yp + (std::size_t(panel) * Dk + d) * kNR;
#pragma omp simd
      for (int j = 0; j < kNR; ++j) row[j] *= w[d];
    }
}

// Panels of X^T (Dv x P(Dk)) from the panels of a packed Dk x Dv matrix X, padding zero.
void transpose_state(const float* Xp, int Dk, int Dv, float* dst) {
  if (Dk == Dv) return tile::transpose_packed(Xp, Dk, dst);
  for (int q = 0; q < Dk; q += kNR)  // a panel of dst: rows q .. q + 31 of X
    for (int k = 0; k < Dv; ++k) {   // its row k: column k of X
      float* __restrict row = dst + std::size_t(q / kNR) * Dv * kNR + std::size_t(k) * kNR;
      const float* column = Xp + std::size_t(k / kNR) * Dk * kNR + k % kNR;
      const int width = std::min(kNR, Dk - q);
      for (int j = 0; j < width; ++j) row[j] = column[std::size_t(q + j) * kNR];
      std::fill(row + width, row + kNR, 0.0f);
    }
}

// One chunk of one item: its tokens' rows and gates.
struct Chunk {
  int n;
  const float *q, *k, *v, *beta, *g;  // g: the chunk's log-gates (scalar or vector decays), else null
  float log_gamma;                    // retnet's log gamma (0 for none)
};

// b, exp(g), G = exp(b), exp(b_{n-1} - b), exp(b_{n-1}); the mask exp(b_i - b_m) for scalar
// gates (none and retnet as constant log-gates), Q . G, K . G, K . exp(b_{n-1} - b) for vector gates.
void gate_operands(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int D = s.Dk, n = c.n, C = s.C, L = s.L;
  if (p.decay != Decay::vector) {
    double sum = 0;
    for (int i = 0; i < n; ++i) B.b[i] = sum += c.g ? double(c.g[i]) : double(c.log_gamma);
    const double last = B.b[n - 1];
    for (int i = 0; i < n; ++i) {
      B.EQ[i] = exp_nonpositive(float(B.b[i]));
      B.EK[i] = exp_nonpositive(float(last - B.b[i]));
      float* row = B.mask + std::size_t(i) * L;
      const double bi = B.b[i];
#pragma omp simd
      for (int m = 0; m <= i; ++m) row[m] = float(bi - B.b[m]);
      exp_in_place(row, i + 1);
      std::fill(row + i + 1, row + C, 0.0f);
    }
    std::fill_n(B.decay, D, exp_nonpositive(float(last)));
    return;
  }
  for (int d = 0; d < D; ++d) B.b[d] = c.g[d];
  for (int i = 1; i < n; ++i) {
    double* bi = B.b + std::size_t(i) * D;
    const float* gi = c.g + std::size_t(i) * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) bi[d] = bi[d - D] + gi[d];
  }
  std::copy_n(c.g, std::size_t(n) * D, B.a);
  exp_in_place(B.a, n * D);
  const double* last = B.b + std::size_t(n - 1) * D;
  exp_of_difference(B.decay, last, nullptr, D);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    exp_of_difference(B.EQ + o, B.b + o, nullptr, D);
    exp_of_difference(B.EK + o, last, B.b + o, D);
    float *__restrict Qx = B.Qx + o, *__restrict Kx = B.Kx + o, *__restrict Ke = B.Ke + o;
    const float *__restrict eq = B.EQ + o, *__restrict ek = B.EK + o, *__restrict q = c.q + o, *__restrict k = c.k + o;
#pragma omp simd
    for (int d = 0; d < D; ++d) {
      Qx[d] = q[d] * eq[d];
      Kx[d] = k[d] * eq[d];
      Ke[d] = k[d] * ek[d];
    }
  }
}

// A_qk (times alpha, on and below the diagonal) and A_kk (strictly below), zero above in every row
// the products may read.
void scores(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float alpha) {
  const int D = s.Dk, n = c.n, C = s.C, L = s.L;
  if (p.decay != Decay::vector) {
    tile::pack(c.k, D, true, D, n, nullptr, B.Bp);
    for (const auto& [out, x, scale] : {std::tuple{B.Aqk, c.q, alpha}, std::tuple{B.Akk, c.k, 1.0f}}) {
      Product u = rows_product(out, L, n, n, seg(Range::full, D, x, D, 1, B.Bp), scale);
      u.mask = B.mask;
      u.ldm = L;
      u.mask_all = true;
      u.lower = true;
      tile::run(u);
    }
    for (int i = 0; i < n; ++i) B.Akk[std::size_t(i) * L + i] = 0.0f;
    return;
  }
  // Rows in blocks of kLaneRows, each against every column up to its last row.
  for (int i0 = 0; i0 < n; i0 += kLaneRows)
    lane_scores<2>(D, i0, std::min(n, i0 + kLaneRows), 0, c.k, B.a, {c.q, c.k}, {alpha, 1.0f}, {B.Aqk, B.Akk}, L,
                   B.lanes);
  for (int i = 0; i < n; ++i) {
    std::fill(B.Aqk + std::size_t(i) * L + i + 1, B.Aqk + std::size_t(i) * L + C, 0.0f);
    std::fill(B.Akk + std::size_t(i) * L + i, B.Akk + std::size_t(i) * L + C, 0.0f);  // A_kk: strictly lower
  }
}

// T = (I + diag(beta) A_kk)^-1 by forward substitution, row i = e_i - beta_i sum_{m<i} A_kk[i][m] row m;
// zero above the diagonal.
void invert(const Buffers& B, const Shape& s, const Chunk& c) {
  const int n = c.n, C = s.C, L = s.L;
  for (int i = 0; i < n; ++i) {
    float* __restrict row = B.T + std::size_t(i) * L;
    std::fill(row, row + C, 0.0f);
    row[i] = 1.0f;
    const float* ak = B.Akk + std::size_t(i) * L;
    for (int m = 0; m < i; ++m) {
      const float f = -c.beta[i] * ak[m];
      const float* __restrict tm = B.T + std::size_t(m) * L;
#pragma omp simd
      for (int j = 0; j <= m; ++j) row[j] += f * tm[j];
    }
  }
}

// X = (K . G) S, E = V - X (into X), R = diag(beta) E, W = T R (into Wm and its panels Wp) from
// the packed state Sp.
void solve(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n, L = s.L;
  const bool vector = p.decay == Decay::vector;
  Product ks = rows_product(B.X, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Kx : c.k, Dk, 1, B.Sp));
  ks.rs = vector ? nullptr : B.EQ;
  tile::run(ks);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dv;
    float *__restrict x = B.X + o, *__restrict r = B.R + o;
    const float* __restrict v = c.v + o;
    const float beta = c.beta[i];
#pragma omp simd
    for (int d = 0; d < Dv; ++d) {
      x[d] = v[d] - x[d];
      r[d] = beta * x[d];
    }
  }
  tile::pack(B.R, Dv, false, n, Dv, nullptr, B.Rp);
  tile::run(rows_product(B.Wm, Dv, n, Dv, seg(Range::lower, n, B.T, L, 1, B.Rp)));
  tile::pack(B.Wm, Dv, false, n, Dv, nullptr, B.Wp);
}

// S <- exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W on the packed state.
void advance_state(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n;
  if (p.decay == Decay::vector) {
    scale_state_rows(B.Sp, Dk, Dv, B.decay);
    state_product(B.Sp, Dk, Dv, n, B.Ke, B.Wp, 1.0f, 1.0f);
    return;
  }
  tile::pack(B.Wm, Dv, false, n, Dv, B.EK, B.Wep);
  state_product(B.Sp, Dk, Dv, n, c.k, B.Wep, 1.0f, B.decay[0]);
}

// One chunk forward from the state in Sp (left as the state leaving it); o null: the state only.
void forward_chunk(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float* o) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n, L = s.L;
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, s, p, c);
  scores(B, s, p, c, 1.0f);
  invert(B, s, c);
  solve(B, s, p, c);
  if (o) {
    Product out = rows_product(o, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Qx : c.q, Dk, 1, B.Sp),
                               float(attention_scale(Dk)));
    out.rs = vector ? nullptr : B.EQ;
    out.s2 = seg(Range::lower, n, B.Aqk, L, 1, B.Wp);
    tile::run(out);
  }
  advance_state(B, s, p, c);
}

// x[i][d] *= f[i][d] over n rows of D.
void scale_rows(float* __restrict x, const float* __restrict f, int n, int D) {
#pragma omp simd
  for (int e = 0; e < n * D; ++e) x[e] *= f[e];
}

// The scores' gradients into dQ, dK_read and dK_write for vector gates, by hand: for every pair
// m <= i, w = exp(b_i - b_m) kept as a running product while m walks down.
void vector_score_gradients(const Buffers& B, const Shape& s, const Chunk& c, float* dq) {
  const int D = s.Dk, L = s.L;
  float* __restrict w = B.row;
  for (int i = 0; i < c.n; ++i) {
    std::fill_n(w, D, 1.0f);
    const float *qi = c.q + std::size_t(i) * D, *ki = c.k + std::size_t(i) * D;
    float *__restrict dqi = dq + std::size_t(i) * D, *__restrict dkri = B.dKr + std::size_t(i) * D;
    for (int m = i; m >= 0; --m) {
      const float* km = c.k + std::size_t(m) * D;
      float* __restrict dkwm = B.dKw + std::size_t(m) * D;
      const float x = B.dPqk[std::size_t(i) * L + m], y = B.dPkk[std::size_t(i) * L + m];
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        const float wk = w[d] * km[d];
        dqi[d] += x * wk;
        dkri[d] += y * wk;
        dkwm[d] += w[d] * (x * qi[d] + y * ki[d]);
      }
      multiply(w, B.a + std::size_t(m) * D, D);
    }
  }
}

// dq, dk, dv, dbeta (and dg) of one chunk from the state entering it (Sp, packed) and dS leaving
// it (dSp, packed); dSp becomes the gradient of the state entering the chunk. dq is overwritten
// with this item's own; dk is overwritten, or with add_dk added to.
void backward_chunk(const Buffers& B, const Shape& sh, const Problem& p, const Chunk& c, const float* dO, float* dq,
                    float* dk, bool add_dk, float* dv, float* dbeta, float* dg) {
  const int Dk = sh.Dk, Dv = sh.Dv, n = c.n, L = sh.L;
  const float s = float(attention_scale(Dk));
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, sh, p, c);
  scores(B, sh, p, c, s);  // s A_qk
  invert(B, sh, c);
  solve(B, sh, p, c);
  tile::pack(B.Wm, Dv, true, Dv, n, nullptr, B.WTp);
  tile::pack(dO, Dv, false, n, Dv, nullptr, B.dOp);
  transpose_state(B.Sp, Dk, Dv, B.STp);
  transpose_state(B.dSp, Dk, Dv, B.dSTp);

  // dW = (K . exp(b_{n-1} - b)) dS + s A_qk^T dO;  dR = T^T dW;  dV = beta dR.
  Product dw = rows_product(B.dW, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Ke : c.k, Dk, 1, B.dSp));
  dw.rs = vector ? nullptr : B.EK;
  dw.s2 = seg(Range::upper, n, B.Aqk, 1, L, B.dOp);
  tile::run(dw);
  tile::pack(B.dW, Dv, false, n, Dv, nullptr, B.Zp);
  tile::run(rows_product(B.R, Dv, n, Dv, seg(Range::upper, n, B.T, 1, L, B.Zp)));
  // dP_qk = s dO W^T (lower);  dM = -dR W^T (strictly lower: only those entries are read).
  Product dpq = rows_product(B.dPqk, L, n, n, seg(Range::full, Dv, dO, Dv, 1, B.WTp), s);
  dpq.mask = vector ? B.ones : B.mask;
  dpq.ldm = L;
  dpq.mask_all = !vector;
  dpq.lower = true;
  tile::run(dpq);
  Product dm = rows_product(B.dPkk, L, n, n, seg(Range::full, Dv, B.R, Dv, 1, B.WTp), -1.0f);
  dm.lower = true;
  tile::run(dm);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dv;
    const float beta = c.beta[i];
    float db = dot(B.X + o, B.R + o, Dv);  // E_i . dR_i
    float* __restrict dpk = B.dPkk + std::size_t(i) * L;
    const float* __restrict ak = B.Akk + std::size_t(i) * L;
    const float* __restrict mk = vector ? nullptr : B.mask + std::size_t(i) * L;
    db += dot(dpk, ak, i);
    for (int m = 0; m < i; ++m) dpk[m] *= beta * (mk ? mk[m] : 1.0f);
    std::fill(dpk + i, dpk + sh.C, 0.0f);
    dbeta[i] = db;
#pragma omp simd
    for (int d = 0; d < Dv; ++d) dv[o + d] = beta * B.R[o + d];
  }

  // dQ = G . s dO S^T + dP_qk K;  dK_read = G . (-dV S^T) + dP_kk K;
  // dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_qk^T Q + dP_kk^T K.
  if (!vector) {
    tile::pack(c.k, Dk, false, n, Dk, nullptr, B.Kp);
    tile::pack(c.q, Dk, false, n, Dk, nullptr, B.Qp);
    // Two products each (the scores' side, then the state's added with its row scales): one
    // product's row scales would have to hold s G_i, a buffer of C floats.
    tile::run(rows_product(dq, Dk, n, Dk, seg(Range::lower, n, B.dPqk, L, 1, B.Kp)));
    Product dqs = rows_product(dq, Dk, n, Dk, seg(Range::full, Dv, dO, Dv, 1, B.STp), s);
    dqs.rs = B.EQ;
    dqs.beta = 1.0f;
    tile::run(dqs);
    tile::run(rows_product(B.dKr, Dk, n, Dk, seg(Range::lower, n, B.dPkk, L, 1, B.Kp)));
    Product dkr = rows_product(B.dKr, Dk, n, Dk, seg(Range::full, Dv, dv, Dv, 1, B.STp), -1.0f);
    dkr.rs = B.EQ;
    dkr.beta = 1.0f;
    tile::run(dkr);
    Product dkw = rows_product(B.dKw, Dk, n, Dk, seg(Range::full, Dv, B.Wm, Dv, 1, B.dSTp));
    dkw.rs = B.EK;
    dkw.s2 = seg(Range::upper, n, B.dPqk, 1, L, B.Qp);
    tile::run(dkw);
    Product dkw2 = rows_product(B.dKw, Dk, n, Dk, seg(Range::upper, n, B.dPkk, 1, L, B.Kp));
    dkw2.beta = 1.0f;
    tile::run(dkw2);
  } else {
    tile::run(rows_product(dq, Dk, n, Dk, seg(Range::full, Dv, dO, Dv, 1, B.STp), s));
    scale_rows(dq, B.EQ, n, Dk);
    tile::run(rows_product(B.dKr, Dk, n, Dk, seg(Range::full, Dv, dv, Dv, 1, B.STp), -1.0f));
    scale_rows(B.dKr, B.EQ, n, Dk);
    tile::run(rows_product(B.dKw, Dk, n, Dk, seg(Range::full, Dv, B.Wm, Dv, 1, B.dSTp)));
    scale_rows(B.dKw, B.EK, n, Dk);
    vector_score_gradients(B, sh, c, dq);
  }
#pragma omp simd
  for (int e = 0; e < n * Dk; ++e) dk[e] = (add_dk ? dk[e] : 0.0f) + (B.dKr[e] + B.dKw[e]);

  // dS <- exp(b_{n-1}) dS + s (Q . G)^T dO - (K . G)^T dV.
  if (vector) {
    scale_state_rows(B.dSp, Dk, Dv, B.decay);
    state_product(B.dSp, Dk, Dv, n, B.Qx, B.dOp, s, 1.0f);
    tile::pack(dv, Dv, false, n, Dv, nullptr, B.Zp);
    state_product(B.dSp, Dk, Dv, n, B.Kx, B.Zp, -1.0f, 1.0f);
  } else {
    tile::pack(dO, Dv, false, n, Dv, B.EQ, B.Zp);
    state_product(B.dSp, Dk, Dv, n, c.q, B.Zp, s, B.decay[0]);
    tile::pack(dv, Dv, false, n, Dv, B.EQ, B.Zp);
    state_product(B.dSp, Dk, Dv, n, c.k, B.Zp, -1.0f, 1.0f);
  }
  if (!dg) return;

  // dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau.
  for (int d = 0; d < Dk; ++d) B.sums[d] = 0;
  for (int panel = 0; panel < panel_cols(Dv) / kNR; ++panel)
    for (int d = 0; d < Dk; ++d) {
      const std::size_t o = (std::size_t(panel) * Dk + d) * kNR;
      double sum = 0;
      for (int j = 0; j < kNR; ++j) sum += double(B.dSp[o + j]) * B.Sp[o + j];
      B.sums[d] += sum;
    }
  if (!vector) {
    double total = 0;
    for (int d = 0; d < Dk; ++d) total += B.sums[d];
    B.sums[0] = total;
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dk;
    const float *q = c.q + o, *k = c.k + o, *dkr = B.dKr + o, *dkw = B.dKw + o, *dqi = dq + o;
    if (!vector) {
      dg[i] = float(B.sums[0]);
      double step = 0;
#pragma omp simd reduction(+ : step)
      for (int d = 0; d < Dk; ++d) step += double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      B.sums[0] -= step;
    } else {
#pragma omp simd
      for (int d = 0; d < Dk; ++d) {
        dg[o + d] = float(B.sums[d]);
        B.sums[d] -= double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      }
    }
  }
}

// Chunk `index` of an item (its tokens index * p.chunk on, at most p.chunk of them).
Chunk chunk_of(const Problem& p, const HeadSlice& h, int index, const float* q, const float* k, const float* v,
               const float* beta, const float* g) {
  const int c0 = index * p.chunk;
  Chunk c;
  c.n = std::min(p.chunk, h.seq - c0);
  c.q = q + h.key + std::size_t(c0) * p.dim;
  c.k = k + h.key + std::size_t(c0) * p.dim;
  c.v = v + h.value + std::size_t(c0) * p.value_dim();
  c.beta = beta + h.beta + c0;
  c.g = gated(p.decay) ? g + h.gate + std::size_t(c0) * p.gate_width() : nullptr;
  c.log_gamma = float(std::log(decay_gamma(p.decay, h.head)));
  return c;
}

// Where item `index`'s kept chunk states start, in states: items in slice order, each with its
// own sequence's chunks.
std::size_t kept_offset(const Problem& p, std::size_t index) {
  const int n = int(index / p.heads), head = int(index % p.heads);
  if (!p.packed()) return index * std::size_t(chunks_of(p.seq, p.chunk));
  std::size_t before = 0;
  for (int m = 0; m < n; ++m) before += std::size_t(chunks_of(p.cu_seqlens[m + 1] - p.cu_seqlens[m], p.chunk));
  return std::size_t(p.heads) * before + std::size_t(head) * chunks_of(p.cu_seqlens[n + 1] - p.cu_seqlens[n], p.chunk);
}

// A packed batch's documents longest first (the order the items are taken in); a dense batch's
// sequences are all as long and are taken in order, without the table.
std::size_t order_ints(const Problem& p) { return p.packed() ? lines(std::size_t(p.sequences())) : 0; }

void fill_order(const Problem& p, int* order) {
  if (!p.packed()) return;
  const auto length = [&](int n) { return p.cu_seqlens[std::size_t(n) + 1] - p.cu_seqlens[std::size_t(n)]; };
  std::iota(order, order + p.sequences(), 0);
  // std::sort (in place, unlike stable_sort's buffer), ties in document order.
  std::sort(order, order + p.sequences(),
            [&](int x, int y) { return length(x) != length(y) ? length(x) > length(y) : x < y; });
}

int sequence_at(const int* order, const Problem& p, long rank) { return p.packed() ? order[rank] : int(rank); }

// How the backward splits its work (the file's head comment): items (sequence, q/k head) running a
// group's value heads on one thread, or items (sequence, value head) with the value heads after a
// group's first writing into partial dq and dk (2 (G - 1) copies of q's size; none when G is 1).
struct BackwardPlan {
  bool grouped = false;
  long items = 0;
  int threads = 1;
  std::size_t partial_floats = 0;
};

BackwardPlan backward_plan(const Problem& p) {
  BackwardPlan plan;
  const long most = omp_get_max_threads(), groups = long(p.sequences()) * p.qk_heads(), slices = long(p.slices());
  // Rounds of the schedule: a group on one thread must take no more than its value heads apart.
  const auto rounds = [&](long items) { return (items + most - 1) / most; };
  plan.grouped = p.group() > 1 && rounds(groups) * p.group() <= rounds(slices);
  plan.items = plan.grouped ? groups : slices;
  plan.threads = int(std::min(most, plan.items));
  if (p.group() > 1 && !plan.grouped) plan.partial_floats = lines(2 * std::size_t(p.group() - 1) * p.key_elems());
  return plan;
}

int forward_threads(const Problem& p) { return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())); }

std::size_t thread_floats(const Problem& p, bool backward, bool own_states, bool own_dq) {
  return carve(p, nullptr, backward, own_states, own_dq).used;
}

// One item's backward: dq and dk into the rows of dq_base and dk_base at the item's q/k offset,
// overwritten, or with add added to.
void backward_item(const Buffers& B, const Shape& sh, const Problem& p, const BackwardArgs<float>& a,
                   const float* kept, std::size_t index, float* dq_base, float* dk_base, bool add) {
  const HeadSlice h = p.slice(index);
  const int Dk = sh.Dk, Dv = sh.Dv, chunks = chunks_of(h.seq, p.chunk);
  const float* states = kept ? kept + kept_offset(p, index) * sh.SF : B.states;  // packed S entering each chunk
  if (!kept) {
    tile::pack(a.h0 + h.state, Dv, false, Dk, Dv, nullptr, B.Sp);
    for (int ci = 0; ci < chunks; ++ci) {
      std::copy_n(B.Sp, sh.SF, B.states + ci * sh.SF);
      if (ci + 1 < chunks) forward_chunk(B, sh, p, chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g), nullptr);
    }
  }
  tile::pack(a.dhT + h.state, Dv, false, Dk, Dv, nullptr, B.dSp);
  for (int ci = chunks - 1; ci >= 0; --ci) {
    const Chunk c = chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g);
    const std::size_t t0 = std::size_t(ci) * p.chunk, rk = h.key + t0 * Dk, rv = h.value + t0 * Dv;
    std::copy_n(states + ci * sh.SF, sh.SF, B.Sp);
    float* dg = a.dg ? a.dg + h.gate + t0 * p.gate_width() : nullptr;
    float* dq = add ? B.dQ : dq_base + rk;
    backward_chunk(B, sh, p, c, a.dO + rv, dq, dk_base + rk, add, a.dv + rv, a.dbeta + h.beta + t0, dg);
    if (add) {
      float* __restrict out = dq_base + rk;
#pragma omp simd
      for (int e = 0; e < c.n * Dk; ++e) out[e] += B.dQ[e];
    }
  }
  tile::unpack(B.dSp, Dk, Dv, a.dh0 + h.state, Dv);
}

}  // namespace

std::size_t chunked_delta_kept_states_floats(const Problem& p) {
  std::size_t chunks = 0;  // over the sequences
  for (int n = 0; n < p.sequences(); ++n) chunks += std::size_t(chunks_of(p.slice(std::size_t(n) * p.heads).seq, p.chunk));
  return std::size_t(p.heads) * chunks * shape_of(p).SF;
}

std::size_t chunked_delta_forward_floats(const Problem& p) {
  return std::size_t(forward_threads(p)) * thread_floats(p, false, false, false) + order_ints(p);
}

std::size_t chunked_delta_backward_floats(const Problem& p, bool kept) {
  const BackwardPlan plan = backward_plan(p);
  return std::size_t(plan.threads) * thread_floats(p, true, !kept, plan.grouped) + plan.partial_floats + order_ints(p);
}

void chunked_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  const Shape sh = shape_of(p);
  const int threads = forward_threads(p), Dk = sh.Dk, Dv = sh.Dv;
  const std::size_t per_thread = thread_floats(p, false, false, false);
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
  Workspace<int> order(allocator, order_ints(p));
  fill_order(p, order.data());
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, false, false, false);
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < long(p.slices()); ++item) {
      const std::size_t index = std::size_t(sequence_at(order.data(), p, item / p.heads)) * p.heads + item % p.heads;
      const HeadSlice h = p.slice(index);
      float* kept = keep ? keep + kept_offset(p, index) * sh.SF : nullptr;
      tile::pack(a.h0 + h.state, Dv, false, Dk, Dv, nullptr, B.Sp);
      for (int ci = 0; ci < chunks_of(h.seq, p.chunk); ++ci) {
        const Chunk c = chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g);
        if (kept) std::copy_n(B.Sp, sh.SF, kept + ci * sh.SF);
        forward_chunk(B, sh, p, c, a.o + h.value + std::size_t(ci) * p.chunk * Dv);
      }
      tile::unpack(B.Sp, Dk, Dv, a.hT + h.state, Dv);
    }
  }
}

void chunked_delta_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  const Shape sh = shape_of(p);
  const BackwardPlan plan = backward_plan(p);
  const int G = p.group(), Hk = p.qk_heads();
  const std::size_t per_thread = thread_floats(p, true, !kept, plan.grouped), KE = p.key_elems();
  Workspace<float> scratch(allocator, std::size_t(plan.threads) * per_thread);
  Workspace<float> partial(allocator, plan.partial_floats);
  Workspace<int> order(allocator, order_ints(p));
  fill_order(p, order.data());
#pragma omp parallel num_threads(plan.threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, true, !kept, plan.grouped);
    if (B.ones) fill_lower_ones(B.ones, sh.C);
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < plan.items; ++item) {
      if (plan.grouped) {
        const std::size_t first = std::size_t(sequence_at(order.data(), p, item / Hk)) * p.heads + std::size_t(item % Hk) * G;
        for (int member = 0; member < G; ++member)
          backward_item(B, sh, p, a, kept, first + member, a.dq, a.dk, member > 0);
        continue;
      }
      const std::size_t index = std::size_t(sequence_at(order.data(), p, item / p.heads)) * p.heads + item % p.heads;
      const int member = int(index % p.heads) % G;
      float* copy = partial.data() + std::size_t(std::max(member - 1, 0)) * 2 * KE;  // dq's, then dk's
      backward_item(B, sh, p, a, kept, index, member == 0 ? a.dq : copy, member == 0 ? a.dk : copy + KE, false);
    }
  }
  if (!plan.partial_floats) return;
  // dq and dk of each q/k head: its first value head's, plus the others' partial copies.
  constexpr long kBlock = 4096;
#pragma omp parallel for num_threads(plan.threads) schedule(static)
  for (long e0 = 0; e0 < long(KE); e0 += kBlock) {
    const long e1 = std::min(long(KE), e0 + kBlock);
    for (int member = 1; member < G; ++member) {
      const float* __restrict pq = partial.data() + std::size_t(member - 1) * 2 * KE;
      const float* __restrict pk = pq + KE;
#pragma omp simd
      for (long e = e0; e < e1; ++e) {
        a.dq[e] += pq[e];
        a.dk[e] += pk[e];
      }
    }
  }
}

}  // namespace lattn::cpu

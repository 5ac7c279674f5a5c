// The delta rule's chunked form on the CPU (docs/spec.md section 1b), float32, forward and backward, every
// decay, in the WY / UT-transform representation (DeltaNet: Yang et al. 2024; with gates, Gated
// DeltaNet: Yang, Kautz, Hatamizadeh 2025). Over 500 lines: forward and backward share the gates'
// operands, the scores and the solve, and read best side by side.
//
// Per chunk of n rows with S the state entering it and b_i the cumulative log-gates from the
// chunk's start (per key channel for vector gates; none and retnet are scalar gates 0 and log
// gamma), write Gi = exp(b_i) and, for m <= i, the gated scores
//   A_qk[i][m] = q_i . exp(b_i - b_m) . k_m,   A_kk[i][m] = k_i . exp(b_i - b_m) . k_m (m < i only).
// Token m's pending value w_m = beta_m (v_m - S'_m^T k_m) and S'_m = Gm S + sum_{l<m} exp(b_m - b_l) k_l w_l^T
// give (I + diag(beta) A_kk) W = diag(beta) (V - (K . G) S), a unit lower-triangular system of size
// n; with T = (I + diag(beta) A_kk)^-1 (forward substitution, once per chunk):
//   E = V - (K . G) S,   W = T diag(beta) E,   O = s ((Q . G) S + A_qk W)
//   S_next = exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W
// Every gate factor is exp of a difference <= 0 (formed in double where the gated form does), so
// strong gates stay finite. Scalar gates make exp(b_i - b_m) a mask the tile products apply; vector
// gates cannot be a mask (the factor is per channel inside the dot product): their scores come from
// lane_scores (cpu_chunk_products.hpp: a running product of exp(g), the rows in the vector lanes)
// and the scores' gradients are summed pair by pair (the gated form's products between sub-chunks
// are not used here yet: docs/kernels.md).
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
// applied to the chunk's tokens). The states entering the chunks are kept by the forward (packed
// S) or recomputed by the backward; threads take whole heads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_chunk_products.hpp"
#include "kernels/linear_attention/cpu_delta.hpp"

namespace lattn::cpu {
namespace {

using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::seg;

// One thread's buffers, carved from its block; with base null, carve only counts.
struct Buffers {
  double *b, *sums;                    // cumulative log-gates, C x gw; dg's sums, D
  float *a, *EQ, *EK, *decay, *row;    // exp(g), exp(b), exp(b_{n-1} - b): C x gw; D; D
  float *mask, *ones, *Aqk, *Akk, *T;  // C x score_ld
  float *Qx, *Kx, *Ke;                 // vector gates: Q . G, K . G, K . exp(b_{n-1} - b), C x D
  float *X, *R, *Wm;                   // C x D: (K . G) S then E; R; W
  float *Bp, *WTp;                     // D x P(C): K^T, W^T panels
  float *Rp, *Wp, *Wep;                // C x P(D) panels
  float *Sp;                           // packed state, D x P(D)
  float *lanes;                        // vector gates: 2 x D x kLaneRows, the scores' rows in lanes
  // backward
  float *dPqk, *dPkk;                  // C x score_ld
  float *dW, *dKr, *dKw;               // C x D
  float *Kp, *Qp, *dOp, *Zp;           // C x P(D)
  float *STp, *dSp, *dSTp, *states;    // D x P(D); states: chunks of them, when recomputed
  std::size_t used = 0;
};

Buffers carve(const Problem& p, float* base, bool backward, bool own_states) {
  const std::size_t C = effective_chunk(p), D = p.dim, L = score_ld(int(C));
  const std::size_t gw = p.decay == Decay::vector ? D : 1, PD = panel_cols(p.dim), PC = panel_cols(int(C));
  const bool vector = p.decay == Decay::vector;
  Buffers b{};
  auto take = [&](std::size_t n) {
    float* out = base ? base + b.used : nullptr;
    b.used += n;
    return out;
  };
  auto take_doubles = [&](std::size_t n) { return reinterpret_cast<double*>(take(2 * n)); };
  b.b = take_doubles(C * gw);
  b.sums = take_doubles(D);
  b.a = take(vector ? C * D : 0);
  for (float** x : {&b.EQ, &b.EK}) *x = take(C * gw);
  for (float** x : {&b.decay, &b.row}) *x = take(D);
  b.mask = take(vector ? 0 : C * L);
  b.ones = take(vector ? C * L : 0);
  for (float** x : {&b.Aqk, &b.Akk, &b.T}) *x = take(C * L);
  for (float** x : {&b.Qx, &b.Kx, &b.Ke}) *x = take(vector ? C * D : 0);
  for (float** x : {&b.X, &b.R, &b.Wm}) *x = take(C * D);
  for (float** x : {&b.Bp, &b.WTp}) *x = take(D * PC);
  for (float** x : {&b.Rp, &b.Wp, &b.Wep}) *x = take(C * PD);
  b.Sp = take(D * PD);
  b.lanes = take(vector ? 2 * D * kLaneRows : 0);
  if (backward) {
    for (float** x : {&b.dPqk, &b.dPkk}) *x = take(C * L);
    for (float** x : {&b.dW, &b.dKr, &b.dKw}) *x = take(C * D);
    for (float** x : {&b.Kp, &b.Qp, &b.dOp, &b.Zp}) *x = take(C * PD);
    for (float** x : {&b.STp, &b.dSp, &b.dSTp}) *x = take(D * PD);
    b.states = take(own_states ? std::size_t(p.chunks()) * state_floats(p) : 0);
  }
  b.used = (b.used + 15) / 16 * 16;  // each thread's block on a cache line (and its doubles aligned)
  return b;
}

// One chunk of one head: its tokens' rows and gates.
struct Chunk {
  int n;
  const float *q, *k, *v, *beta, *g;  // g: the chunk's log-gates (scalar or vector decays), else null
  float log_gamma;                    // retnet's log gamma (0 for none)
};

// b, exp(g), G = exp(b), exp(b_{n-1} - b), exp(b_{n-1}); the mask exp(b_i - b_m) for scalar
// gates (none and retnet as constant log-gates), Q . G, K . G, K . exp(b_{n-1} - b) for vector gates.
void gate_operands(const Buffers& B, const Problem& p, const Chunk& c) {
  const int D = p.dim, n = c.n, C = effective_chunk(p), L = score_ld(C);
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
void scores(const Buffers& B, const Problem& p, const Chunk& c, float alpha) {
  const int D = p.dim, n = c.n, C = effective_chunk(p), L = score_ld(C);
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
void invert(const Buffers& B, const Problem& p, const Chunk& c) {
  const int n = c.n, C = effective_chunk(p), L = score_ld(C);
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
void solve(const Buffers& B, const Problem& p, const Chunk& c) {
  const int D = p.dim, n = c.n, L = score_ld(effective_chunk(p));
  const bool vector = p.decay == Decay::vector;
  Product ks = rows_product(B.X, D, n, D, seg(Range::full, D, vector ? B.Kx : c.k, D, 1, B.Sp));
  ks.rs = vector ? nullptr : B.EQ;
  tile::run(ks);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    float *__restrict x = B.X + o, *__restrict r = B.R + o;
    const float* __restrict v = c.v + o;
    const float beta = c.beta[i];
#pragma omp simd
    for (int d = 0; d < D; ++d) {
      x[d] = v[d] - x[d];
      r[d] = beta * x[d];
    }
  }
  tile::pack(B.R, D, false, n, D, nullptr, B.Rp);
  tile::run(rows_product(B.Wm, D, n, D, seg(Range::lower, n, B.T, L, 1, B.Rp)));
  tile::pack(B.Wm, D, false, n, D, nullptr, B.Wp);
}

// S <- exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W on the packed state.
void advance_state(const Buffers& B, const Problem& p, const Chunk& c) {
  const int D = p.dim, n = c.n;
  if (p.decay == Decay::vector) {
    scale_state_rows(B.Sp, D, B.decay);
    state_product(B.Sp, D, n, B.Ke, B.Wp, 1.0f, 1.0f);
    return;
  }
  tile::pack(B.Wm, D, false, n, D, B.EK, B.Wep);
  state_product(B.Sp, D, n, c.k, B.Wep, 1.0f, B.decay[0]);
}

// One chunk forward from the state in Sp (left as the state leaving it); o null: the state only.
void forward_chunk(const Buffers& B, const Problem& p, const Chunk& c, float* o) {
  const int D = p.dim, n = c.n, L = score_ld(effective_chunk(p));
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, p, c);
  scores(B, p, c, 1.0f);
  invert(B, p, c);
  solve(B, p, c);
  if (o) {
    Product out = rows_product(o, D, n, D, seg(Range::full, D, vector ? B.Qx : c.q, D, 1, B.Sp),
                               float(attention_scale(D)));
    out.rs = vector ? nullptr : B.EQ;
    out.s2 = seg(Range::lower, n, B.Aqk, L, 1, B.Wp);
    tile::run(out);
  }
  advance_state(B, p, c);
}

// x[i][d] *= f[i][d] over n rows of D.
void scale_rows(float* __restrict x, const float* __restrict f, int n, int D) {
#pragma omp simd
  for (int e = 0; e < n * D; ++e) x[e] *= f[e];
}

// The scores' gradients into dQ, dK_read and dK_write for vector gates, by hand: for every pair
// m <= i, w = exp(b_i - b_m) kept as a running product while m walks down.
void vector_score_gradients(const Buffers& B, const Problem& p, const Chunk& c, float* dq) {
  const int D = p.dim, L = score_ld(effective_chunk(p));
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
// it (dSp, packed); dSp becomes the gradient of the state entering the chunk.
void backward_chunk(const Buffers& B, const Problem& p, const Chunk& c, const float* dO, float* dq, float* dk,
                    float* dv, float* dbeta, float* dg) {
  const int D = p.dim, n = c.n, L = score_ld(effective_chunk(p));
  const float s = float(attention_scale(D));
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, p, c);
  scores(B, p, c, s);  // s A_qk
  invert(B, p, c);
  solve(B, p, c);
  tile::pack(B.Wm, D, true, D, n, nullptr, B.WTp);
  tile::pack(dO, D, false, n, D, nullptr, B.dOp);
  tile::transpose_packed(B.Sp, D, B.STp);
  tile::transpose_packed(B.dSp, D, B.dSTp);

  // dW = (K . exp(b_{n-1} - b)) dS + s A_qk^T dO;  dR = T^T dW;  dV = beta dR.
  Product dw = rows_product(B.dW, D, n, D, seg(Range::full, D, vector ? B.Ke : c.k, D, 1, B.dSp));
  dw.rs = vector ? nullptr : B.EK;
  dw.s2 = seg(Range::upper, n, B.Aqk, 1, L, B.dOp);
  tile::run(dw);
  tile::pack(B.dW, D, false, n, D, nullptr, B.Zp);
  tile::run(rows_product(B.R, D, n, D, seg(Range::upper, n, B.T, 1, L, B.Zp)));
  // dP_qk = s dO W^T (lower);  dM = -dR W^T (strictly lower: only those entries are read).
  Product dpq = rows_product(B.dPqk, L, n, n, seg(Range::full, D, dO, D, 1, B.WTp), s);
  dpq.mask = vector ? B.ones : B.mask;
  dpq.ldm = L;
  dpq.mask_all = !vector;
  dpq.lower = true;
  tile::run(dpq);
  Product dm = rows_product(B.dPkk, L, n, n, seg(Range::full, D, B.R, D, 1, B.WTp), -1.0f);
  dm.lower = true;
  tile::run(dm);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    const float beta = c.beta[i];
    float db = dot(B.X + o, B.R + o, D);  // E_i . dR_i
    float* __restrict dpk = B.dPkk + std::size_t(i) * L;
    const float* __restrict ak = B.Akk + std::size_t(i) * L;
    const float* __restrict mk = vector ? nullptr : B.mask + std::size_t(i) * L;
    db += dot(dpk, ak, i);
    for (int m = 0; m < i; ++m) dpk[m] *= beta * (mk ? mk[m] : 1.0f);
    std::fill(dpk + i, dpk + effective_chunk(p), 0.0f);
    dbeta[i] = db;
#pragma omp simd
    for (int d = 0; d < D; ++d) dv[o + d] = beta * B.R[o + d];
  }

  // dQ = G . s dO S^T + dP_qk K;  dK_read = G . (-dV S^T) + dP_kk K;
  // dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_qk^T Q + dP_kk^T K.
  if (!vector) {
    tile::pack(c.k, D, false, n, D, nullptr, B.Kp);
    tile::pack(c.q, D, false, n, D, nullptr, B.Qp);
    for (int i = 0; i < n; ++i) B.row[i] = s * B.EQ[i];
    Product dqp = rows_product(dq, D, n, D, seg(Range::full, D, dO, D, 1, B.STp));
    dqp.rs = B.row;
    dqp.s2 = seg(Range::lower, n, B.dPqk, L, 1, B.Kp);
    tile::run(dqp);
    for (int i = 0; i < n; ++i) B.row[i] = -B.EQ[i];
    Product dkr = rows_product(B.dKr, D, n, D, seg(Range::full, D, dv, D, 1, B.STp));
    dkr.rs = B.row;
    dkr.s2 = seg(Range::lower, n, B.dPkk, L, 1, B.Kp);
    tile::run(dkr);
    Product dkw = rows_product(B.dKw, D, n, D, seg(Range::full, D, B.Wm, D, 1, B.dSTp));
    dkw.rs = B.EK;
    dkw.s2 = seg(Range::upper, n, B.dPqk, 1, L, B.Qp);
    tile::run(dkw);
    Product dkw2 = rows_product(B.dKw, D, n, D, seg(Range::upper, n, B.dPkk, 1, L, B.Kp));
    dkw2.beta = 1.0f;
    tile::run(dkw2);
  } else {
    tile::run(rows_product(dq, D, n, D, seg(Range::full, D, dO, D, 1, B.STp), s));
    scale_rows(dq, B.EQ, n, D);
    tile::run(rows_product(B.dKr, D, n, D, seg(Range::full, D, dv, D, 1, B.STp), -1.0f));
    scale_rows(B.dKr, B.EQ, n, D);
    tile::run(rows_product(B.dKw, D, n, D, seg(Range::full, D, B.Wm, D, 1, B.dSTp)));
    scale_rows(B.dKw, B.EK, n, D);
    vector_score_gradients(B, p, c, dq);
  }
#pragma omp simd
  for (int e = 0; e < n * D; ++e) dk[e] = B.dKr[e] + B.dKw[e];

  // dS <- exp(b_{n-1}) dS + s (Q . G)^T dO - (K . G)^T dV.
  if (vector) {
    scale_state_rows(B.dSp, D, B.decay);
    state_product(B.dSp, D, n, B.Qx, B.dOp, s, 1.0f);
    tile::pack(dv, D, false, n, D, nullptr, B.Zp);
    state_product(B.dSp, D, n, B.Kx, B.Zp, -1.0f, 1.0f);
  } else {
    tile::pack(dO, D, false, n, D, B.EQ, B.Zp);
    state_product(B.dSp, D, n, c.q, B.Zp, s, B.decay[0]);
    tile::pack(dv, D, false, n, D, B.EQ, B.Zp);
    state_product(B.dSp, D, n, c.k, B.Zp, -1.0f, 1.0f);
  }
  if (!dg) return;

  // dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau.
  for (int d = 0; d < D; ++d) B.sums[d] = 0;
  for (int panel = 0; panel < panel_cols(D) / tile::kNR; ++panel)
    for (int d = 0; d < D; ++d) {
      const std::size_t o = (std::size_t(panel) * D + d) * tile::kNR;
      double sum = 0;
      for (int j = 0; j < tile::kNR; ++j) sum += double(B.dSp[o + j]) * B.Sp[o + j];
      B.sums[d] += sum;
    }
  if (!vector) {
    double total = 0;
    for (int d = 0; d < D; ++d) total += B.sums[d];
    B.sums[0] = total;
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    const float *q = c.q + o, *k = c.k + o, *dkr = B.dKr + o, *dkw = B.dKw + o, *dqi = dq + o;
    if (!vector) {
      dg[i] = float(B.sums[0]);
      double step = 0;
#pragma omp simd reduction(+ : step)
      for (int d = 0; d < D; ++d) step += double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      B.sums[0] -= step;
    } else {
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        dg[o + d] = float(B.sums[d]);
        B.sums[d] -= double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      }
    }
  }
}

std::size_t thread_floats(const Problem& p, bool backward, bool own_states) {
  return carve(p, nullptr, backward, own_states).used;
}

Chunk chunk_of(const Problem& p, long bh, int index, const float* q, const float* k, const float* v,
               const float* beta, const float* g) {
  const int C = effective_chunk(p), c0 = index * C;
  const std::size_t r = bh * p.head_token_elems() + std::size_t(c0) * p.dim;
  Chunk c;
  c.n = std::min(C, p.seq - c0);
  c.q = q + r;
  c.k = k + r;
  c.v = v + r;
  c.beta = beta + bh * p.seq + c0;
  c.g = gated(p.decay) ? g + bh * p.head_gate_elems() + std::size_t(c0) * p.gate_width() : nullptr;
  c.log_gamma = float(std::log(decay_gamma(p.decay, int(bh % p.heads))));
  return c;
}

}  // namespace

std::size_t chunked_delta_kept_states_floats(const Problem& p) {
  return p.heads_total() * std::size_t(p.chunks()) * state_floats(p);
}

std::size_t chunked_delta_forward_floats(const Problem& p) {
  return std::size_t(head_parallel_threads(p)) * thread_floats(p, false, false);
}

std::size_t chunked_delta_backward_floats(const Problem& p, bool kept) {
  return std::size_t(head_parallel_threads(p)) * thread_floats(p, true, !kept);
}

void chunked_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  const int D = p.dim, chunks = p.chunks(), threads = head_parallel_threads(p);
  const std::size_t per_thread = thread_floats(p, false, false), SF = state_floats(p);
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, false, false);
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < long(p.heads_total()); ++bh) {
      const std::size_t st = bh * p.head_state_elems();
      tile::pack(a.h0 + st, D, false, D, D, nullptr, B.Sp);
      for (int ci = 0; ci < chunks; ++ci) {
        const Chunk c = chunk_of(p, bh, ci, a.q, a.k, a.v, a.beta, a.g);
        if (keep) std::copy_n(B.Sp, SF, keep + (bh * chunks + ci) * SF);
        forward_chunk(B, p, c, a.o + bh * p.head_token_elems() + std::size_t(ci) * effective_chunk(p) * D);
      }
      tile::unpack(B.Sp, D, D, a.hT + st, D);
    }
  }
}

void chunked_delta_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  const int D = p.dim, chunks = p.chunks(), C = effective_chunk(p), threads = head_parallel_threads(p);
  const std::size_t per_thread = thread_floats(p, true, !kept), SF = state_floats(p);
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, true, !kept);
    if (B.ones) fill_lower_ones(B.ones, C);
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < long(p.heads_total()); ++bh) {
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float* states = kept ? kept + bh * chunks * SF : B.states;  // packed S entering each chunk
      if (!kept) {
        tile::pack(a.h0 + st, D, false, D, D, nullptr, B.Sp);
        for (int ci = 0; ci < chunks; ++ci) {
          std::copy_n(B.Sp, SF, B.states + ci * SF);
          if (ci + 1 < chunks) forward_chunk(B, p, chunk_of(p, bh, ci, a.q, a.k, a.v, a.beta, a.g), nullptr);
        }
      }
      tile::pack(a.dhT + st, D, false, D, D, nullptr, B.dSp);
      for (int ci = chunks - 1; ci >= 0; --ci) {
        const Chunk c = chunk_of(p, bh, ci, a.q, a.k, a.v, a.beta, a.g);
        const std::size_t r = tok + std::size_t(ci) * C * D;
        std::copy_n(states + ci * SF, SF, B.Sp);
        float* dg = a.dg ? a.dg + bh * p.head_gate_elems() + std::size_t(ci) * C * p.gate_width() : nullptr;
        backward_chunk(B, p, c, a.dO + r, a.dq + r, a.dk + r, a.dv + r, a.dbeta + bh * p.seq + std::size_t(ci) * C, dg);
      }
      tile::unpack(B.dSp, D, D, a.dh0 + st, D);
    }
  }
}

}  // namespace lattn::cpu

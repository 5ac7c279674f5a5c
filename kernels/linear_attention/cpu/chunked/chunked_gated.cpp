// The chunked form with gated decays (docs/spec.md section 1b), float32, forward and backward, on the
// tile products of tile_gemm.hpp (AVX-512 or AVX2 micro-tiles, or their portable form).
// Over 500 lines, and past 650 with RWKV-6's bonus (its shifted diagonal in both directions): the forward
// and backward share the gates' operands, the sub-chunk layout and the buffers, and read best side
// by side; a split would pass all of them across a file boundary.
//
// Per chunk of n rows, b_i = g_0 + ... + g_i (cumulative log-gates from the chunk's start, summed
// in double, per key channel for vector gates) and the state S entering it:
//   o_i    = s ( (q_i . exp(b_i))^T S + sum_{j <= i} A_ij v_j ),  A_ij = sum_d q_id k_jd exp(b_id - b_jd)
//   S_next = diag(exp(b_{n-1})) S + sum_j (k_j . exp(b_{n-1} - b_j)) v_j^T
// Every factor is exp of a difference that is <= 0, formed in double before the float exp: the
// naive factorisation exp(b_i) exp(-b_j) overflows float32 once a chunk's gates sum past -88
// (gate_norm 1 reaches -50 to -100 over 128 tokens), and differences of two float cumulative sums
// of that size lose digits. For the scores:
//   scalar gates: A = (Q K^T) . M with M_ij = exp(b_i - b_j), a mask the tile products apply.
//   vector gates: exp(b_id - b_jd) is not a mask, so the rows go in sub-chunks of c = 32 (GLA's
//     secondary chunking). Between sub-chunks I > J, with r_I = b at the row before I and e_J = b
//     at J's last row (r_I <= e_J), exp(b_i - b_j) = exp(b_i - r_I) exp(r_I - e_J) exp(e_J - b_j),
//     three factors <= 1: Qh = Q . exp(b - r), Kb = K . exp(e - b), and f_IJ = exp(r_I - e_J) on
//     the packed Kb^T's rows; one product per row block. Within a sub-chunk, lane_scores
//     (cpu/chunked/chunk_products.hpp) makes A_ij with the rows in the vector lanes and w = exp(b_i - b_j)
//     = prod exp(g) kept as a running product (no exp per pair).
// Backward, dS = the gradient of the state leaving the chunk (dhT for the last), walking chunks in
// reverse (vector gates; scalar gates are the same with the mask, the factors per row, and the
// products fused as in cpu/chunked/chunked_tiled_backward.cpp):
//   dA   = s (dO V^T) on and below the diagonal
//   dV   = s A^T dO + (K . exp(b_{n-1} - b)) dS
//   dQ_i = exp(b_i) . s (S dO_i) + exp(b_i - r_I) . sum_{J < I} dA_iJ (Kb_J . f_IJ) + the sub-chunk's own
//   dK_j = exp(b_{n-1} - b_j) . (dS v_j) + exp(e_J - b_j) . sum_{I > J} dA_Ij^T (Qh_I . f_IJ) + its own
//   dS  <- diag(exp(b_{n-1})) dS + s (Q . exp(b))^T dO
//   dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q_tau . dq_tau - k_tau . dk_tau)   (dS_c, S_c: entering)
// The last line is the chunk's share of L's dependence on its gates: shifting every b of the chunk
// by delta scales S_c by exp(delta), and q, k enter only as q . exp(b), k . exp(-b) (docs/kernels.md).
// Shapes (docs/spec.md section 1c): an item is one (sequence, value head) pair (Problem::slice),
// with its own gates; its q/k rows (Dk wide) are its q/k head's, read in place, and its state is
// Dk x Dv (the products above: Q K^T n x Dk by Dk x n, Q S n x Dk by Dk x Dv, K^T V Dk x n by
// n x Dv, A V n x n by n x Dv). A packed document is its own sequence: its chunks start at its first
// token and its last chunk is short (len - (chunks - 1) C rows), never padded and never straddling
// two documents; its cumulative gates restart with it. A short chunk costs one chunk's fixed work
// (the gates' operands, packing, the state transpose, tiles rounded up to 8 rows and 32 columns)
// per document, and no padded tokens. Threads take whole items in the forward; the backward's dq
// and dk of a q/k head sum over its value heads, so its items are (sequence, q/k head, part)
// (GradParts, cpu/chunked/chunk_products.hpp): a part's value heads run on one thread, each one's dq and
// dk made in the thread's rows (dg needs a value head's own) and then written or added. The states
// entering the chunks are kept by the forward (S^T panels, as the tiled path keeps them) or
// recomputed per value head by the backward.
//
// The bonus form (RWKV-6, docs/spec.md section 1g; vector gates) reads the state before token i:
// q_i is decayed by the exclusive cumulative gate bx_i = b_{i-1} (0 for the chunk's first row), so
// EQ, Qh and QL take bx instead of b (bx_i - r_I <= 0 still), the scores below the diagonal are
// sum_d q_id k_jd exp(bx_id - b_jd) (within a sub-chunk lane_scores' running product for row i - 1,
// fed q_i), and the diagonal is the bonus, A_ii = q_i . (u . k_i). The state update is GLA's. The
// backward follows: dQ's state part times exp(bx), the sub-chunk's own terms from j = i - 1 down
// with the diagonal's dA_ii u . k_i (dQ) and dA_ii u . q_i (dK), and
//   dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q_tau . dq_tau - k_tau . dk_tau) - q_i . dq_i + beta_i,
//   beta_i = dA_ii (q_i . u . k_i)
// (the exclusive gate moves q_i's term one row on; docs/kernels.md). du = sum_i dA_ii (q_i . k_i),
// kept per (sequence, value head) in double and summed per head at the end.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_tiled.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"

namespace lattn::cpu {
namespace {

using tile::kNR;
using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::seg;

// One thread's buffers, carved from its block; with base null, carve only counts (the closed form).
struct Buffers {
  double* b;        // cumulative gates, n x W
  float *a, *EQ, *EK;  // exp(g), exp(b - r), exp(e - b): n x W
  float *Qh, *Kb, *QL, *KG, *tmp, *rows;  // n x Dk
  float *hdq, *hdk;                       // n x Dk: one value head's dq, dk of a shared q/k head
  float *mask, *ones, *A, *dA;            // C x score_ld
  float* R;                               // C x score_ld: Q K^T shared by a group's value heads
  float *Bp, *Vtp;                        // Dk x P(C), Dv x P(C) panels
  float *Vp, *dOp, *Xp;                   // C x P(max(Dk, Dv)), C x P(Dv), C x P(Dk) panels
  float *Sp, *dSp, *dSTp, *states;        // packed S (one per value head of a shared forward item),
                                          // dS (Dk x P(Dv)), dS^T (Dv x P(Dk)); states:
                                          // S^T entering each chunk, when recomputed
  float *f, *decay, *tmp_row;             // Dk
  float* lanes;                           // Dk x kLaneRows: a sub-chunk's q rows in lanes (vector gates)
  double* sums;                           // Dk (dg)
  std::size_t used = 0;  // floats of the thread's block
};

// shared_heads: the value heads a forward item computes together on one Q K^T (0: one, unshared).
Buffers carve(const Problem& p, float* base, bool backward, bool own_states, int shared_heads = 0) {
  const std::size_t C = effective_chunk(p), D = p.dim, Dv = p.value_dim(), W = p.gate_width();
  const std::size_t L = score_ld(int(C)), PK = panel_cols(p.dim), PV = panel_cols(p.value_dim()),
                    PC = panel_cols(int(C));
  Buffers b;
  BlockCarver block{base};
  b.b = block.take_doubles(C * W);
  b.sums = block.take_doubles(D);
  for (float** x : {&b.a, &b.EQ, &b.EK}) *x = block.take(C * W);
  for (float** x : {&b.Qh, &b.Kb, &b.QL, &b.KG}) *x = block.take(C * D);
  for (float** x : {&b.mask, &b.A}) *x = block.take(C * L);
  b.Bp = block.take(D * PC);
  b.Vp = block.take(C * std::max(PK, PV));  // V's rows; K's in the scalar gates' backward
  b.R = block.take(shared_heads > 0 ? C * L : 0);
  b.Sp = block.take(key_state_floats(p) * std::size_t(std::max(1, shared_heads)));
  b.f = block.take(D);
  b.decay = block.take(D);
  b.tmp_row = block.take(D);
  b.lanes = block.take(p.decay == Decay::vector ? D * kLaneRows : 0);
  if (backward) {
    for (float** x : {&b.tmp, &b.rows}) *x = block.take(C * D);
    for (float** x : {&b.hdq, &b.hdk}) *x = block.take(p.group() > 1 ? C * D : 0);
    for (float** x : {&b.ones, &b.dA}) *x = block.take(C * L);
    b.Vtp = block.take(Dv * PC);
    b.dOp = block.take(C * PV);
    b.Xp = block.take(C * PK);
    b.dSp = block.take(key_state_floats(p));
    b.dSTp = block.take(value_state_floats(p));
    b.states = block.take(own_states ? std::size_t(max_chunks(p)) * value_state_floats(p) : 0);
  }
  b.used = block.floats();
  return b;
}

// sum over columns of X . Y for packed Dk x Dv X and Y^T panels (Dv x Dk), per row (into sums):
// rowsum(X . Y).
void rowsum_product(const float* Xp, const float* YTp, int Dk, int Dv, double* sums) {
  for (int d = 0; d < Dk; ++d) {
    double sum = 0;
    for (int e = 0; e < Dv; ++e)
      sum += double(Xp[(std::size_t(e / kNR) * Dk + d) * kNR + e % kNR]) *
             YTp[(std::size_t(d / kNR) * Dv + e) * kNR + d % kNR];
    sums[d] = sum;
  }
}

// A chunk of one item: its rows and where they start in the item's key (q, k), value (v, o) and
// gate rows. Chunk c of a sequence of len rows starts at c C; the last has len - c C <= C rows.
struct Chunk {
  int n;
  std::size_t rk, rv, rg;
};

Chunk chunk_at(const Problem& p, int len, int c) {
  const int C = effective_chunk(p), c0 = c * C;
  return {std::min(C, len - c0), std::size_t(c0) * p.dim, std::size_t(c0) * p.value_dim(),
          std::size_t(c0) * p.gate_width()};
}

// The sub-chunks of vector gates: block I is rows [I * c, min(n, (I + 1) * c)).
int blocks_of(int n) { return (n + kGateSubChunk - 1) / kGateSubChunk; }

// The gates' operands of one chunk: b, exp(g), and for vector gates Qh, Kb, QL = Q . exp(b) and
// KG = K . exp(b_{n-1} - b); for scalar gates the mask exp(b_i - b_j), lam =
// exp(b_i) (in EQ) and gam = exp(b_{n-1} - b_j) (in EK). decay: exp(b_{n-1}) per key channel.
void gate_operands(const Buffers& B, const Problem& p, int n, const float* q, const float* k, const float* g) {
  const int D = p.dim, W = p.gate_width(), C = effective_chunk(p), L = score_ld(C);
  for (int w = 0; w < W; ++w) B.b[w] = g[w];
  for (int i = 1; i < n; ++i) {
    double* bi = B.b + std::size_t(i) * W;
    const float* gi = g + std::size_t(i) * W;
#pragma omp simd
    for (int w = 0; w < W; ++w) bi[w] = bi[w - W] + gi[w];
  }
  for (int e = 0; e < n * W; ++e) B.a[e] = g[e];
  exp_in_place(B.a, n * W);
  const double* last = B.b + std::size_t(n - 1) * W;
  exp_of_difference(B.decay, last, nullptr, W);
  if (p.decay == Decay::scalar) {
    for (int w = 1; w < D; ++w) B.decay[w] = B.decay[0];
    scalar_gate_rows(B.b, last[0], n, C, L, B.EQ, B.EK, B.mask);
    return;
  }
  for (int I = 0; I < blocks_of(n); ++I) {
    const int i0 = I * kGateSubChunk, i1 = std::min(n, i0 + kGateSubChunk);
    const double* r = i0 > 0 ? B.b + std::size_t(i0 - 1) * D : nullptr;  // b before the block (0)
    const double* e = B.b + std::size_t(i1 - 1) * D;                     // b at its last row
    // QL = Qh . exp(r), KG = Kb . exp(b_{n-1} - e): products of factors <= 1.
    if (r) exp_of_difference(B.f, r, nullptr, D);  // exp(r)
    else std::fill_n(B.f, D, 1.0f);
    exp_of_difference(B.tmp_row, last, e, D);
    for (int i = i0; i < i1; ++i) {
      const double* bi = B.b + std::size_t(i) * D;
      const std::size_t o = std::size_t(i) * D;
      // q's gate: b_i, or the bonus form's exclusive b_{i-1} (exp(0) = 1 at the chunk's first row).
      const double* bq = !p.bonus ? bi : i > 0 ? bi - D : nullptr;
      if (bq) exp_of_difference(B.EQ + o, bq, r, D);
      else std::fill_n(B.EQ + o, D, 1.0f);
      exp_of_difference(B.EK + o, e, bi, D);
      float *__restrict Qh = B.Qh + o, *__restrict Kb = B.Kb + o, *__restrict QL = B.QL + o, *__restrict KG = B.KG + o;
      const float *__restrict EQ = B.EQ + o, *__restrict EK = B.EK + o, *__restrict f = B.f, *__restrict h = B.tmp_row;
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        Qh[d] = q[o + d] * EQ[d];
        Kb[d] = k[o + d] * EK[d];
        QL[d] = Qh[d] * f[d];
        KG[d] = Kb[d] * h[d];
      }
    }
  }
}

// f_IJ = exp(r_I - e_J) for vector gates (rows i0 of I, j1 of J's last row + 1).
void block_factor(const Buffers& B, int D, int i0, int j1) {
  exp_of_difference(B.f, B.b + std::size_t(i0 - 1) * D, B.b + std::size_t(j1 - 1) * D, D);
}

// A (ld score_ld) on and below the diagonal: the scores of one chunk, times alpha. Rows above a
// vector-gate sub-chunk's diagonal within it are zeroed (the A V products read up to the 8-row
// tile's end); the scalar gates' mask zeroes them.
void scores(const Buffers& B, const Problem& p, int n, const float* q, const float* k, float alpha,
            const float* u = nullptr) {
  const int D = p.dim, C = effective_chunk(p), L = score_ld(C);
  if (p.decay == Decay::scalar) {
    tile::pack(k, D, true, D, n, nullptr, B.Bp);
    Product u = rows_product(B.A, L, n, n, seg(Range::full, D, q, D, 1, B.Bp), alpha);
    u.mask = B.mask;
    u.ldm = L;
    u.mask_all = true;
    u.lower = true;
    tile::run(u);
    return;
  }
  subchunk_scores<1>(D, n, B.b, B.Kb, {B.Qh}, {alpha}, {B.A}, L, B.f, B.Bp);
  for (int I = 0; I < blocks_of(n); ++I) {
    const int i0 = I * kGateSubChunk, i1 = std::min(n, i0 + kGateSubChunk);
    for (int i = i0; i < i1; ++i) {
      float* row = B.A + std::size_t(i) * L;
      std::fill(row + i + 1, row + std::min(C, i0 + kGateSubChunk), 0.0f);
    }
    if (!p.bonus) {
      lane_scores<1>(D, i0, i1, i0, k, B.a, {q}, {alpha}, {B.A}, L, B.lanes);
      continue;
    }
    // Row i below the diagonal is lane_scores' row i - 1 (gates j + 1 .. i - 1) fed q_i; the
    // diagonal is the bonus.
    lane_scores<1>(D, i0, i1 - 1, i0, k, B.a, {q + D}, {alpha}, {B.A + L}, L, B.lanes);
    for (int i = i0; i < i1; ++i) {
      const float *__restrict qi = q + std::size_t(i) * D, *__restrict ki = k + std::size_t(i) * D;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int d = 0; d < D; ++d) sum += qi[d] * u[d] * ki[d];
      B.A[std::size_t(i) * L + i] = alpha * sum;
    }
  }
}

// O_c from the scores A and the packed state S entering the chunk; leaves S as the state leaving it.
void forward_outputs(const Buffers& B, const Problem& p, int n, const float* q, const float* k, const float* v,
                     float* o) {
  const int D = p.dim, Dv = p.value_dim(), L = score_ld(effective_chunk(p));
  const bool scalar = p.decay == Decay::scalar;
  tile::pack(v, Dv, false, n, Dv, nullptr, B.Vp);
  Product out = rows_product(o, Dv, n, Dv, seg(Range::full, D, scalar ? q : B.QL, D, 1, B.Sp),
                             float(attention_scale(D)));
  out.rs = scalar ? B.EQ : nullptr;
  out.s2 = seg(Range::lower, n, B.A, L, 1, B.Vp);
  tile::run(out);
  if (scalar) {
    tile::pack(v, Dv, false, n, Dv, B.EK, B.Vp);  // V rows weighted by gam
    state_product(B.Sp, D, Dv, n, k, B.Vp, 1.0f, B.decay[0]);
  } else {
    scale_state_rows(B.Sp, D, Dv, B.decay);
    state_product(B.Sp, D, Dv, n, B.KG, B.Vp, 1.0f, 1.0f);
  }
}

void forward_chunk(const Buffers& B, const Problem& p, int n, const float* q, const float* k, const float* v,
                   const float* g, float* o, const float* u = nullptr) {
  gate_operands(B, p, n, q, k, g);
  scores(B, p, n, q, k, 1.0f, u);
  forward_outputs(B, p, n, q, k, v, o);
}

// Scalar gates, a group's value heads on one Q K^T: R = Q K^T (lower) once per chunk, then each
// head's A = R . exp(b_i - b_j) from its own gates. Entries of R above the diagonal are never read
// (the lower product leaves some unwritten); A is zero there up to the 8-row tile's end, which the
// A V product reads.
void shared_scores(const Buffers& B, const Problem& p, int n, const float* q, const float* k) {
  const int D = p.dim, L = score_ld(effective_chunk(p));
  tile::pack(k, D, true, D, n, nullptr, B.Bp);
  Product u = rows_product(B.R, L, n, n, seg(Range::full, D, q, D, 1, B.Bp));
  u.lower = true;
  tile::run(u);
}

void forward_chunk_shared(const Buffers& B, const Problem& p, int n, const float* q, const float* k, const float* v,
                          const float* g, float* o) {
  const int L = score_ld(effective_chunk(p));
  gate_operands(B, p, n, q, k, g);
  for (int i = 0; i < n; ++i) {
    const std::size_t row = std::size_t(i) * L;
    const float *__restrict r = B.R + row, *__restrict m = B.mask + row;
    float* __restrict a = B.A + row;
#pragma omp simd
    for (int j = 0; j <= i; ++j) a[j] = r[j] * m[j];
    std::fill(a + i + 1, a + std::min(n, i / tile::kMR * tile::kMR + tile::kMR), 0.0f);
  }
  forward_outputs(B, p, n, q, k, v, o);
}

// Rows [x0, x1) of X, each times f_{block of the row, K} (K the other side's block), packed as a
// B operand (x1 - x0 rows of D): Kb . f_IJ for dQ, Qh . f_IJ for dK.
void pack_block_scaled(const Buffers& B, const Problem& p, const float* X, int x0, int x1, int other, bool rows_later) {
  const int D = p.dim;
  for (int x = x0; x < x1;) {
    const int blk = x / kGateSubChunk, end = std::min(x1, (blk + 1) * kGateSubChunk);
    if (rows_later) block_factor(B, D, blk * kGateSubChunk, (other + 1) * kGateSubChunk);
    else block_factor(B, D, other * kGateSubChunk, (blk + 1) * kGateSubChunk);
    for (int i = x; i < end; ++i)
#pragma omp simd
      for (int d = 0; d < D; ++d) B.rows[std::size_t(i - x0) * D + d] = X[std::size_t(i) * D + d] * B.f[d];
    x = end;
  }
  tile::pack(B.rows, D, false, x1 - x0, D, nullptr, B.Xp);
}

// dQ, dK, dV of one chunk from S^T entering it (panels STp) and dS leaving it (packed dSp); then
// dS <- the gradient of the state entering the chunk, and dg from S entering it.
void backward_chunk(const Buffers& B, const Problem& p, int n, const float* q, const float* k, const float* v,
                    const float* g, const float* dO, const float* STp, float* dq, float* dk, float* dv, float* dg,
                    const float* u = nullptr, double* du = nullptr) {
  const int D = p.dim, Dv = p.value_dim(), L = score_ld(effective_chunk(p));
  const float s = float(attention_scale(D));
  const bool scalar = p.decay == Decay::scalar;
  gate_operands(B, p, n, q, k, g);
  scores(B, p, n, q, k, s, u);  // P = s A
  tile::pack(v, Dv, true, Dv, n, nullptr, B.Vtp);
  Product da = rows_product(B.dA, L, n, n, seg(Range::full, Dv, dO, Dv, 1, B.Vtp), s);
  da.mask = scalar ? B.mask : B.ones;
  da.ldm = L;
  da.mask_all = scalar;
  da.lower = true;
  tile::run(da);
  tile::transpose_packed(B.dSp, D, Dv, B.dSTp);
  tile::pack(dO, Dv, false, n, Dv, nullptr, B.dOp);

  // dV = P^T dO + KG dS (scalar: gam . (K dS)).
  Product dvp = rows_product(dv, Dv, n, Dv, seg(Range::full, D, scalar ? k : B.KG, D, 1, B.dSp));
  dvp.rs = scalar ? B.EK : nullptr;
  dvp.s2 = seg(Range::upper, n, B.A, 1, L, B.dOp);
  tile::run(dvp);
  if (scalar) {
    // dQ = s lam . (dO S^T) + dA K,  dK = gam . (V dS^T) + dA^T Q.
    tile::pack(k, D, false, n, D, nullptr, B.Vp);
    tile::pack(q, D, false, n, D, nullptr, B.Xp);
    for (int i = 0; i < n; ++i) B.tmp[i] = s * B.EQ[i];
    Product dqp = rows_product(dq, D, n, D, seg(Range::full, Dv, dO, Dv, 1, STp));
    dqp.rs = B.tmp;
    dqp.s2 = seg(Range::lower, n, B.dA, L, 1, B.Vp);
    tile::run(dqp);
    Product dkp = rows_product(dk, D, n, D, seg(Range::full, Dv, v, Dv, 1, B.dSTp));
    dkp.rs = B.EK;
    dkp.s2 = seg(Range::upper, n, B.dA, 1, L, B.Xp);
    tile::run(dkp);
  } else {
    tile::run(rows_product(dq, D, n, D, seg(Range::full, Dv, dO, Dv, 1, STp), s));
    tile::run(rows_product(dk, D, n, D, seg(Range::full, Dv, v, Dv, 1, B.dSTp)));
    const double* last = B.b + std::size_t(n - 1) * D;
    for (int i = 0; i < n; ++i) {
      const double* bi = B.b + std::size_t(i) * D;
      const std::size_t o = std::size_t(i) * D;
      if (!p.bonus) exp_of_difference(B.tmp_row, bi, nullptr, D);
      else if (i > 0) exp_of_difference(B.tmp_row, bi - D, nullptr, D);  // exp(bx_i)
      else std::fill_n(B.tmp_row, D, 1.0f);
      multiply(dq + o, B.tmp_row, D);
      exp_of_difference(B.tmp_row, last, bi, D);
      multiply(dk + o, B.tmp_row, D);
    }
    for (int I = 0; I < blocks_of(n); ++I) {
      const int i0 = I * kGateSubChunk, i1 = std::min(n, i0 + kGateSubChunk), m = i1 - i0;
      if (i0 > 0) {  // dQ_I += EQ . (dA_{I, <I} (Kb . f))
        pack_block_scaled(B, p, B.Kb, 0, i0, I, false);
        tile::run(rows_product(B.tmp, D, m, D, seg(Range::full, i0, B.dA + std::size_t(i0) * L, L, 1, B.Xp)));
        for (int e = 0; e < m * D; ++e) dq[std::size_t(i0) * D + e] += B.EQ[std::size_t(i0) * D + e] * B.tmp[e];
      }
      if (i1 < n) {  // dK_I += EK . (dA_{>I, I}^T (Qh . f))
        pack_block_scaled(B, p, B.Qh, i1, n, I, true);
        tile::run(rows_product(B.tmp, D, m, D, seg(Range::full, n - i1, B.dA + std::size_t(i1) * L + i0, 1, L, B.Xp)));
        for (int e = 0; e < m * D; ++e) dk[std::size_t(i0) * D + e] += B.EK[std::size_t(i0) * D + e] * B.tmp[e];
      }
      // Within the sub-chunk, w = exp(b_i - b_j) (bonus: exp(bx_i - b_j), from j = i - 1, after the
      // diagonal's bonus terms) as a running product.
      for (int i = i0; i < i1; ++i) {
        float* __restrict w = B.f;
        std::fill_n(w, D, 1.0f);
        float* __restrict dqi = dq + std::size_t(i) * D;
        const float* qi = q + std::size_t(i) * D;
        const float* dArow = B.dA + std::size_t(i) * L;
        if (p.bonus) {
          const float x = dArow[i];
          const float* __restrict ki = k + std::size_t(i) * D;
          float* __restrict dki = dk + std::size_t(i) * D;
#pragma omp simd
          for (int d = 0; d < D; ++d) {
            dqi[d] += x * u[d] * ki[d];
            dki[d] += x * u[d] * qi[d];
          }
        }
        for (int j = p.bonus ? i - 1 : i; j >= i0; --j) {
          const float* kj = k + std::size_t(j) * D;
          const float* aj = B.a + std::size_t(j) * D;
          float* __restrict dkj = dk + std::size_t(j) * D;
          const float x = dArow[j];
#pragma omp simd
          for (int d = 0; d < D; ++d) {
            dqi[d] += x * kj[d] * w[d];
            dkj[d] += x * qi[d] * w[d];
            w[d] *= aj[d];
          }
        }
      }
    }
  }

  // dS_c = diag(exp(b_{n-1})) dS + s QL^T dO; then dg = rowsum(dS_c . S_c) - prefix(q dq - k dk).
  if (scalar) {
    tile::pack(dO, Dv, false, n, Dv, B.EQ, B.dOp);
    state_product(B.dSp, D, Dv, n, q, B.dOp, s, B.decay[0]);
  } else {
    scale_state_rows(B.dSp, D, Dv, B.decay);
    state_product(B.dSp, D, Dv, n, B.QL, B.dOp, s, 1.0f);
  }
  rowsum_product(B.dSp, STp, D, Dv, B.sums);
  if (scalar) {
    double total = 0;
    for (int d = 0; d < D; ++d) total += B.sums[d];
    B.sums[0] = total;
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    if (scalar) {
      dg[i] = float(B.sums[0]);
      double step = 0;
#pragma omp simd reduction(+ : step)
      for (int d = 0; d < D; ++d) step += double(q[o + d]) * dq[o + d] - double(k[o + d]) * dk[o + d];
      B.sums[0] -= step;
    } else if (p.bonus) {  // - q_i . dq_i + beta_i (this file's header), and du
      const float x = B.dA[std::size_t(i) * L + i];
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        const double qk = double(q[o + d]) * k[o + d], qdq = double(q[o + d]) * dq[o + d];
        dg[o + d] = float(B.sums[d] - qdq + x * qk * u[d]);
        B.sums[d] -= qdq - double(k[o + d]) * dk[o + d];
        du[d] += x * qk;
      }
    } else {
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        dg[o + d] = float(B.sums[d]);
        B.sums[d] -= double(q[o + d]) * dq[o + d] - double(k[o + d]) * dk[o + d];
      }
    }
  }
}

// The forward's items are (sequence, value head) pairs; the backward's GradParts' items.
// Scalar gates share Q K^T among a group's value heads: the forward's items are then GradParts'
// (sequence, q/k head, part), each part's value heads walking the chunks side by side.
bool shares_scores(const Problem& p) { return p.decay == Decay::scalar && p.group() > 1; }

std::size_t forward_item_count(const Problem& p) {
  return shares_scores(p) ? GradParts(p, omp_get_max_threads()).items : p.slices();
}

// The value heads of the largest part (0 when unshared).
int shared_heads(const Problem& p) {
  if (!shares_scores(p)) return 0;
  const int parts = GradParts(p, omp_get_max_threads()).parts;
  return (p.group() + parts - 1) / parts;
}

int forward_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), forward_item_count(p)));
}
std::size_t thread_floats(const Problem& p, bool backward, bool own_states) {
  return carve(p, nullptr, backward, own_states, backward ? 0 : shared_heads(p)).used;
}

int backward_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), GradParts(p, omp_get_max_threads()).items));
}

// S entering each chunk of one item, recomputed: the forward's state products alone (the outputs
// are not needed, so the scores are skipped), as S^T panels into `states`.
void recompute_states(const Buffers& B, const Problem& p, const HeadSlice& sl, const float* q, const float* k,
                      const float* v, const float* g, const float* h0, float* states) {
  const int D = p.dim, Dv = p.value_dim(), chunks = chunks_of(p, sl.seq);
  const std::size_t SF = value_state_floats(p);
  tile::pack(h0, Dv, false, D, Dv, nullptr, B.Sp);
  for (int c = 0; c < chunks; ++c) {
    const Chunk ch = chunk_at(p, sl.seq, c);
    tile::transpose_packed(B.Sp, D, Dv, states + c * SF);
    if (c + 1 == chunks) break;
    gate_operands(B, p, ch.n, q + ch.rk, k + ch.rk, g + ch.rg);
    if (p.decay == Decay::scalar) {
      tile::pack(v + ch.rv, Dv, false, ch.n, Dv, B.EK, B.Vp);
      state_product(B.Sp, D, Dv, ch.n, k + ch.rk, B.Vp, 1.0f, B.decay[0]);
    } else {
      tile::pack(v + ch.rv, Dv, false, ch.n, Dv, nullptr, B.Vp);
      scale_state_rows(B.Sp, D, Dv, B.decay);
      state_product(B.Sp, D, Dv, ch.n, B.KG, B.Vp, 1.0f, 1.0f);
    }
  }
}

}  // namespace

std::size_t chunked_gated_kept_states_floats(const Problem& p) { return item_chunks(p) * value_state_floats(p); }

std::size_t chunked_gated_forward_floats(const Problem& p) {
  return std::size_t(forward_threads(p)) * thread_floats(p, false, false) + order_floats(p, forward_item_count(p));
}

namespace {

// One shared forward item: chunk by chunk, Q K^T once, then each value head [h0, h1) of the
// sequence from its own gates and state (the thread's states, one after another).
void forward_shared_item(const Buffers& B, const Problem& p, const ForwardArgs<float>& a, float* keep, int sequence,
                         int h0, int h1) {
  const int D = p.dim, Dv = p.value_dim();
  const std::size_t SF = value_state_floats(p), KSF = key_state_floats(p);
  const HeadSlice first = p.slice(std::size_t(sequence) * p.heads + h0);
  const float *q = a.q + first.key, *k = a.k + first.key;
  for (int h = h0; h < h1; ++h) {
    const HeadSlice sl = p.slice(std::size_t(sequence) * p.heads + h);
    tile::pack(a.h0 + sl.state, Dv, false, D, Dv, nullptr, B.Sp + (h - h0) * KSF);
  }
  for (int c = 0; c < chunks_of(p, first.seq); ++c) {
    const Chunk ch = chunk_at(p, first.seq, c);
    shared_scores(B, p, ch.n, q + ch.rk, k + ch.rk);
    for (int h = h0; h < h1; ++h) {
      const std::size_t index = std::size_t(sequence) * p.heads + h;
      const HeadSlice sl = p.slice(index);
      Buffers head = B;
      head.Sp = B.Sp + (h - h0) * KSF;
      if (keep) tile::transpose_packed(head.Sp, D, Dv, keep + (item_chunk_offset(p, index) + c) * SF);
      forward_chunk_shared(head, p, ch.n, q + ch.rk, k + ch.rk, a.v + sl.value + ch.rv, a.g + sl.gate + ch.rg,
                           a.o + sl.value + ch.rv);
    }
  }
  for (int h = h0; h < h1; ++h) {
    const HeadSlice sl = p.slice(std::size_t(sequence) * p.heads + h);
    tile::unpack(B.Sp + (h - h0) * KSF, D, Dv, a.hT + sl.state, Dv);
  }
}

}  // namespace

namespace {

// The bonus form's du per (sequence, value head), in double: 2 floats each, and one to align them.
std::size_t bonus_partial_floats(const Problem& p) { return p.bonus ? 2 * p.slices() * std::size_t(p.dim) + 1 : 0; }

}  // namespace

std::size_t chunked_gated_backward_floats(const Problem& p, bool kept) {
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(backward_threads(p)) * thread_floats(p, true, !kept) +
         order_floats(p, parts.items) + bonus_partial_floats(p);
}

void chunked_gated_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  const int D = p.dim, Dv = p.value_dim();
  const std::size_t per_thread = thread_floats(p, false, false), SF = value_state_floats(p);
  const std::size_t threads_floats = std::size_t(forward_threads(p)) * per_thread;
  Workspace<float> scratch(allocator, threads_floats + order_floats(p, forward_item_count(p)));
  // The order list (packed problems) after the threads' blocks.
  int* order = p.packed() ? reinterpret_cast<int*>(scratch.data() + threads_floats) : nullptr;
  longest_first(p, forward_item_count(p),
                shares_scores(p) ? GradParts(p, omp_get_max_threads()).per_sequence(p) : std::size_t(p.heads), order);
#pragma omp parallel num_threads(forward_threads(p))
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, false, false, shared_heads(p));
    if (shares_scores(p)) {
      GradParts(p, omp_get_max_threads()).for_items(p, order, [&](int sequence, int h0, int h1) {
        forward_shared_item(B, p, a, keep, sequence, h0, h1);
      });
    } else {
// Items in order (a packed problem's longest documents first): the value heads of one q/k head
// run side by side on the threads, so its rows come from memory once and from the shared cache
// for the others.
#pragma omp for schedule(dynamic, 1)
      for (long pick = 0; pick < long(p.slices()); ++pick) {
        const std::size_t item = item_at(order, pick);
        const HeadSlice sl = p.slice(item);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value, *g = a.g + sl.gate;
        float* o = a.o + sl.value;
        float* kept = keep ? keep + item_chunk_offset(p, item) * SF : nullptr;
        tile::pack(a.h0 + sl.state, Dv, false, D, Dv, nullptr, B.Sp);
        for (int c = 0; c < chunks_of(p, sl.seq); ++c) {
          const Chunk ch = chunk_at(p, sl.seq, c);
          if (kept) tile::transpose_packed(B.Sp, D, Dv, kept + c * SF);
          forward_chunk(B, p, ch.n, q + ch.rk, k + ch.rk, v + ch.rv, g + ch.rg, o + ch.rv,
                        p.bonus ? a.u + std::size_t(sl.head) * D : nullptr);
        }
        tile::unpack(B.Sp, D, Dv, a.hT + sl.state, Dv);
      }
    }
  }
}

void chunked_gated_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  const int D = p.dim, Dv = p.value_dim();
  const bool grouped = p.group() > 1;
  const GradParts parts(p, omp_get_max_threads());
  const std::size_t per_thread = thread_floats(p, true, !kept), SF = value_state_floats(p);
  const std::size_t threads_floats = std::size_t(backward_threads(p)) * per_thread;
  Workspace<float> scratch(allocator, parts.partial_floats(p) + threads_floats + order_floats(p, parts.items) +
                                          bonus_partial_floats(p));
  float* partials = scratch.data();
  // The order list (packed problems) after the partials and the threads' blocks; the bonus's du
  // sums after it, at an even float (the order list may hold an odd number of ints).
  int* order = p.packed() ? reinterpret_cast<int*>(scratch.data() + parts.partial_floats(p) + threads_floats) : nullptr;
  const std::size_t du_at = parts.partial_floats(p) + threads_floats + order_floats(p, parts.items);
  double* du_sums = p.bonus ? reinterpret_cast<double*>(scratch.data() + (du_at + 1) / 2 * 2) : nullptr;
  longest_first(p, parts.items, parts.per_sequence(p), order);
#pragma omp parallel num_threads(backward_threads(p))
  {
    const Buffers B =
        carve(p, scratch.data() + parts.partial_floats(p) + omp_get_thread_num() * per_thread, true, !kept);
    fill_lower_ones(B.ones, effective_chunk(p));  // dA's mask for vector gates
#pragma omp for schedule(dynamic, 1)
    for (long pick = 0; pick < long(parts.items); ++pick) {
      const GradParts::Item it = parts.item(p, item_at(order, pick), a.dq, a.dk, partials);
      for (int h = it.h0; h < it.h1; ++h) {
        const std::size_t index = std::size_t(it.sequence) * p.heads + h;
        const HeadSlice sl = p.slice(index);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value, *dO = a.dO + sl.value;
        const float* g = a.g + sl.gate;
        float* dg = a.dg + sl.gate;
        const float* states = kept ? kept + item_chunk_offset(p, index) * SF : B.states;  // S^T entering each chunk
        const float* u = p.bonus ? a.u + std::size_t(sl.head) * D : nullptr;
        double* du = du_sums ? du_sums + index * D : nullptr;
        if (du) std::fill_n(du, D, 0.0);
        if (!kept) recompute_states(B, p, sl, q, k, v, g, a.h0 + sl.state, B.states);
        tile::pack(a.dhT + sl.state, Dv, false, D, Dv, nullptr, B.dSp);
        for (int c = chunks_of(p, sl.seq) - 1; c >= 0; --c) {
          const Chunk ch = chunk_at(p, sl.seq, c);
          // dg needs this value head's own dq and dk: with a shared q/k head they go to this
          // thread's rows first, then into the sum.
          float* dq = grouped ? B.hdq : it.dq + sl.key + ch.rk;
          float* dk = grouped ? B.hdk : it.dk + sl.key + ch.rk;
          backward_chunk(B, p, ch.n, q + ch.rk, k + ch.rk, v + ch.rv, g + ch.rg, dO + ch.rv, states + c * SF, dq, dk,
                         a.dv + sl.value + ch.rv, dg + ch.rg, u, du);
          if (!grouped) continue;
          float *__restrict dq_rows = it.dq + sl.key + ch.rk, *__restrict dk_rows = it.dk + sl.key + ch.rk;
          const int e1 = ch.n * D;
          if (h == it.h0) {
            std::copy(B.hdq, B.hdq + e1, dq_rows);
            std::copy(B.hdk, B.hdk + e1, dk_rows);
          } else {
#pragma omp simd
            for (int e = 0; e < e1; ++e) dq_rows[e] += B.hdq[e];
#pragma omp simd
            for (int e = 0; e < e1; ++e) dk_rows[e] += B.hdk[e];
          }
        }
        tile::unpack(B.dSp, D, Dv, a.dh0 + sl.state, Dv);
      }
    }
    parts.reduce(p, a.dq, a.dk, partials);
    if (du_sums) {
#pragma omp for schedule(static)
      for (int head = 0; head < p.heads; ++head)
        for (int d = 0; d < D; ++d) {
          double sum = 0;
          for (int n = 0; n < p.sequences(); ++n) sum += du_sums[(std::size_t(n) * p.heads + head) * D + d];
          a.du[std::size_t(head) * D + d] = float(sum);
        }
    }
  }
}

}  // namespace lattn::cpu

// What the AMX kernels for vector gates (cpu/chunked/chunked_amx_gated.cpp) and for the delta rule
// (cpu/chunked/chunked_amx_delta.cpp) share: a bf16 tile product on float32 operands of any shape,
// a chunk's cumulative gates, and the gated scores and their gradients, sub-chunked for vector gates
// as the float32 kernels are (cpu/chunked/chunked_gated.cpp). Plain C++ around amx::gemm
// (kernels/cpu/amx_gemm.hpp): both files run it on the emulated tiles on any CPU.
//
// product(): C = alpha op(A) op(B) (+ C), A and B float32 (token rows widened exactly from bf16, or
// float32 intermediates: gated operands, scores, states), each element rounded to bf16 (to nearest
// even) once as it is packed, zero-padded to whole tiles (M and N to 16, K to 32: any dims, ragged
// D and short chunks included), the tile products accumulating in float32 into a padded buffer,
// then alpha and the accumulation in float32.
//
// Gates. b_i is the chunk's cumulative log-decay up to row i, in double: per key channel for vector
// gates (W = Dk), one per row otherwise (W = 1: 0 for none, (i + 1) ln gamma for retnet, the running
// sum of g for scalar gates). The gated score of rows i >= j is x_i . exp(b_i - b_j) . k_j, every
// factor exp of a difference <= 0, so strong gates never overflow:
//   W = 1: one tile product X K^T, then the mask alpha exp(b_i - b_j) in float32 on its result;
//   W = Dk: sub-chunks of kGateSubChunk rows. Between sub-chunks I > J, with r_I = b at the row
//     before I and e_J = b at J's last row, exp(b_i - b_j) = exp(b_i - r_I) exp(r_I - e_J)
//     exp(e_J - b_j), three factors <= 1 applied to the operands before they are rounded to bf16:
//     Xh = X . exp(b - r_I) (A), Kb . f_IJ = K . exp(e_J - b) . exp(r_I - e_J) (B), one product per
//     row block I over all J < I. Within a sub-chunk the pairs are summed in float32 from the bf16
//     rows by the float32 kernels' lane_scores (cpu/chunked/chunk_products.hpp: w = exp(b_i - b_j)
//     a running product of exp(g), the rows in the vector lanes).
// The work beside the tiles is the float32 kernels' vectorised forms, shared: the gate factors'
// exp_nonpositive (kernels/cpu/exp.hpp) over rows of differences taken in double, lane_scores, and
// the delta rule's forward substitution (cpu/chunked/unit_lower_inverse.hpp); the packing of a
// product's operands takes its layout's branch outside its loops. amx::Counted (kernels/cpu/
// amx_counted.hpp) runs all of it with the tile instructions taken out, so that it can be timed on
// any CPU.
// The gradients (score_grads) are the same products transposed: dX_i += sum_j dP_ij exp(b_i - b_j)
// k_j and dK_j += sum_i dP_ij exp(b_i - b_j) x_i, with the factors on dP (scalar: the mask) or on
// the operands and the outputs (vector: Kb . f_IJ and Xh . f_IJ as B, then EQ = exp(b - r_I) or
// EK = exp(e_J - b) on the result rows).
//
// Drivers (run_forward, run_backward, on_path): both kernels walk (sequence, value head) items,
// forward one per slice, backward GradParts' groups (a part of a q/k head's value heads on one
// thread, adding into its dq and dk), each thread on its own carved scratch and tile configuration.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/workspace.hpp"
#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_amx_parts.hpp"

namespace lattn::cpu::amx_tiles {

using amx_chunked::from_bf16;
using amx_chunked::on_path;
using amx_chunked::pair_of;
using amx_chunked::round_up;
using amx_chunked::to_bf16;

constexpr int kMaxDim = 256, kMaxChunk = 256;
constexpr int kSub = kGateSubChunk;

inline std::optional<std::string> limits(const Problem& p) {
  if (p.dim > kMaxDim || p.value_dim() > kMaxDim) return std::string("dim and dim_v up to 256 only");
  if (p.chunk > kMaxChunk) return std::string("chunk up to 256 only");
  return std::nullopt;
}

// A float32 operand: element (r, c) at x[r ld + c], or at x[c ld + r] where transposed.
struct Operand {
  const float* x;
  std::size_t ld;
  bool transposed = false;
  float at(int r, int c) const {
    return transposed ? x[std::size_t(c) * ld + r] : x[std::size_t(r) * ld + c];
  }
};
inline Operand rows(const float* x, std::size_t ld) { return {x, ld, false}; }
inline Operand cols(const float* x, std::size_t ld) { return {x, ld, true}; }

// Which operands a product splits into two bf16 parts (high + low, above): each split operand adds
// one tile product against the other's high part (the low x low term, ~2^-18, is left out).
enum class Split { none = 0, a = 1, b = 2, both = 3 };
inline bool splits(Split s, Split x) { return (int(s) & int(x)) != 0; }

// A thread's packing buffers for products whose dims are at most P (a multiple of 32), and the
// operands every product on them splits (Split::none but where a row asks for more precision).
struct Packing {
  Bf16* a = nullptr;           // [P][P] bf16
  std::uint32_t* b = nullptr;  // [P / 2][P] pairs
  float* c = nullptr;          // [P][P] float32
  Split split = Split::none;
  static std::size_t words(int P) { return std::size_t(P) * P / 2 + std::size_t(P) / 2 * P + std::size_t(P) * P; }
  Packing() = default;
  Packing(float* w, int P)
      : a(reinterpret_cast<Bf16*>(w)),
        b(reinterpret_cast<std::uint32_t*>(w + std::size_t(P) * P / 2)),
        c(w + std::size_t(P) * P) {}
};

// Widens n rows of bf16 (ld cols) to float32, zero to row `to`.
inline void widen_rows(const Bf16* __restrict x, int n, int to, int cols, float* __restrict out) {
  const std::size_t count = std::size_t(n) * cols;
#pragma omp simd
  for (std::size_t e = 0; e < count; ++e) out[e] = from_bf16(x[e]);
  std::fill(out + count, out + std::size_t(to) * cols, 0.0f);
}

// out[e] += x[e] y[e].
inline void add_product(float* __restrict out, const float* __restrict x, const float* __restrict y, int count) {
#pragma omp simd
  for (int e = 0; e < count; ++e) out[e] += x[e] * y[e];
}

// The largest dim of a problem's products, rounded up to 32.
inline int product_dim(const Problem& p) {
  return round_up(std::max({effective_chunk(p), p.dim, p.value_dim(), 1}), amx::kTileDepth);
}

// x rounded to bf16 (Part::high), or what that rounding left, rounded in turn (Part::low): high +
// low carries 16 significant bits, an operand split so is good to ~2^-17 of itself.
enum class Part { high, low };
template <Part P>
inline Bf16 part_of(float x) {
  if constexpr (P == Part::high) return to_bf16(x);
  return to_bf16(x - from_bf16(to_bf16(x)));
}

// op(A) (M x K) rounded to bf16 rows of K32 (ld), zero-padded to M16 rows and K32 columns. The
// layout's branch is taken once, outside the loops, so that the rows' loops vectorise.
template <Part P = Part::high>
void pack_a(Operand A, int M, int K, int M16, int K32, Bf16* out) {
  for (int r = 0; r < M; ++r) {
    Bf16* __restrict row = out + std::size_t(r) * K32;
    if (!A.transposed) {
      const float* __restrict x = A.x + std::size_t(r) * A.ld;
#pragma omp simd
      for (int c = 0; c < K; ++c) row[c] = part_of<P>(x[c]);
    } else {
      for (int c = 0; c < K; ++c) row[c] = part_of<P>(A.x[std::size_t(c) * A.ld + r]);
    }
    std::fill(row + K, row + K32, Bf16(0));
  }
  std::fill(out + std::size_t(M) * K32, out + std::size_t(M16) * K32, Bf16(0));
}

// op(B) (K x N) as VNNI pairs of rows rounded to bf16: row p of N16 words holds (B[2p][c],
// B[2p + 1][c]), zero past row K and column N.
template <Part P = Part::high>
void pack_b(Operand B, int K, int N, int K32, int N16, std::uint32_t* out) {
  const int full = K / 2;  // pairs with both rows inside K
  if (!B.transposed) {
    for (int pr = 0; pr < full; ++pr) {
      std::uint32_t* __restrict row = out + std::size_t(pr) * N16;
      const float* __restrict lo = B.x + std::size_t(2 * pr) * B.ld;
      const float* __restrict hi = lo + B.ld;
#pragma omp simd
      for (int c = 0; c < N; ++c) row[c] = pair_of(part_of<P>(lo[c]), part_of<P>(hi[c]));
    }
    if (K % 2) {
      std::uint32_t* __restrict row = out + std::size_t(full) * N16;
      const float* __restrict lo = B.x + std::size_t(K - 1) * B.ld;
#pragma omp simd
      for (int c = 0; c < N; ++c) row[c] = part_of<P>(lo[c]);
    }
  } else {  // column c of op(B) is row c of x: its pairs are adjacent
    for (int c = 0; c < N; ++c) {
      const float* __restrict x = B.x + std::size_t(c) * B.ld;
      for (int pr = 0; pr < full; ++pr)
        out[std::size_t(pr) * N16 + c] = pair_of(part_of<P>(x[std::size_t(2) * pr]), part_of<P>(x[std::size_t(2) * pr + 1]));
      if (K % 2) out[std::size_t(full) * N16 + c] = part_of<P>(x[K - 1]);
    }
  }
  const int used = (K + 1) / 2;
  for (int pr = 0; pr < used; ++pr) std::fill(out + std::size_t(pr) * N16 + N, out + std::size_t(pr + 1) * N16, 0u);
  std::fill(out + std::size_t(used) * N16, out + std::size_t(K32 / 2) * N16, 0u);
}

// C (M x N, ldc) = alpha op(A) op(B) (+ C where `accumulate`), op(A) M x K, op(B) K x N.
template <class Tiles>
void product(const Packing& s, int M, int N, int K, Operand A, Operand B, float* C, std::size_t ldc, float alpha,
             bool accumulate, Split split = Split::none) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int r = 0; r < M; ++r) std::fill_n(C + std::size_t(r) * ldc, N, 0.0f);
    return;
  }
  const int M16 = round_up(M, amx::kTileRows), N16 = round_up(N, amx::kTileRows), K32 = round_up(K, amx::kTileDepth);
  const auto gemm = [&](bool add) {
    amx::gemm<Tiles>(M16, N16, K32, s.a, std::size_t(K32), s.b, std::size_t(N16), s.c, std::size_t(N16), add);
  };
  split = Split(int(split) | int(s.split));
  pack_a(A, M, K, M16, K32, s.a);
  pack_b(B, K, N, K32, N16, s.b);
  gemm(false);
  if (splits(split, Split::a)) {  // A's low part against B's high part
    pack_a<Part::low>(A, M, K, M16, K32, s.a);
    gemm(true);
  }
  if (splits(split, Split::b)) {  // A's high part against B's low part
    if (splits(split, Split::a)) pack_a(A, M, K, M16, K32, s.a);
    pack_b<Part::low>(B, K, N, K32, N16, s.b);
    gemm(true);
  }
  for (int r = 0; r < M; ++r) {
    float* out = C + std::size_t(r) * ldc;
    const float* in = s.c + std::size_t(r) * N16;
    if (accumulate)
      for (int c = 0; c < N; ++c) out[c] += alpha * in[c];
    else
      for (int c = 0; c < N; ++c) out[c] = alpha * in[c];
  }
}

// A chunk's cumulative gates (above): b[i W + w].
struct Gates {
  const double* b = nullptr;
  int n = 0, W = 1;
  double at(int i, int d) const { return b[std::size_t(i) * W + (W == 1 ? 0 : d)]; }
  bool vector() const { return W > 1; }
};

// b for n rows: g the chunk's gates (null for none and retnet), W per row.
inline Gates cumulate(int n, int W, const float* g, double log_gamma, double* b) {
  for (int i = 0; i < n; ++i) {
    double* __restrict bi = b + std::size_t(i) * W;
    const double* __restrict prev = bi - W;
    const float* __restrict gi = g ? g + std::size_t(i) * W : nullptr;
    if (gi && i > 0) {
#pragma omp simd
      for (int w = 0; w < W; ++w) bi[w] = prev[w] + double(gi[w]);
    } else if (gi) {
      for (int w = 0; w < W; ++w) bi[w] = double(gi[w]);
    } else {
      for (int w = 0; w < W; ++w) bi[w] = (i > 0 ? prev[w] : 0.0) + log_gamma;
    }
  }
  return {b, n, W};
}

// The gate factors below are exp of differences <= 0, the differences taken in double, each
// exponential the float32 kernels' vectorised exp_nonpositive (kernels/cpu/exp.hpp, through
// exp_of_difference and exp_in_place of cpu/chunked/chunk_products.hpp).

// A thread's buffers for the gated scores (vector gates only): five C x Dk (EQ = exp(b - r_I),
// EK = exp(e_J - b), a = exp(g), Xh = X . EQ, B a product's operand), then `rows` (C x Dk, and at
// least lane_scores' Dk x kLaneRows), and f (Dk: one factor row).
struct ScoreWork {
  float *EQ, *EK, *a, *Xh, *B, *rows, *f;
  static std::size_t rows_floats(const Problem& p) {
    return std::size_t(std::max(effective_chunk(p), kLaneRows)) * p.dim;
  }
  static std::size_t floats(const Problem& p) {
    return p.decay == Decay::vector ? 5 * std::size_t(effective_chunk(p)) * p.dim + rows_floats(p) + p.dim : 0;
  }
  ScoreWork(float* w, const Problem& p) {
    const bool vector = p.decay == Decay::vector;
    const std::size_t x = vector ? std::size_t(effective_chunk(p)) * p.dim : 0;
    EQ = w, EK = w + x, a = w + 2 * x, Xh = w + 3 * x, B = w + 4 * x, rows = w + 5 * x;
    f = rows + (vector ? rows_floats(p) : 0);
  }
};

// The vector gates' factors of one chunk: EQ, EK and exp(g), n x D.
inline void gate_factors(const Gates& g, int D, const ScoreWork& s) {
  if (!g.vector()) return;
  for (int i0 = 0; i0 < g.n; i0 += kSub) {
    const int i1 = std::min(g.n, i0 + kSub);
    const double* r = i0 > 0 ? g.b + std::size_t(i0 - 1) * D : nullptr;
    const double* e = g.b + std::size_t(i1 - 1) * D;
    for (int i = i0; i < i1; ++i) {
      const std::size_t o = std::size_t(i) * D;
      const double* bi = g.b + o;
      exp_of_difference(s.EQ + o, bi, r, D);
      exp_of_difference(s.EK + o, e, bi, D);
      exp_of_difference(s.a + o, bi, i > 0 ? bi - D : nullptr, D);
    }
  }
}

// A chunk's row factors, n x D: EB = exp(b), EL = exp(b_{n-1} - b), and decay = exp(b_{n-1}) (D);
// with W = 1 each row's one factor across its D channels.
inline void chunk_factors(const Gates& g, int D, float* EB, float* EL, float* decay) {
  const int n = g.n;
  const double* last = g.b + std::size_t(n - 1) * g.W;
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    const double* bi = g.b + std::size_t(i) * g.W;
    if (g.vector()) {
      exp_of_difference(EB + o, bi, nullptr, D);
      exp_of_difference(EL + o, last, bi, D);
    } else {
      std::fill_n(EB + o, D, exp_nonpositive(float(bi[0])));
      std::fill_n(EL + o, D, exp_nonpositive(float(last[0] - bi[0])));
    }
  }
  if (g.vector())
    exp_of_difference(decay, last, nullptr, D);
  else
    std::fill_n(decay, D, exp_nonpositive(float(last[0])));
}

// out[j][d] = X[j][d] f[d] with f = exp(r_I - e_{J(j)}) for rows [x0, x1) of X, J(j) the sub-chunk
// of row j, I the sub-chunk `other` (rows_later: X's rows lie after I's, and the roles swap); one
// factor row per sub-chunk of X's rows, in f.
inline void scale_blocks(const Gates& g, int D, const float* X, int x0, int x1, int other, bool rows_later,
                         float* out, float* f) {
  for (int blk = x0 / kSub; blk * kSub < x1; ++blk) {
    const int I = rows_later ? blk : other, J = rows_later ? other : blk;
    const int ri = I * kSub - 1, ej = std::min(g.n, (J + 1) * kSub) - 1;
    exp_of_difference(f, g.b + std::size_t(ri) * D, g.b + std::size_t(ej) * D, D);
    for (int x = std::max(x0, blk * kSub); x < std::min(x1, (blk + 1) * kSub); ++x)
      multiply_into(out + std::size_t(x - x0) * D, X + std::size_t(x) * D, f, D);
  }
}

// row[j] = exp(b_i - b_j) for j <= last (scalar gates: W = 1).
inline void mask_row(const Gates& g, int i, int last, float* row) {
  const double bi = g.b[i];
#pragma omp simd
  for (int j = 0; j <= last; ++j) row[j] = float(bi - g.b[j]);
  exp_in_place(row, last + 1);
}

// S[i][j] = alpha x_i . exp(b_i - b_j) . k_j for j <= i (j < i where `strict`), 0 elsewhere up to
// column n; X, K: n x D rows (ld D); S: n rows of ld ldS.
template <class Tiles>
void gated_scores(const Packing& pk, const ScoreWork& sw, const Gates& g, int D, const float* X, const float* K,
                  bool strict, float alpha, float* S, std::size_t ldS) {
  const int n = g.n;
  if (!g.vector()) {
    for (int m0 = 0; m0 < n; m0 += 2 * amx::kTileRows) {
      const int m1 = std::min(n, m0 + 2 * amx::kTileRows);
      product<Tiles>(pk, m1 - m0, m1, D, rows(X + std::size_t(m0) * D, D), cols(K, D), S + std::size_t(m0) * ldS, ldS,
                     1.0f, false);
    }
    alignas(64) float mask[kMaxChunk];
    for (int i = 0; i < n; ++i) {
      float* __restrict row = S + std::size_t(i) * ldS;
      const int last = strict ? i - 1 : i;
      mask_row(g, i, last, mask);
#pragma omp simd
      for (int j = 0; j <= last; ++j) row[j] *= alpha * mask[j];
      std::fill(row + last + 1, row + n, 0.0f);
    }
    return;
  }
  multiply_into(sw.Xh, X, sw.EQ, n * D);
  for (int i0 = 0; i0 < n; i0 += kSub) {
    const int i1 = std::min(n, i0 + kSub), I = i0 / kSub;
    if (i0 > 0) {  // S_{I, <I} = alpha Xh_I (Kb . f_IJ)^T
      multiply_into(sw.rows, K, sw.EK, i0 * D);
      scale_blocks(g, D, sw.rows, 0, i0, I, false, sw.B, sw.f);
      product<Tiles>(pk, i1 - i0, i0, D, rows(sw.Xh + std::size_t(i0) * D, D), cols(sw.B, D),
                     S + std::size_t(i0) * ldS, ldS, alpha, false);
    }
    // Within the sub-chunk: the float32 kernels' lane_scores (a running product of exp(g), the rows
    // in the vector lanes), then zero above the diagonal (and on it where `strict`).
    lane_scores<1>(D, i0, i1, i0, K, sw.a, {X}, {alpha}, {S}, long(ldS), sw.rows);
    for (int i = i0; i < i1; ++i) {
      float* row = S + std::size_t(i) * ldS;
      if (strict) row[i] = 0.0f;
      std::fill(row + i + 1, row + n, 0.0f);
    }
  }
}

// dX (n x D) += the X side of dP's scores, dK (n x D) += the K side: dX_i += sum_j dP_ij exp(b_i -
// b_j) k_j, dK_j += sum_i dP_ij exp(b_i - b_j) x_i, dP n x n (ld ldP) zero where the scores are.
// tmp: n x max(n, D) floats.
template <class Tiles>
void score_grads(const Packing& pk, const ScoreWork& sw, const Gates& g, int D, const float* X, const float* K,
                 const float* dP, std::size_t ldP, float* dX, float* dK, float* tmp) {
  const int n = g.n;
  if (!g.vector()) {
    for (int i = 0; i < n; ++i) {
      float* __restrict row = tmp + std::size_t(i) * n;
      const float* __restrict dp = dP + std::size_t(i) * ldP;
      mask_row(g, i, i, row);
#pragma omp simd
      for (int j = 0; j <= i; ++j) row[j] *= dp[j];
      std::fill(row + i + 1, row + n, 0.0f);
    }
    product<Tiles>(pk, n, D, n, rows(tmp, n), rows(K, D), dX, D, 1.0f, true);
    product<Tiles>(pk, n, D, n, cols(tmp, n), rows(X, D), dK, D, 1.0f, true);
    return;
  }
  multiply_into(sw.Xh, X, sw.EQ, n * D);
  for (int i0 = 0; i0 < n; i0 += kSub) {
    const int i1 = std::min(n, i0 + kSub), I = i0 / kSub, m = i1 - i0;
    if (i0 > 0) {  // dX_I += EQ . (dP_{I, <I} (Kb . f_IJ))
      multiply_into(sw.rows, K, sw.EK, i0 * D);
      scale_blocks(g, D, sw.rows, 0, i0, I, false, sw.B, sw.f);
      product<Tiles>(pk, m, D, i0, rows(dP + std::size_t(i0) * ldP, ldP), rows(sw.B, D), tmp, D, 1.0f, false);
      add_product(dX + std::size_t(i0) * D, sw.EQ + std::size_t(i0) * D, tmp, m * D);
    }
    if (i1 < n) {  // dK_I += EK . (dP_{>I, I}^T (Xh . f_JI))
      scale_blocks(g, D, sw.Xh, i1, n, I, true, sw.B, sw.f);
      product<Tiles>(pk, m, D, n - i1, cols(dP + std::size_t(i1) * ldP + i0, ldP), rows(sw.B, D), tmp, D, 1.0f,
                     false);
      add_product(dK + std::size_t(i0) * D, sw.EK + std::size_t(i0) * D, tmp, m * D);
    }
    for (int i = i0; i < i1; ++i) {  // within the sub-chunk: w = exp(b_i - b_j), a running product
      float* __restrict w = tmp;
      std::fill_n(w, D, 1.0f);
      const float* __restrict xi = X + std::size_t(i) * D;
      float* __restrict dxi = dX + std::size_t(i) * D;
      for (int j = i; j >= i0; --j) {
        const float* __restrict kj = K + std::size_t(j) * D;
        const float* __restrict aj = sw.a + std::size_t(j) * D;
        float* __restrict dkj = dK + std::size_t(j) * D;
        const float x = dP[std::size_t(i) * ldP + j];
#pragma omp simd
        for (int d = 0; d < D; ++d) {
          const float xw = x * w[d];
          dxi[d] += xw * kj[d];
          dkj[d] += xw * xi[d];
          w[d] *= aj[d];
        }
      }
    }
  }
}

inline int forward_threads(const Problem& p) { return amx_chunked::items_threads(p); }

inline int backward_threads(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(omp_get_max_threads()), parts.items)));
}

// Walker<Tiles>(p, buffers): forward_item(a, slice) and backward_item(a, slice, dq, dk, accumulate);
// carve(p, base, backward): a thread's buffers at `base` (null: only its `used` floats).
template <template <class> class Walker, class Tiles, class Carve>
void run_forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator, Carve carve) {
  const std::size_t per = carve(p, nullptr, false).used;
  const int threads = forward_threads(p);
  Workspace<float> scratch(allocator, std::size_t(threads) * per);
#pragma omp parallel num_threads(threads)
  {
    const auto buffers = carve(p, scratch.data() + std::size_t(omp_get_thread_num()) * per, false);
    const Walker<Tiles> walk(p, buffers);
    amx::configure<Tiles>();
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < long(p.slices()); ++i) walk.forward_item(a, p.slice(std::size_t(i)));
    Tiles::release();
  }
}

template <template <class> class Walker, class Tiles, class Carve>
void run_backward(const Problem& p, const Bf16BackwardArgs& a, Allocator& allocator, Carve carve) {
  const std::size_t per = carve(p, nullptr, true).used;
  const GradParts parts(p, omp_get_max_threads());
  const int threads = backward_threads(p);
  Workspace<float> scratch(allocator, parts.partial_floats(p) + std::size_t(threads) * per);
  float* partials = scratch.data();
#pragma omp parallel num_threads(threads)
  {
    const auto buffers =
        carve(p, scratch.data() + parts.partial_floats(p) + std::size_t(omp_get_thread_num()) * per, true);
    const Walker<Tiles> walk(p, buffers);
    amx::configure<Tiles>();
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < long(parts.items); ++i) {
      const GradParts::Item it = parts.item(p, std::size_t(i), a.dq, a.dk, partials);
      for (int h = it.h0; h < it.h1; ++h) {
        const HeadSlice item = p.slice(std::size_t(it.sequence) * p.heads + h);
        walk.backward_item(a, item, it.dq + item.key, it.dk + item.key, h > it.h0);
      }
    }
    Tiles::release();
    parts.reduce(p, a.dq, a.dk, partials);
  }
}

}  // namespace lattn::cpu::amx_tiles

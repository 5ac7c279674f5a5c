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
//     rows, with w = exp(b_i - b_j) a running product of exp(g) (as lane_scores does).
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

// A float32 operand: element (r, c) at x[r ld + c], or at x[c ld + r] where transposed; with
// `residual`, what rounding that element to bf16 leaves, x - bf16(x) (see product_split).
struct Operand {
  const float* x;
  std::size_t ld;
  bool transposed = false;
  bool residual = false;
  float at(int r, int c) const {
    const float v = transposed ? x[std::size_t(c) * ld + r] : x[std::size_t(r) * ld + c];
    return residual ? v - from_bf16(to_bf16(v)) : v;
  }
};
inline Operand rows(const float* x, std::size_t ld) { return {x, ld, false}; }
inline Operand cols(const float* x, std::size_t ld) { return {x, ld, true}; }

// A thread's packing buffers for products whose dims are at most P (a multiple of 32).
struct Packing {
  Bf16* a = nullptr;           // [P][P] bf16
  std::uint32_t* b = nullptr;  // [P / 2][P] pairs
  float* c = nullptr;          // [P][P] float32
  static std::size_t words(int P) { return std::size_t(P) * P / 2 + std::size_t(P) / 2 * P + std::size_t(P) * P; }
  Packing() = default;
  Packing(float* w, int P)
      : a(reinterpret_cast<Bf16*>(w)),
        b(reinterpret_cast<std::uint32_t*>(w + std::size_t(P) * P / 2)),
        c(w + std::size_t(P) * P) {}
};

// The largest dim of a problem's products, rounded up to 32.
inline int product_dim(const Problem& p) {
  return round_up(std::max({effective_chunk(p), p.dim, p.value_dim(), 1}), amx::kTileDepth);
}

// C (M x N, ldc) = alpha op(A) op(B) (+ C where `accumulate`), op(A) M x K, op(B) K x N.
template <class Tiles>
void product(const Packing& s, int M, int N, int K, Operand A, Operand B, float* C, std::size_t ldc, float alpha,
             bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int r = 0; r < M; ++r) std::fill_n(C + std::size_t(r) * ldc, N, 0.0f);
    return;
  }
  const int M16 = round_up(M, amx::kTileRows), N16 = round_up(N, amx::kTileRows), K32 = round_up(K, amx::kTileDepth);
  for (int r = 0; r < M16; ++r) {
    Bf16* row = s.a + std::size_t(r) * K32;
    if (r < M) {
      for (int c = 0; c < K; ++c) row[c] = to_bf16(A.at(r, c));
      std::fill(row + K, row + K32, Bf16(0));
    } else {
      std::fill_n(row, K32, Bf16(0));
    }
  }
  for (int pr = 0; pr < K32 / 2; ++pr) {
    std::uint32_t* row = s.b + std::size_t(pr) * N16;
    const int lo = 2 * pr, hi = lo + 1;
    for (int c = 0; c < N; ++c)
      row[c] = pair_of(lo < K ? to_bf16(B.at(lo, c)) : Bf16(0), hi < K ? to_bf16(B.at(hi, c)) : Bf16(0));
    std::fill(row + N, row + N16, 0u);
  }
  amx::gemm<Tiles>(M16, N16, K32, s.a, std::size_t(K32), s.b, std::size_t(N16), s.c, std::size_t(N16), false);
  for (int r = 0; r < M; ++r) {
    float* out = C + std::size_t(r) * ldc;
    const float* in = s.c + std::size_t(r) * N16;
    if (accumulate)
      for (int c = 0; c < N; ++c) out[c] += alpha * in[c];
    else
      for (int c = 0; c < N; ++c) out[c] = alpha * in[c];
  }
}

// product() with one operand (`split`: 'A' or 'B') carried as the bf16 pair hi + lo, hi = bf16(x) and
// lo = bf16(x - hi): two tile products, the second on the residual, which keep that operand to about
// 2^-17 of itself instead of 2^-9. For the float32 intermediates the delta rule reads through a
// difference (the state S and the chunk's W, R: its output is S^T q plus a correction that cancels
// it where beta is near 1 and S already predicts v): rounded once, their 2^-9 error is amplified by
// that cancellation past the bf16 tolerance where few channels average it (rel_err 0.016-0.058 at
// Dk = Dv = 1 on the silicon and on the emulated tiles alike).
template <class Tiles>
void product_split(const Packing& s, int M, int N, int K, Operand A, Operand B, float* C, std::size_t ldc, float alpha,
                   bool accumulate, char split) {
  product<Tiles>(s, M, N, K, A, B, C, ldc, alpha, accumulate);
  (split == 'A' ? A : B).residual = true;
  product<Tiles>(s, M, N, K, A, B, C, ldc, alpha, true);
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
  for (int i = 0; i < n; ++i)
    for (int w = 0; w < W; ++w) {
      const double step = g ? double(g[std::size_t(i) * W + w]) : log_gamma;
      b[std::size_t(i) * W + w] = (i > 0 ? b[std::size_t(i - 1) * W + w] : 0.0) + step;
    }
  return {b, n, W};
}

inline float exp_diff(double x) { return float(std::exp(x)); }

// A thread's buffers for the gated scores, each C x Dk floats (vector gates only).
struct ScoreWork {
  float *EQ, *EK, *a, *Xh, *B, *rows;  // exp(b - r_I), exp(e_J - b), exp(g); X . EQ; a B operand; a product's rows
  static std::size_t floats(const Problem& p) {
    return p.decay == Decay::vector ? 6 * std::size_t(effective_chunk(p)) * p.dim : 0;
  }
  ScoreWork(float* w, const Problem& p) {
    const std::size_t x = p.decay == Decay::vector ? std::size_t(effective_chunk(p)) * p.dim : 0;
    EQ = w, EK = w + x, a = w + 2 * x, Xh = w + 3 * x, B = w + 4 * x, rows = w + 5 * x;
  }
};

// The vector gates' factors of one chunk: EQ, EK and exp(g), n x D.
inline void gate_factors(const Gates& g, int D, const ScoreWork& s) {
  if (!g.vector()) return;
  for (int i0 = 0; i0 < g.n; i0 += kSub) {
    const int i1 = std::min(g.n, i0 + kSub);
    for (int i = i0; i < i1; ++i)
      for (int d = 0; d < D; ++d) {
        const std::size_t o = std::size_t(i) * D + d;
        const double bi = g.at(i, d), r = i0 > 0 ? g.at(i0 - 1, d) : 0.0;
        s.EQ[o] = exp_diff(bi - r);
        s.EK[o] = exp_diff(g.at(i1 - 1, d) - bi);
        s.a[o] = exp_diff(bi - (i > 0 ? g.at(i - 1, d) : 0.0));
      }
  }
}

// out[j][d] = X[j][d] f[d] with f = exp(r_I - e_{J(j)}) for rows [x0, x1) of X, J(j) the sub-chunk
// of row j, I the sub-chunk `other` (rows_later: X's rows lie after I's, and the roles swap).
inline void scale_blocks(const Gates& g, int D, const float* X, int x0, int x1, int other, bool rows_later,
                         float* out) {
  for (int x = x0; x < x1; ++x) {
    const int blk = x / kSub;
    const int I = rows_later ? blk : other, J = rows_later ? other : blk;
    const int ri = I * kSub - 1, ej = std::min(g.n, (J + 1) * kSub) - 1;
    for (int d = 0; d < D; ++d)
      out[std::size_t(x - x0) * D + d] = X[std::size_t(x) * D + d] * exp_diff(g.at(ri, d) - g.at(ej, d));
  }
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
    for (int i = 0; i < n; ++i) {
      float* row = S + std::size_t(i) * ldS;
      const int last = strict ? i - 1 : i;
      for (int j = 0; j <= last; ++j) row[j] *= alpha * exp_diff(g.at(i, 0) - g.at(j, 0));
      std::fill(row + last + 1, row + n, 0.0f);
    }
    return;
  }
  for (int e = 0; e < n * D; ++e) sw.Xh[e] = X[e] * sw.EQ[e];
  for (int i0 = 0; i0 < n; i0 += kSub) {
    const int i1 = std::min(n, i0 + kSub), I = i0 / kSub;
    if (i0 > 0) {  // S_{I, <I} = alpha Xh_I (Kb . f_IJ)^T
      for (int e = 0; e < i0 * D; ++e) sw.rows[e] = K[e] * sw.EK[e];
      scale_blocks(g, D, sw.rows, 0, i0, I, false, sw.B);
      product<Tiles>(pk, i1 - i0, i0, D, rows(sw.Xh + std::size_t(i0) * D, D), cols(sw.B, D),
                     S + std::size_t(i0) * ldS, ldS, alpha, false);
    }
    for (int i = i0; i < i1; ++i) {  // within the sub-chunk: w = exp(b_i - b_j), a running product
      float* row = S + std::size_t(i) * ldS;
      float* w = sw.rows + std::size_t(i0) * D;  // rows past i0 are free here
      std::fill_n(w, D, 1.0f);
      const float* xi = X + std::size_t(i) * D;
      for (int j = i; j >= i0; --j) {
        const float* kj = K + std::size_t(j) * D;
        const float* aj = sw.a + std::size_t(j) * D;
        float sum = 0;
        for (int d = 0; d < D; ++d) {
          sum += xi[d] * kj[d] * w[d];
          w[d] *= aj[d];
        }
        row[j] = j == i && strict ? 0.0f : alpha * sum;
      }
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
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        tmp[std::size_t(i) * n + j] = j <= i ? dP[std::size_t(i) * ldP + j] * exp_diff(g.at(i, 0) - g.at(j, 0)) : 0.0f;
    product<Tiles>(pk, n, D, n, rows(tmp, n), rows(K, D), dX, D, 1.0f, true);
    product<Tiles>(pk, n, D, n, cols(tmp, n), rows(X, D), dK, D, 1.0f, true);
    return;
  }
  for (int e = 0; e < n * D; ++e) sw.Xh[e] = X[e] * sw.EQ[e];
  for (int i0 = 0; i0 < n; i0 += kSub) {
    const int i1 = std::min(n, i0 + kSub), I = i0 / kSub, m = i1 - i0;
    if (i0 > 0) {  // dX_I += EQ . (dP_{I, <I} (Kb . f_IJ))
      for (int e = 0; e < i0 * D; ++e) sw.rows[e] = K[e] * sw.EK[e];
      scale_blocks(g, D, sw.rows, 0, i0, I, false, sw.B);
      product<Tiles>(pk, m, D, i0, rows(dP + std::size_t(i0) * ldP, ldP), rows(sw.B, D), tmp, D, 1.0f, false);
      for (int e = 0; e < m * D; ++e) dX[std::size_t(i0) * D + e] += sw.EQ[std::size_t(i0) * D + e] * tmp[e];
    }
    if (i1 < n) {  // dK_I += EK . (dP_{>I, I}^T (Xh . f_JI))
      scale_blocks(g, D, sw.Xh, i1, n, I, true, sw.B);
      product<Tiles>(pk, m, D, n - i1, cols(dP + std::size_t(i1) * ldP + i0, ldP), rows(sw.B, D), tmp, D, 1.0f,
                     false);
      for (int e = 0; e < m * D; ++e) dK[std::size_t(i0) * D + e] += sw.EK[std::size_t(i0) * D + e] * tmp[e];
    }
    for (int i = i0; i < i1; ++i) {  // within the sub-chunk
      float* w = tmp;
      std::fill_n(w, D, 1.0f);
      const float* xi = X + std::size_t(i) * D;
      float* dxi = dX + std::size_t(i) * D;
      for (int j = i; j >= i0; --j) {
        const float* kj = K + std::size_t(j) * D;
        const float* aj = sw.a + std::size_t(j) * D;
        float* dkj = dK + std::size_t(j) * D;
        const float x = dP[std::size_t(i) * ldP + j];
        for (int d = 0; d < D; ++d) {
          dxi[d] += x * kj[d] * w[d];
          dkj[d] += x * xi[d] * w[d];
          w[d] *= aj[d];
        }
      }
    }
  }
}

// Widens n rows of bf16 (ld cols) to float32, zero to row `to`.
inline void widen_rows(const Bf16* x, int n, int to, int cols, float* out) {
  for (int r = 0; r < to; ++r)
    for (int c = 0; c < cols; ++c)
      out[std::size_t(r) * cols + c] = r < n ? from_bf16(x[std::size_t(r) * cols + c]) : 0.0f;
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

// run(tiles) on the path's tiles: the emulation, or the hardware where it may run (`kernel` names
// the caller in the error otherwise).
template <class Run>
void on_path(const char* kernel, AmxPath path, Run run) {
  if (path == AmxPath::emulated) return run(amx::Emulated{});
#if defined(LATTN_AMX_INTRINSICS)
  if (const auto& why = amx::hardware_refusal()) throw std::logic_error(std::string(kernel) + ": " + *why);
  run(amx::Hardware{});
#else
  throw std::logic_error(std::string(kernel) + ": this build has no AMX intrinsics");
#endif
}

}  // namespace lattn::cpu::amx_tiles

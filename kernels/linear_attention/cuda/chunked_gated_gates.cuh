// The gates' arithmetic of the gated chunked kernels (cuda/chunked_gated.cuh has the rest of what
// they share): the vector gates' diagonal 16 x 16 tiles, element-wise with running products of
// exp(g); a row block's gates in shared memory (the tiles' sums, exp(g), the in-tile factors EQ
// and EK); a walked block's factors relative to its own ends; the scalar gates' row sums. Every
// factor is exp of a sum of log-gates over a range of rows, <= 1 (docs/kernels.md, "Gated decays").
// Included inside each .cu's own unit (internal linkage).
#pragma once

#include "kernels/linear_attention/cuda/chunked_gated.cuh"

namespace lattn::cuda {
namespace {

// ---- the vector gates' diagonal tiles: running products of exp(g) (docs/kernels.md) ----
// (Multiply-adds written out: nvcc contracts them into FMAs; the emulation's host compiler, built
// without FMA instructions, would call libm's fmaf for each.)

// 4 values at a time (8-byte aligned shared memory).
__device__ __forceinline__ void load4(const float* p, float (&x)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&x)[4]) {
  struct alignas(8) Bits {
    unsigned int lo, hi;
  };
  const Bits v = *reinterpret_cast<const Bits*>(p);
  const bf16* h = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int c = 0; c < 4; ++c) x[c] = __bfloat162float(h[c]);
}
template <class T>
__device__ __forceinline__ void load_group(const T* p, float (&x)[8]) { load8(p, x); }
template <class T>
__device__ __forceinline__ void load_group(const T* p, float (&x)[4]) { load4(p, x); }

// Scores within diagonal tile `tile` of a row block: acc[j] = sum over this lane's channels of
// q_i . k_j . exp(b_i - b_j) for j <= i (i = lane % 16; 0 for j > i), with Q, K the block's raw
// rows (ld ldk) and a = exp(g) per row and channel (ld lda). The channels go in groups of C (8, or
// 4 where the caller has fewer registers to spare: half the operands live per key row), group
// `part`, part + parts, ... (the caller adds the parts' sums). zero false: added to acc (a sum
// over several pieces of the channels, each with its own a).
template <int C = 8, class T>
__device__ void diagonal_scores(float (&acc)[16], const T* Q, const T* K, int ldk, const float* a, int lda, int tile,
                                int Dp, int part, int parts, bool zero = true) {
  static_assert(C == 8 || C == 4, "channel groups of 8 or 4");
  const int i = int(threadIdx.x) & 15;
  const T* q = Q + (tile * 16 + i) * ldk;
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j] = zero ? 0.0f : acc[j];
#pragma unroll 1
  for (int d0 = part * C; d0 < Dp; d0 += parts * C) {
    float qi[C], w[C];
    load_group(q + d0, qi);
#pragma unroll
    for (int c = 0; c < C; ++c) w[c] = 1.0f;
#pragma unroll
    for (int j = 15; j >= 0; --j) {  // w = exp(b_i - b_j) = prod of a over rows j+1 .. i
      const bool on = j <= i;
      float kj[C], aj[C];
      load_group(K + (tile * 16 + j) * ldk + d0, kj);
      load_group(a + (tile * 16 + j) * lda + d0, aj);
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) s += qi[c] * w[c] * kj[c];
      acc[j] += on ? s : 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) w[c] = on ? w[c] * aj[c] : w[c];
    }
  }
}

// dQ within diagonal tile `tile` (rows of the tile, the warp's 8 TN channels in each_lane's
// layout, from channel col0 of the block's columns): out[t*8 + c] = sum_{j <= i} dA_ij k_jd exp(b_id - b_jd),
// with i = lane / 2, dA the block's score tile (ld lds), K the raw key rows' columns (ld ldk), a = exp(g) (ld lda).
template <int TN, class T>
__device__ void diagonal_dq(float (&out)[8 * TN], const T* dA, int lds, const T* K, int ldk, const float* a, int lda,
                            int tile, int col0) {
  const int lane = int(threadIdx.x) & 31, i = lane >> 1, c0 = col0 + (lane & 1) * 8;
  float w[8 * TN];
#pragma unroll
  for (int v = 0; v < 8 * TN; ++v) out[v] = 0.0f, w[v] = 1.0f;
  const T* da = dA + (tile * 16 + i) * lds + tile * 16;
#pragma unroll
  for (int j = 15; j >= 0; --j) {
    const bool on = j <= i;
    const float x = on ? to_float(da[j]) : 0.0f;
    const T* kj = K + (tile * 16 + j) * ldk + c0;
    const float* aj = a + (tile * 16 + j) * lda + c0;
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      float kv[8], av[8];
      load8(kj + t * 16, kv);
      load8(aj + t * 16, av);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        out[t * 8 + c] += x * kv[c] * w[t * 8 + c];
        w[t * 8 + c] = on ? w[t * 8 + c] * av[c] : w[t * 8 + c];
      }
    }
  }
}

// dK within diagonal tile `tile`: out[t*8 + c] = sum_{i >= j} dA_ij q_id exp(b_id - b_jd), with
// j = lane / 2 (a key row), dAT the block's transposed score tile (rows: keys, ld lds), Q the raw
// query rows' columns.
template <int TN, class T>
__device__ void diagonal_dk(float (&out)[8 * TN], const T* dAT, int lds, const T* Q, int ldq, const float* a, int lda,
                            int tile, int col0) {
  const int lane = int(threadIdx.x) & 31, j = lane >> 1, c0 = col0 + (lane & 1) * 8;
  float w[8 * TN];
#pragma unroll
  for (int v = 0; v < 8 * TN; ++v) out[v] = 0.0f, w[v] = 1.0f;
  const T* da = dAT + (tile * 16 + j) * lds + tile * 16;
#pragma unroll
  for (int i = 0; i < 16; ++i) {  // w = exp(b_i - b_j) = prod of a over rows j+1 .. i
    const bool after = i > j, on = i >= j;
    const float x = on ? to_float(da[i]) : 0.0f;
    const T* qi = Q + (tile * 16 + i) * ldq + c0;
    const float* ai = a + (tile * 16 + i) * lda + c0;
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      float qv[8], av[8];
      load8(qi + t * 16, qv);
      load8(ai + t * 16, av);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        w[t * 8 + c] = after ? w[t * 8 + c] * av[c] : w[t * 8 + c];
        out[t * 8 + c] += x * qv[c] * w[t * 8 + c];
      }
    }
  }
}

// ---- the gates of a row block in shared memory (vector gates) ----
// (Their row loops are not unrolled: every load of an unrolled walk would be hoisted into registers,
// which the chunk-parallel kernels, at 128 a thread, do not have to spare.)

// For the staged log-gates g of a block's rows (rows x cols floats, ld ldg; rows past the chunk's
// end zero): tiles[t * ldt + d] = the sum of tile t's rows (double; ldt: cols unless given), then
// g <- exp(g) in place. Every thread of the block; a barrier after.
__device__ inline void tile_sums_and_exp(float* g, int ldg, int rows, int cols, double* tiles, int ldt) {
  const int tiles_n = rows / 16;
  for (int e = int(threadIdx.x); e < tiles_n * cols; e += kGatedThreads) {
    const int t = e / cols, d = e - t * cols;
    double s = 0;
#pragma unroll 1
    for (int r = 0; r < 16; ++r) s += g[(t * 16 + r) * ldg + d];
    tiles[t * ldt + d] = s;
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < rows * cols; e += kGatedThreads) {
    const int r = e / cols, d = e - r * cols;
    g[r * ldg + d] = expf(g[r * ldg + d]);
  }
}

__device__ inline void tile_sums_and_exp(float* g, int ldg, int rows, int cols, double* tiles) {
  tile_sums_and_exp(g, ldg, rows, cols, tiles, cols);
}

// Within each 16-row tile of `rows` rows, per column d < cols: X[r][d] *= the tile's EQ
// (prefix: prod of a over the tile's rows up to r) or EK (suffix: prod of a over the rows after r
// to the tile's end). a = exp(g), ld lda; X of the token dtype (ld ldx). Every thread; a barrier
// after.
template <bool Prefix, class U>
__device__ void tile_factors(U* X, int ldx, const float* a, int lda, int rows, int cols) {
  for (int e = int(threadIdx.x); e < (rows / 16) * cols; e += kGatedThreads) {
    const int t = e / cols, d = e - t * cols;
    float w = 1.0f;
    if (Prefix) {
#pragma unroll 1
      for (int r = t * 16; r < t * 16 + 16; ++r) {
        w *= a[r * lda + d];
        X[r * ldx + d] = from_float<U>(to_float(X[r * ldx + d]) * w);
      }
    } else {
#pragma unroll 1
      for (int r = t * 16 + 15; r >= t * 16; --r) {
        X[r * ldx + d] = from_float<U>(to_float(X[r * ldx + d]) * w);
        w *= a[r * lda + d];
      }
    }
  }
}

// The same factors in place of a itself: a[r][d] <- EQ (Prefix) or EK of row r. Every thread; a
// barrier after.
template <bool Prefix>
__device__ void tile_products(float* a, int lda, int rows, int cols) {
  for (int e = int(threadIdx.x); e < (rows / 16) * cols; e += kGatedThreads) {
    const int t = e / cols, d = e - t * cols;
    float w = 1.0f;
    if (Prefix) {
#pragma unroll 1
      for (int r = t * 16; r < t * 16 + 16; ++r) a[r * lda + d] = w *= a[r * lda + d];
    } else {
#pragma unroll 1
      for (int r = t * 16 + 15; r >= t * 16; --r) {
        const float ar = a[r * lda + d];
        a[r * lda + d] = w;
        w *= ar;
      }
    }
  }
}

// A walked block's operand relative to the block's own ends (vector gates): for rows r < valid
// of X (ld ldx, columns d < cols), Prefix: X[r][d] *= exp(sum of g over rows 0 .. r) (queries:
// b_r - b before the block); else X[r][d] *= exp(sum over rows r+1 .. valid-1) (keys: b at the
// block's last row - b_r). g read from global memory (its rows, stride W, from column 0 of the
// block's columns). total[d] = the block's sum (double; add: total[d] += it). Every thread; a
// barrier after.
template <bool Prefix, class T>
__device__ void walked_factors(T* X, int ldx, const float* g, int W, int valid, int cols, double* total,
                               bool add = false) {
  for (int d = int(threadIdx.x); d < cols; d += kGatedThreads) {
    float s = 0.0f;
    double sum = 0;
    if (Prefix) {
#pragma unroll 1
      for (int r = 0; r < valid; ++r) {
        const float gr = g[std::size_t(r) * W + d];
        s += gr;
        sum += gr;
        X[r * ldx + d] = from_float<T>(to_float(X[r * ldx + d]) * expf(s));
      }
    } else {
#pragma unroll 1
      for (int r = valid - 1; r >= 0; --r) {
        X[r * ldx + d] = from_float<T>(to_float(X[r * ldx + d]) * expf(s));
        const float gr = g[std::size_t(r) * W + d];
        s += gr;
        sum += gr;
      }
    }
    total[d] = add ? total[d] + sum : sum;
  }
}

// Scalar gates: sums[r] = sum of g over rows 0 .. r (Prefix) or r+1 .. valid-1 of a block's rows
// (double), 0 past valid; returns the block's total. Fixed: every row's log-gate is lg, g is not
// read. One thread.
template <bool Prefix, bool Fixed = false>
__device__ double row_sums(const float* g, double lg, int valid, int rows, double* sums) {
  double s = 0;
  if constexpr (Prefix) {
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {
      if (r < valid) s += Fixed ? lg : g[r];
      sums[r] = s;
    }
  } else {
#pragma unroll 1
    for (int r = rows - 1; r >= 0; --r) {
      sums[r] = r < valid ? s : 0.0;
      if (r < valid) s += Fixed ? lg : g[r];
    }
  }
  return s;
}

}  // namespace
}  // namespace lattn::cuda

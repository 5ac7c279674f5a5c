// Warp-level tile products and shared-memory staging that the chunked and sliding-window kernels
// share: 16 x 16 WMMA tiles for bf16 (float32 accumulation) and FMA tiles for float32, read from
// row- or column-major shared tiles; a warp's register-blocked TM x TN block of such tiles; and
// staging from global memory with the ragged edges zero-filled, by 16-byte loads or by cp.async
// (sm_80 and later: the copy runs while the block computes on the other buffer). Included inside
// each .cu's own unit (internal linkage: every kernel file is compiled on its own, and nothing
// here is a symbol another file links against).
#pragma once

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace lattn::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }
__host__ __device__ constexpr std::size_t align128(std::size_t x) { return (x + 127) / 128 * 128; }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// ---- 16 x 16 warp tiles: C (+)= A B with A, B 16 x 16 blocks of shared memory ----
// A block "row-major" at P with leading dimension ld holds element (r, c) at P[r * ld + c];
// "column-major" holds it at P[c * ld + r].
template <class T> struct Tiles;

template <> struct Tiles<float> {  // FMA units: lane l owns row l / 2, columns 8 (l % 2) .. + 7
  struct Acc { float x[8]; };
  __device__ static void zero(Acc& a) {
#pragma unroll
    for (int c = 0; c < 8; ++c) a.x[c] = 0.0f;
  }
  // Row-major operands are read 4 floats at a time (every tile offset and leading dimension is a
  // multiple of 4 floats, every buffer 128-byte aligned); column-major ones element by element.
  template <bool ACol, bool BCol>
  __device__ static void mma(Acc& acc, const float* A, int lda, const float* B, int ldb) {
    const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll
    for (int k0 = 0; k0 < 16; k0 += 4) {
      float a[4];
      if constexpr (ACol) {
#pragma unroll
        for (int u = 0; u < 4; ++u) a[u] = A[(k0 + u) * lda + r];
      } else {
        const float4 v = *reinterpret_cast<const float4*>(A + r * lda + k0);
        a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float b[8];
        if constexpr (BCol) {
#pragma unroll
          for (int c = 0; c < 8; ++c) b[c] = B[(c0 + c) * ldb + k0 + u];
        } else {
          const float4 lo = *reinterpret_cast<const float4*>(B + (k0 + u) * ldb + c0);
          const float4 hi = *reinterpret_cast<const float4*>(B + (k0 + u) * ldb + c0 + 4);
          b[0] = lo.x, b[1] = lo.y, b[2] = lo.z, b[3] = lo.w, b[4] = hi.x, b[5] = hi.y, b[6] = hi.z, b[7] = hi.w;
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) acc.x[c] = fmaf(a[u], b[c], acc.x[c]);
      }
    }
  }
  __device__ static void store(float* P, const Acc& acc, int ld) {
    const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll
    for (int c = 0; c < 8; ++c) P[r * ld + c0 + c] = acc.x[c];
  }
  __device__ static void load(Acc& acc, const float* P, int ld) {
    const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc.x[c] = P[r * ld + c0 + c];
  }
};

template <> struct Tiles<bf16> {  // tensor cores: bf16 x bf16 -> float32
  using Acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  __device__ static void zero(Acc& a) { nvcuda::wmma::fill_fragment(a, 0.0f); }
  template <bool ACol, bool BCol>
  __device__ static void mma(Acc& acc, const bf16* A, int lda, const bf16* B, int ldb) {
    using namespace nvcuda;
    using LA = std::conditional_t<ACol, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<BCol, wmma::col_major, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> b;
    wmma::load_matrix_sync(a, A, unsigned(lda));
    wmma::load_matrix_sync(b, B, unsigned(ldb));
    wmma::mma_sync(acc, a, b, acc);
  }
  __device__ static void store(float* P, const Acc& acc, int ld) {
    nvcuda::wmma::store_matrix_sync(P, acc, unsigned(ld), nvcuda::wmma::mem_row_major);
  }
  __device__ static void load(Acc& acc, const float* P, int ld) {
    nvcuda::wmma::load_matrix_sync(acc, P, unsigned(ld), nvcuda::wmma::mem_row_major);
  }
};

// rows x width block of a [.][D] token tensor into shared memory (leading dimension ld): entries
// beyond `valid_rows` rows or beyond column D are zero. When D (and so every row start) is a
// multiple of 16 bytes, 16-byte accesses, four in flight per thread before the first store;
// otherwise element by element.
template <class T>
__device__ void stage(T* dst, int ld, const T* src, int D, int col0, int valid_rows, int rows, int width) {
  constexpr int V = 16 / int(sizeof(T));  // elements per 16-byte access; width, ld, col0 are multiples
  if (D % V == 0) {
    const int vw = width / V, total = rows * vw;
    for (int base = int(threadIdx.x); base < total; base += 4 * kThreads) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = base + u * kThreads, r = e / vw, c = (e - r * vw) * V;
        v[u] = make_uint4(0, 0, 0, 0);
        if (e < total && r < valid_rows && col0 + c < D)
          v[u] = *reinterpret_cast<const uint4*>(src + std::size_t(r) * D + col0 + c);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = base + u * kThreads, r = e / vw, c = (e - r * vw) * V;
        if (e < total) *reinterpret_cast<uint4*>(dst + r * ld + c) = v[u];
      }
    }
    return;
  }
  for (int e = int(threadIdx.x); e < rows * width; e += kThreads) {
    const int r = e / width, c = e - r * width;
    dst[r * ld + c] = (r < valid_rows && col0 + c < D) ? src[std::size_t(r) * D + col0 + c] : from_float<T>(0.0f);
  }
}


// ---- a warp's TM x TN block of 16 x 16 tiles, register-blocked ----
// acc (+)= A B over `ksteps` steps of 16: each step loads the TM tiles of A and the TN tiles of B
// once and makes TM * TN products with them (a 16 x 16 tile per product would load two tiles per
// product). A is the block's TM * 16 rows, row-major (tile (i, k) at A + i*16*lda + k*16) or
// column-major (at A + k*16*lda + i*16); B its TN * 16 columns, row-major (tile (k, j) at
// B + k*16*ldb + j*16) or column-major (at B + j*16*ldb + k*16).
constexpr int kTileScratchLd = 20;  // a warp's 16 x 16 float scratch tile, rows padded (16-byte multiple)

template <class T, int TM, int TN> struct WarpBlock {
  typename Tiles<T>::Acc acc[TM][TN];

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) Tiles<T>::zero(acc[i][j]);
  }
  __device__ void scale(float f);
  template <bool ACol, bool BCol>
  __device__ void mma(const T* A, int lda, const T* B, int ldb, int ksteps);

  // f(i, j, r, c, value) for every element (r, c) of every tile (i, j), value a float& (changes
  // stay in the tile with Reload). bf16: through the warp's 16 x 16 float scratch (leading
  // dimension kTileScratchLd), because the lanes' share of a WMMA accumulator is unspecified:
  // store, then each lane its elements lane, lane + 32, ..., then (Reload) load back, with the
  // warp's barriers between. float32: the lane's own 8 elements of each tile (Tiles<float>'s
  // mapping), in registers, no scratch and no barrier. The element-wise epilogues (masks, row
  // scales, bounds-checked stores) go through here.
  template <bool Reload, class F>
  __device__ void each_element(float* scratch, F&& f) {
    const int lane = int(threadIdx.x) & 31;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        if constexpr (std::is_same<T, float>::value) {
#pragma unroll
          for (int c = 0; c < 8; ++c) f(i, j, lane >> 1, (lane & 1) * 8 + c, acc[i][j].x[c]);
        } else {
          Tiles<T>::store(scratch, acc[i][j], kTileScratchLd);
          __syncwarp();
          for (int e = lane; e < 256; e += 32) f(i, j, e >> 4, e & 15, scratch[(e >> 4) * kTileScratchLd + (e & 15)]);
          __syncwarp();
          if (Reload) Tiles<T>::load(acc[i][j], scratch, kTileScratchLd);
          __syncwarp();
        }
      }
  }
};

template <class T, int TM, int TN>
__device__ void WarpBlock<T, TM, TN>::scale(float f) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j)
      if constexpr (std::is_same<T, float>::value) {
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[i][j].x[c] *= f;
      } else {
        for (int e = 0; e < acc[i][j].num_elements; ++e) acc[i][j].x[e] *= f;
      }
}

template <class T, int TM, int TN>
template <bool ACol, bool BCol>
__device__ void WarpBlock<T, TM, TN>::mma(const T* A, int lda, const T* B, int ldb, int ksteps) {
  if constexpr (std::is_same<T, float>::value) {
    // Lane l owns row l / 2, columns 8 (l % 2) .. + 7 of every tile (Tiles<float>): per 4 steps of
    // k it reads 4 values of each of its TM rows and 8 of each of its TN column groups.
    const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
    for (int k0 = 0; k0 < ksteps * 16; k0 += 4) {
      float a[TM][4];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        if constexpr (ACol) {
#pragma unroll
          for (int u = 0; u < 4; ++u) a[i][u] = A[(k0 + u) * lda + i * 16 + r];
        } else {
          const float4 v = *reinterpret_cast<const float4*>(A + (i * 16 + r) * lda + k0);
          a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float b[TN][8];
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          if constexpr (BCol) {
#pragma unroll
            for (int c = 0; c < 8; ++c) b[j][c] = B[(j * 16 + c0 + c) * ldb + k0 + u];
          } else {
            const float4 lo = *reinterpret_cast<const float4*>(B + (k0 + u) * ldb + j * 16 + c0);
            const float4 hi = *reinterpret_cast<const float4*>(B + (k0 + u) * ldb + j * 16 + c0 + 4);
            b[j][0] = lo.x, b[j][1] = lo.y, b[j][2] = lo.z, b[j][3] = lo.w;
            b[j][4] = hi.x, b[j][5] = hi.y, b[j][6] = hi.z, b[j][7] = hi.w;
          }
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[i][j].x[c] = fmaf(a[i][u], b[j][c], acc[i][j].x[c]);
      }
    }
  } else {
    using namespace nvcuda;
    using LA = std::conditional_t<ACol, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<BCol, wmma::col_major, wmma::row_major>;
    for (int k = 0; k < ksteps; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a[TM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i)
        wmma::load_matrix_sync(a[i], A + (ACol ? k * 16 * lda + i * 16 : i * 16 * lda + k * 16), unsigned(lda));
#pragma unroll
      for (int j = 0; j < TN; ++j)
        wmma::load_matrix_sync(b[j], B + (BCol ? j * 16 * ldb + k * 16 : k * 16 * ldb + j * 16), unsigned(ldb));
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
}

// rows x width block of a row-major matrix with rows of `stride` elements (src: the block's first
// element) into shared memory (leading dimension ld), by the block's `Threads` threads: entries
// at rows >= valid_rows or columns >= valid_cols are zero. When every row start and valid_cols
// are whole 16-byte vectors, by cp.async (__pipeline_memcpy_async, zero-filled past the edges,
// never reading there): the caller commits the group and waits for it (__pipeline_wait_prior) and
// then a barrier before anyone reads it. Otherwise element by element, done when this returns.
template <int Threads, class T>
__device__ void stage_async(T* dst, int ld, const T* src, std::size_t stride, int valid_rows, int valid_cols, int rows,
                            int width) {
  constexpr int V = 16 / int(sizeof(T));
  valid_rows = max(0, min(valid_rows, rows));
  valid_cols = max(0, min(valid_cols, width));
  if (stride % V == 0 && valid_cols % V == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
    const int vw = width / V;
    for (int e = int(threadIdx.x); e < rows * vw; e += Threads) {
      const int r = e / vw, c = (e - r * vw) * V;
      const bool inside = r < valid_rows && c < valid_cols;
      __pipeline_memcpy_async(dst + r * ld + c, inside ? src + std::size_t(r) * stride + c : src, 16, inside ? 0 : 16);
    }
    return;
  }
  for (int e = int(threadIdx.x); e < rows * width; e += Threads) {
    const int r = e / width, c = e - r * width;
    dst[r * ld + c] = (r < valid_rows && c < valid_cols) ? src[std::size_t(r) * stride + c] : from_float<T>(0.0f);
  }
}

}  // namespace
}  // namespace lattn::cuda

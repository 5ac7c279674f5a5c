// Warp-level tile products and shared-memory staging that chunked.cu and sliding_window.cu
// share: 16 x 16 WMMA tiles for bf16 (float32 accumulation) and FMA tiles for float32, read from
// row- or column-major shared tiles, and 16-byte staging loads from global memory with the ragged
// edges zero-filled. Included inside each .cu's own unit (internal linkage: every kernel file is
// compiled on its own, and nothing here is a symbol another file links against).
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

#include <cstddef>
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

}  // namespace
}  // namespace lattn::cuda

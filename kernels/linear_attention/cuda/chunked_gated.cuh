// What the gated chunked form's kernels share (cuda/chunked_gated*.cu; docs/cuda.md, "Gated
// decays, chunked"): where a chunk of a (sequence, value head) pair lives in every tensor, for
// every shape of docs/spec.md section 1c; the warp products whose one operand is scaled per
// channel on its way from shared memory to the tensor cores (or the FMA units); the element-wise
// epilogues; the tile dispatch. The gates' own arithmetic is in cuda/chunked_gated_gates.cuh.
// Included inside each .cu's own unit (internal linkage, as warp_tiles.cuh).
//
// The gates enter only as exp of sums of log-gates over a range of rows, each formed so that it is
// <= 1 (docs/kernels.md, "Gated decays"): within a 16-row tile as running products of exp(g) (the
// tile's "EQ" = exp(b_i - b before the tile), "EK" = exp(b at the tile's end - b_j)), and between
// tiles or row blocks as exp of a double sum of whole tiles' or blocks' log-gates. A difference of
// two large cumulative sums (exp(b_i) exp(-b_j)) is never formed: at gate_norm 1 a chunk's gates
// sum to -50 to -100 and that product overflows float32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/dtype.hpp"
#include "kernels/cuda/warp_tiles.cuh"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"

namespace lattn::cuda {
namespace {

constexpr int kGatedWarps = 8;
constexpr int kGatedThreads = kGatedWarps * 32;

// Chunk k of value head h: element offsets of its first row in the key tensors (q, k: its q/k
// head), in the per-value-head key tensors (dq and dk parts), the value tensors and the gates; of
// its state slot and of its sequence's state (h0, hT); its rows, its index in its sequence, the
// sequence's chunks and the sequence's first chunk.
struct ChunkRef {
  std::size_t key, key_part, value, gate, state, seq_state;
  int n, c, chunks, first;
};

__device__ __forceinline__ ChunkRef locate_chunk(const GatedShape& s, int k, int h) {
  int seq, c, start, len, b, first;
  if (s.cu) {
    int lo = 0, hi = s.docs - 1;  // the document with first[seq] <= k < first[seq + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.first[mid] <= k) lo = mid;
      else hi = mid - 1;
    }
    seq = lo, first = s.first[seq], c = k - first, start = s.cu[seq], len = s.cu[seq + 1] - start, b = 0;
  } else {
    seq = k / s.per_seq, first = seq * s.per_seq, c = k - first, start = 0, len = s.T, b = seq;
  }
  const int t0 = start + c * s.C;
  const std::size_t row = (std::size_t(b) * s.H + h) * s.T + t0;
  ChunkRef r;
  r.key = ((std::size_t(b) * s.Hk + h / s.group) * s.T + t0) * s.Dk;
  r.key_part = row * s.Dk;
  r.value = row * s.Dv;
  r.gate = row * s.W;
  r.state = (std::size_t(k) * s.H + h) * s.Dk * s.Dv;
  r.seq_state = (std::size_t(seq) * s.H + h) * s.Dk * s.Dv;
  r.n = min(s.C, len - c * s.C);
  r.c = c;
  r.chunks = (len + s.C - 1) / s.C;
  r.first = first;
  return r;
}

// A chunk-parallel launch's parameters: one grid dimension, chunks x heads x row_blocks x
// col_tiles blocks, the column tile fastest (the blocks that read the same rows for different
// output columns run side by side and share them through L2), then the row block, then the
// value head (a group's value heads side by side share their q/k rows).
struct GatedParams {
  GatedShape shape;
  GatedArgs args;
  int row_blocks, col_tiles;
};

// The block's chunk, value head, row block and column tile.
struct BlockAt {
  ChunkRef ch;
  int h, rb, ct;
};
__device__ __forceinline__ BlockAt block_at(const GatedParams& p) {
  const unsigned x = blockIdx.x, tiles = unsigned(p.col_tiles), rows = unsigned(p.row_blocks);
  const int ct = int(x % tiles), rb = int(x / tiles % rows), kh = int(x / tiles / rows);
  const int h = kh % p.shape.H, k = kh / p.shape.H;
  return {locate_chunk(p.shape, k, h), h, rb, ct};
}

// Carves a block's dynamic shared memory: each buffer 128-byte aligned.
struct Carve {
  std::size_t at = 0;
  __host__ __device__ std::size_t take(std::size_t bytes) {
    const std::size_t o = at;
    at += align128(bytes);
    return o;
  }
};

// Leading dimensions (elements) of a row of `cols` elements of size es: a multiple of 16 bytes
// plus one 16-byte access of padding against bank conflicts.
__host__ __device__ inline int padded_ld(int cols, int es) { return round16(cols) + 16 / es; }

// A warp's own area of shared memory: a 16 x 16 float tile (WMMA accumulators' element-wise
// epilogues, bf16) that doubles as the 16 x 16 scaled operand piece of the products below, then
// a vector of floats (per-channel factors).
constexpr int kPieceLd = 24;  // elements: 48 bytes (bf16) or 96 (float), multiples of 16
__host__ __device__ inline std::size_t warp_area_bytes(int f_floats) {
  const std::size_t tile = align128(std::size_t(16) * (kPieceLd > kTileScratchLd ? kPieceLd : kTileScratchLd) * 4);
  return tile + align128(std::size_t(f_floats) * 4);
}

// Calls F<T, Gates, RB, MinBlocks>::run(args...) for the dtype, the gates and the tiles a
// chunk-parallel launch was given (Gates: kScalarGates, kVectorGates or kFixedGates): RB 64 (bf16) for two blocks per
// multiprocessor, or 32 for two or one.
template <template <class, int, int, int> class F, class... Args>
auto dispatch_tiles(Dtype dtype, int gates, GatedTiles tiles, Args&&... args) {
  auto by_tiles = [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    if constexpr (sizeof(T) == 2)  // float32 takes RB 32 only (gated_tiles)
      if (tiles.rows_per_block == 64) return F<T, V, 64, 2>::run(args...);
    if (tiles.blocks_per_sm == 2) return F<T, V, 32, 2>::run(args...);
    return F<T, V, 32, 1>::run(args...);
  };
  auto by_gates = [&](auto t) {
    if (gates == kVectorGates) return by_tiles(t, std::integral_constant<int, kVectorGates>{});
    if (gates == kFixedGates) return by_tiles(t, std::integral_constant<int, kFixedGates>{});
    return by_tiles(t, std::integral_constant<int, kScalarGates>{});
  };
  return dtype == Dtype::f32 ? by_gates(float{}) : by_gates(bf16{});
}

// Fixed gates' log-gate of value head h: log gamma_h = log(1 - 2^(-5-h)) for retnet, 0 for none.
__device__ __forceinline__ double head_log_gate(const GatedShape& s, int h) {
  return s.retnet ? log1p(-ldexp(1.0, -5 - h)) : 0.0;
}

// ---- 8 values at a time (16-byte aligned shared memory) ----
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float (&x)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const bf16* h = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = __bfloat162float(h[c]);
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ __forceinline__ void store8(bf16* p, const float (&x)[8]) {
  uint4 v;
  bf16* h = reinterpret_cast<bf16*>(&v);
#pragma unroll
  for (int c = 0; c < 8; ++c) h[c] = __float2bfloat16_rn(x[c]);
  *reinterpret_cast<uint4*>(p) = v;
}

// ---- a warp's 16-row products with one operand scaled per channel ----
// Lane l scales 8 elements of a 16 x 16 piece: row (or column, column-major) l / 2, elements
// 8 (l % 2) .. + 7 along the other index, so that a row of 16 takes two 16-byte accesses.

// acc[t] += A B_t over `ksteps` steps of 16: A 16 rows, row-major (lda; ACol: column-major, row i
// at A + i); B_t the t-th 16 columns of B, column-major (BCol: at B + t*16*ldb) or row-major. One
// B fragment live at a time and the k steps not unrolled: the kernels' launch bounds allow 128
// registers a thread, and occupancy rather than one warp's instruction-level parallelism hides
// the latencies.
template <bool BCol, int TN, bool ACol = false, class T>
__device__ void warp_mma(typename Tiles<T>::Acc* acc, const T* A, int lda, const T* B, int ldb, int ksteps) {
  if constexpr (std::is_same<T, float>::value) {
    // Tiles<float>'s layout (lane l: row l / 2, columns 8 (l % 2) .. + 7 of each tile), four k at
    // a time: 4 values of A's row, then per k and tile 8 of B's.
    const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll 1
    for (int k0 = 0; k0 < ksteps * 16; k0 += 4) {
      float a[4];
      if constexpr (ACol) {
#pragma unroll
        for (int u = 0; u < 4; ++u) a[u] = A[(k0 + u) * lda + r];
      } else {
        const float4 a4 = *reinterpret_cast<const float4*>(A + r * lda + k0);
        a[0] = a4.x, a[1] = a4.y, a[2] = a4.z, a[3] = a4.w;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int t = 0; t < TN; ++t) {
          float b[8];
          if constexpr (BCol) {
#pragma unroll
            for (int c = 0; c < 8; ++c) b[c] = B[(t * 16 + c0 + c) * ldb + k0 + u];
          } else {
            load8(B + (k0 + u) * ldb + t * 16 + c0, b);
          }
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[t].x[c] = fmaf(a[u], b[c], acc[t].x[c]);
        }
    }
  } else {
    using namespace nvcuda;
    using LA = std::conditional_t<ACol, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<BCol, wmma::col_major, wmma::row_major>;
#pragma unroll 1
    for (int k = 0; k < ksteps; ++k) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a;
      wmma::load_matrix_sync(a, ACol ? A + k * 16 * lda : A + k * 16, unsigned(lda));
#pragma unroll
      for (int t = 0; t < TN; ++t) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> b;
        wmma::load_matrix_sync(b, BCol ? B + t * 16 * ldb + k * 16 : B + k * 16 * ldb + t * 16, unsigned(ldb));
        wmma::mma_sync(acc[t], a, b, acc[t]);
      }
    }
  }
}

// acc[t] += (A . f) B_t over `ksteps` steps of 16: A 16 rows, row-major (lda), each column k
// times f[k]; B_t the t-th 16 columns of B, column-major (BCol: B_t at B + t*16*ldb) or row-major.
// `piece` is the warp's 16 x kPieceLd tile.
template <bool BCol, int TN, class T>
__device__ void mma_scaled_a(typename Tiles<T>::Acc* acc, const T* A, int lda, const float* f, const T* B, int ldb,
                             int ksteps, T* piece) {
  const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll 1
  for (int k = 0; k < ksteps; ++k) {
    float x[8], s[8];
    load8(A + r * lda + k * 16 + c0, x);
    load8(f + k * 16 + c0, s);
#pragma unroll
    for (int c = 0; c < 8; ++c) x[c] *= s[c];
    store8(piece + r * kPieceLd + c0, x);
    __syncwarp();
    warp_mma<BCol, TN>(acc, piece, kPieceLd, BCol ? B + k * 16 : B + k * 16 * ldb, ldb, 1);
    __syncwarp();  // every lane has read the piece before it is written again
  }
}

// acc[t] += A (B_t . f_t) over `ksteps` steps of 16: A 16 rows, row-major (lda); B's column n
// (of the warp's 16 TN) times f[n]; B column-major (BCol) or row-major, as above.
template <bool BCol, int TN, class T>
__device__ void mma_scaled_b(typename Tiles<T>::Acc* acc, const T* A, int lda, const T* B, int ldb, const float* f,
                             int ksteps, T* piece) {
  const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll 1
  for (int k = 0; k < ksteps; ++k) {
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      float x[8];
      if constexpr (BCol) {  // column n = r of the piece: 8 consecutive k
        load8(B + (t * 16 + r) * ldb + k * 16 + c0, x);
        const float s = f[t * 16 + r];
#pragma unroll
        for (int c = 0; c < 8; ++c) x[c] *= s;
      } else {  // row k = r of the piece: 8 consecutive n
        float s[8];
        load8(B + (k * 16 + r) * ldb + t * 16 + c0, x);
        load8(f + t * 16 + c0, s);
#pragma unroll
        for (int c = 0; c < 8; ++c) x[c] *= s[c];
      }
      store8(piece + r * kPieceLd + c0, x);
      __syncwarp();
      warp_mma<BCol, 1>(&acc[t], A + k * 16, lda, piece, kPieceLd, 1);
      __syncwarp();
    }
  }
}

// f(t, r, c, value) for the elements of a warp's 16 x 16 TN block that lane l owns in Tiles<float>'s
// layout: row l / 2, columns 8 (l % 2) .. + 7 of each tile t. float: the accumulator's own
// registers; bf16: through the warp's float scratch (the lanes' share of a WMMA accumulator is
// unspecified): store, update, load back.
template <class T, int TN, class F>
__device__ void each_lane(WarpBlock<T, 1, TN>& acc, float* scratch, F&& f) {
  const int lane = int(threadIdx.x) & 31, r = lane >> 1, c0 = (lane & 1) * 8;
#pragma unroll
  for (int t = 0; t < TN; ++t) {
    if constexpr (std::is_same<T, float>::value) {
#pragma unroll
      for (int c = 0; c < 8; ++c) f(t, r, c0 + c, acc.acc[0][t].x[c]);
    } else {
      Tiles<T>::store(scratch, acc.acc[0][t], kTileScratchLd);
      __syncwarp();
#pragma unroll
      for (int c = 0; c < 8; ++c) f(t, r, c0 + c, scratch[r * kTileScratchLd + c0 + c]);
      __syncwarp();
      Tiles<T>::load(acc.acc[0][t], scratch, kTileScratchLd);
      __syncwarp();
    }
  }
}

// The warp's per-channel factors: f[d] = exp(x(d)) for d < count (x a double sum of log-gates,
// <= 0), 0 from count to `padded` (the padded channels' operands are zero either way).
template <class X>
__device__ void warp_factors(float* f, int count, int padded, X&& x) {
  for (int d = int(threadIdx.x & 31); d < padded; d += 32) f[d] = d < count ? expf(float(x(d))) : 0.0f;
  __syncwarp();
}

}  // namespace
}  // namespace lattn::cuda

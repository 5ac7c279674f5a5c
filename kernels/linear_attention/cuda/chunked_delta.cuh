// What the delta rule's chunked kernels share on the device (cuda/chunked_delta_*.cu, over
// cuda/chunked_delta.hpp): where a chunk lives in every tensor, the chunk's gates, the lower
// triangle of 16 x 16 score tiles and its gated products, the triangular solve, and the per-tile
// element-wise steps. Included inside each .cu's own unit (internal linkage).
//
// A chunk is one (sequence, value head, chunk) triple: a packed document's chunks start at its
// first token, and a chunk never straddles two documents. Its n <= kDeltaMaxChunk rows are padded
// with zeros to CP = round16(chunk) rows, so that every tile product runs on whole 16 x 16 tiles.
// Wide operands (the key and value dims) are taken in slabs of kSlabBytes per row (64 bf16 or 32
// float columns), so that shared memory depends on the chunk and the slab, not on Dk and Dv.
//
// Gates, in log space (docs/kernels.md): b_i = g_0 + ... + g_i from the chunk's first row, summed
// in double, and only differences exponentiated, each <= 0, so that strong gates never overflow.
// Scalar gates (none and retnet as the fixed log-gates 0 and log gamma) keep b per row in double.
// Vector gates keep, per slab of channels, b relative to the start of its sub-chunk of 16 rows,
// bt_i = b_i - r_I (float, small), and the references r_I = b_{16 I - 1} (double, r_0 = 0,
// r_NB = b_{n-1}); a score between sub-chunks I > J factors as
//     exp(b_i - b_m) = exp(bt_i) . exp(r_I - r_{J+1}) . exp(bt_{last of J} - bt_m),   each <= 1,
// so the tile products take operands scaled by factors <= 1, and pairs within one sub-chunk are
// summed element by element with exp(bt_i - bt_m).
#pragma once

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cstddef>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/warp_tiles.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.hpp"

namespace lattn::cuda {
namespace {

constexpr int kDeltaMaxChunk = kDeltaChunkLimit;  // the solve's tile: the longest chunk the kernels take
constexpr int kSub = 16;                          // sub-chunk rows of vector gates: one WMMA tile
constexpr int kSlabBytes = 128;                   // bytes of one row of a staged slab of a wide operand
constexpr int kMaxSubs = kDeltaMaxChunk / kSub;
constexpr int kMaxLowerTiles = kMaxSubs * (kMaxSubs + 1) / 2;

enum class Gates { fixed, scalar, vector };  // fixed: none or retnet (a constant log-gate per head)

template <class T>
constexpr int slab_cols() {
  return kSlabBytes / int(sizeof(T));
}

// Blocks of `shared` bytes an A100 keeps on one multiprocessor (164 KiB, 1 KiB of it reserved per
// block), at most `cap`: what a kernel's __launch_bounds__ promise, so that the promise holds on
// A100 and Hopper alike (ptxas sizes the registers for it: 4 blocks of 128 threads, 128 registers).
constexpr int a100_blocks(std::size_t shared, int cap) {
  const int n = int(std::size_t(164 * 1024) / (shared + 1024));
  return n < 1 ? 1 : n > cap ? cap : n;
}
// A row of a staged tile of `cols` elements of size es, padded by one 16-byte access against bank conflicts.
__host__ __device__ constexpr int padded(int cols, int es) { return cols + 16 / es; }

// A problem as the kernels see it: docs/spec.md section 1c's shapes (grouped q/k heads, Dk x Dv
// states, packed documents). Packed documents' token and chunk boundaries are device memory.
struct DeltaShape {
  int T, H, Hk, group, Dk, Dv, C;
  int sequences;       // states per head: batch rows, or packed documents
  int chunks_per_seq;  // dense problems: chunks of every sequence
  int total_chunks;    // over all sequences (per value head)
  Gates gates;
  bool retnet;
  const int* cu;         // packed: the documents' first tokens (sequences + 1), else null
  const int* cu_chunks;  // packed: the documents' first chunks (sequences + 1), else null
};

inline DeltaShape delta_shape(const DeltaLaunch& l) {
  const Problem& p = *l.problem;
  DeltaShape s{};
  s.T = p.seq, s.H = p.heads, s.Hk = p.qk_heads(), s.group = p.group(), s.Dk = p.dim, s.Dv = p.value_dim();
  s.C = l.chunk, s.sequences = p.sequences(), s.chunks_per_seq = (p.seq + l.chunk - 1) / l.chunk;
  s.total_chunks = l.total_chunks;
  s.gates = p.decay == Decay::vector ? Gates::vector : p.decay == Decay::scalar ? Gates::scalar : Gates::fixed;
  s.retnet = p.decay == Decay::retnet;
  s.cu = l.cu, s.cu_chunks = l.cu_chunks;
  return s;
}

inline Gates gates_of(const Problem& p) {
  return p.decay == Decay::vector ? Gates::vector : p.decay == Decay::scalar ? Gates::scalar : Gates::fixed;
}

// A kernel as a launch runs it on the current device: its threads, shared memory, the blocks per
// multiprocessor its launch bounds promise and those that can reside (cudaOccupancy...).
template <class Kernel>
ChunkedKernel kernel_info(const char* name, Kernel kernel, int threads, std::size_t shared, int min_blocks) {
  const int device = current_device();
  allow_shared(kernel, device, shared);
  int blocks = 0;
  LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared));
  return {name, threads, 0, shared, min_blocks, blocks};
}

// One chunk of one (sequence, value head) pair. Token tensors keep the layouts of
// kernels/linear_attention/problem.hpp; the scratch token tensors (W, U and their gradients) have
// v's rows, [B][H][T][D] for D = Dk or Dv, and the chunk states one slot per (chunk, value head).
struct DeltaChunk {
  std::size_t key;    // element offset of the chunk's first row in q, k, dq, dk
  std::size_t tok;    // token index of the chunk's first row in the value head's rows (v: tok * Dv; beta: tok)
  std::size_t state;  // the chunk's slot: global chunk * H + value head
  int n;              // rows
  int head;           // value head
  int seq;            // sequence (or document)
  int index;          // chunk of its sequence
};

__device__ __forceinline__ int sequence_of_chunk(const DeltaShape& s, int gc) {
  if (!s.cu_chunks) return gc / s.chunks_per_seq;
  int lo = 0, hi = s.sequences - 1;  // the last document whose first chunk is <= gc
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s.cu_chunks[mid] <= gc)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ DeltaChunk delta_chunk(const DeltaShape& s, int gc, int h) {
  DeltaChunk d;
  d.seq = sequence_of_chunk(s, gc);
  d.index = s.cu_chunks ? gc - s.cu_chunks[d.seq] : gc - d.seq * s.chunks_per_seq;
  const int start = s.cu ? s.cu[d.seq] : 0, length = s.cu ? s.cu[d.seq + 1] - start : s.T;
  const int b = s.cu ? 0 : d.seq, t0 = start + d.index * s.C;
  d.tok = (std::size_t(b) * s.H + h) * s.T + t0;
  d.key = ((std::size_t(b) * s.Hk + h / s.group) * s.T + t0) * s.Dk;
  d.state = std::size_t(gc) * s.H + h;
  d.n = min(s.C, length - d.index * s.C);
  d.head = h;
  return d;
}

// The fixed log-gate of a value head: log gamma_h for retnet, 0 for none.
__device__ __forceinline__ double fixed_log_gate(bool retnet, int head) {
  return retnet ? log1p(-ldexp(1.0, -5 - head)) : 0.0;
}

// ---- gates ----

// Scalar log-gates of a chunk: b[i] = g_0 + ... + g_i in double for i < n (g: the chunk's gates, or
// null for the fixed log-gate lg), b[i] = b[n-1] past n; by warp 0, lanes taking rows l and l + 32.
// The caller synchronises before reading b.
__device__ inline void scalar_gate_sums(double* b, const float* g, double lg, int n) {
  if (threadIdx.x >= 32) return;
  const int lane = int(threadIdx.x);
  double x0 = lane < n ? (g ? double(g[lane]) : lg) : 0.0;
  double x1 = lane + 32 < n ? (g ? double(g[lane + 32]) : lg) : 0.0;
  for (int d = 1; d < 32; d *= 2) {
    const double y0 = __shfl_up_sync(0xffffffffu, x0, unsigned(d)), y1 = __shfl_up_sync(0xffffffffu, x1, unsigned(d));
    if (lane >= d) x0 += y0, x1 += y1;
  }
  const double first = __shfl_sync(0xffffffffu, x0, 31);
  b[lane] = x0;
  b[lane + 32] = first + x1;
}

// exp of a difference of log-gates formed in double: exact to float's rounding of the result.
__device__ __forceinline__ float exp_diff(double a, double b) { return expf(float(a - b)); }

// Vector log-gates of channels c0 .. c0 + W - 1 of a chunk (g: the chunk's first row, rows of Dk):
// bt[i][j] = b_i - r_I (float, leading dimension ldb), ref[I][j] = r_I (double, I = 0 .. NB, W
// per row) with r_I = b at row 16 I - 1 (r_0 = 0) and r_NB = b_{n-1}. Rows past n and channels past
// Dk add nothing. One thread per channel walks the rows; the caller synchronises.
__device__ inline void vector_gate_slab(float* bt, int ldb, double* ref, const float* g, int Dk, int c0, int W, int n,
                                        int CP) {
  for (int j = int(threadIdx.x); j < W; j += int(blockDim.x)) {
    const bool live = c0 + j < Dk;
    double b = 0.0, r = 0.0;
    for (int i = 0; i < CP; ++i) {
      if (i % kSub == 0) ref[(i / kSub) * W + j] = r = b;
      if (live && i < n) b += double(g[std::size_t(i) * Dk + c0 + j]);
      bt[i * ldb + j] = float(b - r);
    }
    ref[(CP / kSub) * W + j] = b;
  }
}

// The vector gates' factors for row i, channel j of a slab (all <= 1).
struct VectorGates {
  const float* bt;
  const double* ref;
  int ldb, W, NB;
  __device__ float within(int i, int j) const { return expf(bt[i * ldb + j]); }  // exp(b_i - r_I)
  __device__ float to_end(int m, int j) const {  // exp(b_{last of J} - b_m), J the sub-chunk of m
    const int last = (m / kSub) * kSub + kSub - 1;
    return expf(bt[last * ldb + j] - bt[m * ldb + j]);
  }
  __device__ float between(int I, int J, int j) const {  // exp(r_I - r_{J+1}), I > J
    return exp_diff(ref[I * W + j], ref[(J + 1) * W + j]);
  }
  __device__ float pair(int i, int m, int j) const {  // exp(b_i - b_m), i and m in one sub-chunk
    return expf(bt[i * ldb + j] - bt[m * ldb + j]);
  }
  __device__ float total(int i, int j) const {  // exp(b_i)
    return expf(float(ref[(i / kSub) * W + j] + double(bt[i * ldb + j])));
  }
  __device__ float decay_to_end(int i, int j) const {  // exp(b_{n-1} - b_i)
    return expf(float(ref[NB * W + j] - ref[(i / kSub) * W + j]) - bt[i * ldb + j]);
  }
  __device__ float chunk_decay(int j) const { return expf(float(ref[NB * W + j])); }  // exp(b_{n-1})
};

// ---- tiles ----

// Lower tile t of a triangle of 16 x 16 tiles, row by row: (0,0), (1,0), (1,1), (2,0), ...
__device__ __forceinline__ void lower_tile(int t, int& I, int& J) {
  I = 0;
  while ((I + 1) * (I + 2) / 2 <= t) ++I;
  J = t - I * (I + 1) / 2;
}

// acc += A(tile row I) B(tile column J) over k-steps [k0, k1): A, B row-major or column-major as
// for WarpBlock (kernels/cuda/warp_tiles.cuh).
template <bool ACol, bool BCol, class T, class Acc>
__device__ __forceinline__ void tile_mma(Acc& acc, const T* A, int lda, const T* B, int ldb, int I, int J, int k0,
                                         int k1) {
  for (int k = k0; k < k1; ++k)
    Tiles<T>::template mma<ACol, BCol>(acc, A + (ACol ? k * 16 * lda + I * 16 : I * 16 * lda + k * 16), lda,
                                       B + (BCol ? J * 16 * ldb + k * 16 : k * 16 * ldb + J * 16), ldb);
}

// f(r, c, value) for each element of a 16 x 16 accumulator tile (value a float&; changes stay with
// Reload): float32 tiles in the lane's own registers, bf16 ones through the warp's float scratch
// (16 x kTileScratchLd), since WMMA leaves the lanes' share unspecified.
template <bool Reload, class T, class Acc, class F>
__device__ __forceinline__ void tile_each(Acc& acc, float* scratch, F&& f) {
  const int lane = int(threadIdx.x) & 31;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int c = 0; c < 8; ++c) f(lane >> 1, (lane & 1) * 8 + c, acc.x[c]);
  } else {
    Tiles<T>::store(scratch, acc, kTileScratchLd);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) f(e >> 4, e & 15, scratch[(e >> 4) * kTileScratchLd + (e & 15)]);
    __syncwarp();
    if (Reload) Tiles<T>::load(acc, scratch, kTileScratchLd);
    __syncwarp();
  }
}

// Every element of an accumulator tile times f (no lane mapping needed).
template <class T, class Acc>
__device__ __forceinline__ void scale_tile(Acc& acc, float f) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int c = 0; c < 8; ++c) acc.x[c] *= f;
  } else {
    for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= f;
  }
}

// f(r, c, a, b) for each element of two accumulator tiles at once (values as floats, not kept):
// float32 tiles in registers, bf16 ones through two float scratch tiles of the warp.
template <class T, class Acc, class F>
__device__ __forceinline__ void tile_each_pair(Acc& a, Acc& b, float* scratch, float* scratch2, F&& f) {
  const int lane = int(threadIdx.x) & 31;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int c = 0; c < 8; ++c) f(lane >> 1, (lane & 1) * 8 + c, a.x[c], b.x[c]);
  } else {
    Tiles<T>::store(scratch, a, kTileScratchLd);
    Tiles<T>::store(scratch2, b, kTileScratchLd);
    __syncwarp();
    for (int e = lane; e < 256; e += 32)
      f(e >> 4, e & 15, scratch[(e >> 4) * kTileScratchLd + (e & 15)], scratch2[(e >> 4) * kTileScratchLd + (e & 15)]);
    __syncwarp();
  }
}

// out += x, element by element (the two tiles share their lanes' mapping).
template <class T, class Acc>
__device__ __forceinline__ void add_tile(Acc& out, const Acc& x) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int c = 0; c < 8; ++c) out.x[c] += x.x[c];
  } else {
    for (int e = 0; e < out.num_elements; ++e) out.x[e] += x.x[e];
  }
}

// ---- the score triangle ----

// The lower tiles (I, J), J <= I < NB, of X Y^T over slabs of W columns (X, Y: CP x W slabs, row-
// major, leading dimension ld), each tile held in registers by warp t % warps: MaxTiles per warp.
// Vector gates: the tiles below the diagonal take X_I . exp(b - r_I) . exp(r_I - r_{J+1}) (built
// per tile in the warp's `lhs` buffer, 16 x ld) against Yk = Y . exp(b_{last} - b) (built per slab by
// the caller); the diagonal tiles are summed element by element into `sf` by add_diagonal.
template <class T, int MaxTiles>
struct ScoreTiles {
  typename Tiles<T>::Acc acc[MaxTiles];
  int warp, warps, tiles;

  __device__ ScoreTiles(int NB, int warps_) : warp(int(threadIdx.x) >> 5), warps(warps_), tiles(NB * (NB + 1) / 2) {
#pragma unroll
    for (int u = 0; u < MaxTiles; ++u) Tiles<T>::zero(acc[u]);
  }

  __device__ void add_plain(const T* X, const T* Y, int ld, int ksteps) {
#pragma unroll
    for (int u = 0; u < MaxTiles; ++u) {
      const int t = warp + u * warps;
      if (t >= tiles) break;
      int I, J;
      lower_tile(t, I, J);
      tile_mma<false, true>(acc[u], X, ld, Y, ld, I, J, 0, ksteps);
    }
  }

  __device__ void add_vector(const T* X, const T* Yk, int ld, int ksteps, T* lhs, const VectorGates& vg) {
    const int lane = int(threadIdx.x) & 31;
#pragma unroll
    for (int u = 0; u < MaxTiles; ++u) {
      const int t = warp + u * warps;
      if (t >= tiles) break;
      int I, J;
      lower_tile(t, I, J);
      if (I == J) continue;
      for (int e = lane; e < 16 * ksteps * 16; e += 32) {
        const int r = e / (ksteps * 16), j = e - r * (ksteps * 16), i = I * 16 + r;
        lhs[r * ld + j] = from_float<T>(to_float(X[i * ld + j]) * vg.within(i, j) * vg.between(I, J, j));
      }
      __syncwarp();
      tile_mma<false, true>(acc[u], lhs, ld, Yk, ld, 0, J, 0, ksteps);
      __syncwarp();
    }
  }

  // The tiles into sf (CP x ldf floats); vector gates' diagonal tiles are left as they are.
  __device__ void store(float* sf, int ldf, bool skip_diagonal) {
#pragma unroll
    for (int u = 0; u < MaxTiles; ++u) {
      const int t = warp + u * warps;
      if (t >= tiles) break;
      int I, J;
      lower_tile(t, I, J);
      if (skip_diagonal && I == J) continue;
      Tiles<T>::store(sf + I * 16 * ldf + J * 16, acc[u], ldf);
    }
  }
};

// Yk = Y . exp(b_{last of J} - b) for a vector-gated slab (the right operand of every tile below
// the diagonal), by the whole block; the caller synchronises.
template <class T>
__device__ void scale_to_end(T* Yk, const T* Y, int ld, int CP, int W, const VectorGates& vg) {
  for (int e = int(threadIdx.x); e < CP * W; e += int(blockDim.x)) {
    const int m = e / W, j = e - m * W;
    Yk[m * ld + j] = from_float<T>(to_float(Y[m * ld + j]) * vg.to_end(m, j));
  }
}

// Vector gates' diagonal tiles: sf[i][m] += sum_j X[i][j] Y[m][j] exp(b_i - b_m) over the slab's W
// columns, for m <= i in one sub-chunk. Thread t takes pairs t, t + threads, ... (the same ones for
// every slab, so the sums need no barrier between slabs).
template <class T>
__device__ void add_diagonal(float* sf, int ldf, const T* X, const T* Y, int ld, int NB, int W, const VectorGates& vg) {
  const int pairs = NB * (kSub * (kSub + 1) / 2);
  for (int p = int(threadIdx.x); p < pairs; p += int(blockDim.x)) {
    const int I = p / (kSub * (kSub + 1) / 2);
    int r, c;
    lower_tile(p - I * (kSub * (kSub + 1) / 2), r, c);  // the pair (r, c), c <= r, within the sub-chunk
    const int i = I * kSub + r, m = I * kSub + c;
    float sum = 0.0f;
    for (int j = 0; j < W; ++j) sum = fmaf(to_float(X[i * ld + j]) * to_float(Y[m * ld + j]), vg.pair(i, m, j), sum);
    sf[i * ldf + m] += sum;
  }
}

// Zero the diagonal tiles of sf (the vector gates' element-wise sums start from them).
__device__ inline void zero_diagonal(float* sf, int ldf, int NB) {
  for (int e = int(threadIdx.x); e < NB * 256; e += int(blockDim.x)) {
    const int I = e / 256, r = (e / 16) % 16, c = e % 16;
    sf[(I * 16 + r) * ldf + I * 16 + c] = 0.0f;
  }
}

// ---- the score gradients' products with vector gates ----

// Leading dimension of a warp's 16 x 16 right operand (rhs below).
template <class T>
constexpr int rhs_ld() {
  return padded(16, int(sizeof(T)));
}

// out += tile (I, jt) of P * X with vector gates, w_im = exp(b_i - b_m) per channel (m <= i):
//   rows form:        out_i = sum_{m <= i} P[i][m] w_im . x_m   (dq from dP_qk and K; dK's read part)
//   transposed form:  out_m = sum_{i >= m} P[i][m] w_im . x_i   (dK's write part)
// P: CP x CP in the token dtype (leading dimension ldp; lower); X: a slab whose columns are vg's
// channels. The score tiles off the diagonal by products with a right operand scaled for the tile
// pair (16 x 16, the warp's `rhs`), then times the output row's own factor; the diagonal tile pair
// by pair. Every factor is one of VectorGates' (<= 1).
template <bool kTransposed, class T, class Acc>
__device__ void gated_star_tile(Acc& out, const T* P, int ldp, const T* X, int ldx, int I, int jt, int NB, T* rhs,
                                float* scratch, const VectorGates& vg) {
  const int lane = int(threadIdx.x) & 31;
  constexpr int ldr = rhs_ld<T>();
  Acc acc;
  Tiles<T>::zero(acc);
  const int from = kTransposed ? I + 1 : 0, to = kTransposed ? NB : I;
  for (int K = from; K < to; ++K) {
    const int Ir = kTransposed ? K : I, Jc = kTransposed ? I : K;  // the score tile (Ir, Jc), Ir > Jc
    for (int e = lane; e < 256; e += 32) {
      const int r = e >> 4, c = e & 15, j = jt * 16 + c;
      const int row = (kTransposed ? Ir : Jc) * 16 + r;
      const float f = kTransposed ? vg.within(row, j) : vg.to_end(row, j);
      rhs[r * ldr + c] = from_float<T>(to_float(X[row * ldx + j]) * f * vg.between(Ir, Jc, j));
    }
    __syncwarp();
    Tiles<T>::template mma<kTransposed, false>(acc, P + Ir * 16 * ldp + Jc * 16, ldp, rhs, ldr);
    __syncwarp();
  }
  tile_each<true, T>(acc, scratch, [&](int r, int c, float& v) {
    const int a = I * 16 + r, j = jt * 16 + c;
    float sum = v * (kTransposed ? vg.to_end(a, j) : vg.within(a, j));
    if (!kTransposed)
      for (int m = I * 16; m <= a; ++m) sum += to_float(P[a * ldp + m]) * vg.pair(a, m, j) * to_float(X[m * ldx + j]);
    else
      for (int i = a; i < I * 16 + 16; ++i)
        sum += to_float(P[i * ldp + a]) * vg.pair(i, a, j) * to_float(X[i * ldx + j]);
    v = sum;
  });
  add_tile<T>(out, acc);
}

// ---- the triangular solve ----

// T = (I + B)^-1 in place for B strictly lower (CP x CP floats, leading dimension ld; zero on and
// above the diagonal), by blocked forward substitution in float32: each warp inverts diagonal
// tiles (row by row, a lane per column), then the tiles below, a row of tiles at a time:
// T_IJ = -T_II (B_IJ T_JJ + ... + B_I,I-1 T_I-1,J). `scratch`: the warp's 16 x kTileScratchLd floats.
// Ends with a barrier.
__device__ inline void invert_unit_lower(float* A, int ld, int NB, float* scratch) {
  const int warp = int(threadIdx.x) >> 5, warps = int(blockDim.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int I = warp; I < NB; I += warps) {
    float* D = A + I * 16 * ld + I * 16;
    const int j = lane & 15;
    for (int i = 0; i < 16; ++i) {
      float t = 0.0f;
      for (int m = j; m < i; ++m) t = fmaf(D[i * ld + m], D[m * ld + j], t);
      __syncwarp();
      if (lane < 16) D[i * ld + j] = j < i ? -t : j == i ? 1.0f : 0.0f;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int I = 1; I < NB; ++I) {
    Tiles<float>::Acc y;
    const bool mine = warp < I;  // warp J computes T_IJ
    if (mine) {
      const int J = warp;
      Tiles<float>::Acc x;
      Tiles<float>::zero(x);
      for (int K = J; K < I; ++K)
        Tiles<float>::mma<false, false>(x, A + I * 16 * ld + K * 16, ld, A + K * 16 * ld + J * 16, ld);
      Tiles<float>::store(scratch, x, kTileScratchLd);
      __syncwarp();
      Tiles<float>::zero(y);
      Tiles<float>::mma<false, false>(y, A + I * 16 * ld + I * 16, ld, scratch, kTileScratchLd);
      __syncwarp();
    }
    __syncthreads();  // every warp has read row I's B before any T_IJ overwrites it
    if (mine) {
      for (int c = 0; c < 8; ++c) y.x[c] = -y.x[c];
      Tiles<float>::store(A + I * 16 * ld + warp * 16, y, ld);
    }
    __syncthreads();
  }
}

}  // namespace
}  // namespace lattn::cuda

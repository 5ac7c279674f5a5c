// The chunked form's sequential part on the GPU (cuda/chunked.hpp): one pass over the chunks of
// each (batch x head) that writes the state entering every chunk (the forward's h_c) or the
// gradient of the state leaving it (the backward's dh_c), for the chunk-parallel kernels of
// cuda/chunked.cu to read. It is the light part of the work: per chunk of n rows one D x D
// update, S <- gamma^n S + (diag(w) A_c)^T X_c (2 n D^2 flops), against the chunk-parallel
// kernels' intra-chunk products and their state term; what it costs is its length (the chunks
// one after another) and the states it writes.
//
// Tiling: one block of 4 warps per (batch x head, 64 state rows, 64 state columns), each warp a
// 32 x 32 share held in registers for the whole walk (2 x 2 tiles, register-blocked). The chunk's
// rows are staged 64 tokens at a time (the 64 columns of A and of X the block's tile needs), by
// cp.async into one of two buffers while the block computes on the other. Per staged block: wait
// for it, weight A's rows in shared memory, one 64 x 64 x 64 product. Entering a chunk, the block
// writes its tile of S into the chunk's slot, then decays it by gamma^n.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/warp_tiles.cuh"
#include "kernels/linear_attention/cuda/chunked.hpp"

namespace lattn::cuda {
namespace {

constexpr int kPassThreads = 128;  // 4 warps, 2 x 2 over the block's state tile
constexpr int kTile = 64;          // state rows and columns per block; tokens per staged block
// Blocks per multiprocessor the pass is built for (its shared memory lets that many reside on A100
// and H100 alike; the launch-bounds promise caps the registers accordingly).
template <class T> constexpr int kPassMinBlocks = sizeof(T) == 2 ? 3 : 2;

struct PassLayout {
  int ld;  // leading dimension (elements) of the staged tiles: 64 plus one 16-byte access of padding
  std::size_t a[2], x[2], scratch, total;
};

__host__ __device__ inline PassLayout pass_layout(int es) {
  PassLayout L{};
  L.ld = kTile + 16 / es;
  const std::size_t tile = align128(std::size_t(kTile) * L.ld * es);
  L.a[0] = 0;
  L.a[1] = tile;
  L.x[0] = 2 * tile;
  L.x[1] = 3 * tile;
  L.scratch = 4 * tile;
  L.total = L.scratch + (es == 4 ? 0 : align128(std::size_t(4) * 16 * kTileScratchLd * 4));  // bf16's epilogue scratch
  return L;
}

struct PassParams {
  const void* a;
  const void* x;
  const float* s0;
  float* final_state;
  void* states;
  int T, D, H, C, chunks;
  bool retnet, reverse;
  float scale;
};

// The block's tile of S (rows row0.., columns col0.. of a D x D matrix) into dst.
template <class U, class Block>
__device__ void store_state(Block& S, float* scratch, U* dst, int D, int row0, int col0) {
  const int warp = int(threadIdx.x) >> 5;
  const int r0 = row0 + (warp >> 1) * 32, c0 = col0 + (warp & 1) * 32;
  S.template each_element<false>(scratch, [&](int i, int j, int er, int ec, float& v) {
    const int r = r0 + i * 16 + er, c = c0 + j * 16 + ec;
    if (r < D && c < D) dst[std::size_t(r) * D + c] = from_float<U>(v);
  });
}

template <class T>
__global__ void __launch_bounds__(kPassThreads, kPassMinBlocks<T>) chunk_state_kernel(PassParams p) {
  using Block = WarpBlock<T, 2, 2>;
  extern __shared__ __align__(128) unsigned char smem[];
  const PassLayout L = pass_layout(int(sizeof(T)));
  const int warp = int(threadIdx.x) >> 5, wm = warp >> 1, wn = warp & 1;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;
  // The two buffers of A and of X: base + buffer * step (a run-time index into an array of
  // pointers would put the array on the stack).
  T* const A0 = reinterpret_cast<T*>(smem + L.a[0]);
  T* const X0 = reinterpret_cast<T*>(smem + L.x[0]);
  const int step = int((L.a[1] - L.a[0]) / sizeof(T));

  const int D = p.D, bh = int(blockIdx.x), head = bh % p.H;
  const int row0 = int(blockIdx.y) * kTile, col0 = int(blockIdx.z) * kTile;
  const float log2g = p.retnet ? float(log2(1.0 - ldexp(1.0, -5 - head))) : 0.0f;  // gamma^k = 2^(k log2 gamma)
  const std::size_t tok = std::size_t(bh) * p.T * D, dd = std::size_t(D) * D;
  const T* A = static_cast<const T*>(p.a) + tok;
  const T* X = static_cast<const T*>(p.x) + tok;
  T* states = static_cast<T*>(p.states) + std::size_t(bh) * p.chunks * dd;

  // The walk, in staged blocks of 64 tokens: step s is block b of chunk c (walk order).
  const int per_chunk = (p.C + kTile - 1) / kTile, last_n = p.T - (p.chunks - 1) * p.C;
  const int last_blocks = (last_n + kTile - 1) / kTile, steps = (p.chunks - 1) * per_chunk + last_blocks;
  auto locate = [&](int s, int& c, int& b) {
    if (!p.reverse) {
      c = s / per_chunk, b = s - c * per_chunk;
    } else if (s < last_blocks) {
      c = p.chunks - 1, b = s;
    } else {
      const int u = s - last_blocks;
      c = p.chunks - 2 - u / per_chunk, b = u - (u / per_chunk) * per_chunk;
    }
  };
  auto stage = [&](int s, int buf) {
    int c, b;
    locate(s, c, b);
    const std::size_t t0 = std::size_t(c) * p.C + std::size_t(b) * kTile;
    const int valid = min(kTile, min(p.C, p.T - c * p.C) - b * kTile);
    stage_async<kPassThreads>(A0 + buf * step, L.ld, A + t0 * D + row0, D, valid, D - row0, kTile, kTile);
    stage_async<kPassThreads>(X0 + buf * step, L.ld, X + t0 * D + col0, D, valid, D - col0, kTile, kTile);
    __pipeline_commit();
  };

  Block S;
  S.zero();
  S.template each_element<true>(scratch, [&](int i, int j, int er, int ec, float& v) {
    const int r = row0 + wm * 32 + i * 16 + er, c = col0 + wn * 32 + j * 16 + ec;
    v = r < D && c < D ? p.s0[std::size_t(bh) * dd + std::size_t(r) * D + c] : 0.0f;
  });

  stage(0, 0);
  for (int s = 0; s < steps; ++s) {
    const int buf = s & 1;
    if (s + 1 < steps) {
      stage(s + 1, buf ^ 1);  // its buffer was last read before the barrier that ended step s - 1
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    int c, b;
    locate(s, c, b);
    const int n = min(p.C, p.T - c * p.C);
    if (b == 0) {  // entering chunk c: keep the state it enters with, then decay it over the chunk
      store_state(S, scratch, states + std::size_t(c) * dd, D, row0, col0);
      S.scale(exp2f(log2g * float(n)));
    }
    // Only the staged rows that hold tokens (a short chunk, a ragged end): the rest are zeros.
    const int valid = min(kTile, n - b * kTile), ksteps = (valid + 15) / 16;
    T* a = A0 + buf * step;
    for (int e = int(threadIdx.x); e < valid * kTile; e += kPassThreads) {
      const int r = e / kTile, k = e - r * kTile, i = b * kTile + r;  // token i of the chunk
      const float w = p.reverse ? p.scale * exp2f(log2g * float(i + 1)) : exp2f(log2g * float(n - 1 - i));
      a[r * L.ld + k] = from_float<T>(to_float(a[r * L.ld + k]) * w);
    }
    __syncthreads();
    S.template mma<true, false>(a + wm * 32, L.ld, X0 + buf * step + wn * 32, L.ld, ksteps);  // S += A^T X
    __syncthreads();
  }
  if (p.final_state) store_state(S, scratch, p.final_state + std::size_t(bh) * dd, D, row0, col0);
}

template <class T>
KernelShape shape_of() {
  return {kPassThreads, pass_layout(int(sizeof(T))).total, kPassMinBlocks<T>};
}

}  // namespace

KernelShape chunk_state_pass_shape(Dtype dtype) { return dtype == Dtype::f32 ? shape_of<float>() : shape_of<bf16>(); }

int chunk_state_pass_occupancy(Dtype dtype) {
  const KernelShape s = chunk_state_pass_shape(dtype);
  const int device = current_device();
  int blocks = 0;
  auto query = [&](auto kernel) {
    allow_shared(kernel, device, s.shared);
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, s.threads, s.shared));
  };
  if (dtype == Dtype::f32)
    query(chunk_state_kernel<float>);
  else
    query(chunk_state_kernel<bf16>);
  return blocks;
}

void chunk_state_pass(const Problem& pr, Dtype dtype, const StatePassArgs& a, cudaStream_t stream) {
  PassParams p{};
  p.a = a.a, p.x = a.x, p.s0 = a.s0, p.final_state = a.final_state, p.states = a.states;
  p.T = pr.seq, p.D = pr.dim, p.H = pr.heads, p.C = std::min(pr.chunk, pr.seq);
  p.chunks = (p.T + p.C - 1) / p.C;
  p.retnet = pr.decay == Decay::retnet, p.reverse = a.reverse;
  p.scale = float(attention_scale(pr.dim));
  const KernelShape shape = chunk_state_pass_shape(dtype);
  const unsigned tiles = unsigned((pr.dim + kTile - 1) / kTile);
  const dim3 grid(unsigned(pr.heads_total()), tiles, tiles);
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shape.shared);
    kernel<<<grid, kPassThreads, shape.shared, stream>>>(p);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (dtype == Dtype::f32)
    go(chunk_state_kernel<float>);
  else
    go(chunk_state_kernel<bf16>);
}

}  // namespace lattn::cuda

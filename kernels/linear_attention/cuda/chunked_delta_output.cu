// The delta rule's chunked form on the GPU, its chunk-parallel output (docs/kernels.md): with
// A_qk[i][m] = q_i . exp(b_i - b_m) . k_m (m <= i), S the state entering the chunk and V_new its
// pending values (cuda/chunked_delta_states.cu),
//     forward:   O = s ((Q . exp(b)) S + A_qk V_new)
//     backward:  dV_local = s A_qk^T dO      (the part of dV_new within the chunk)
// Every chunk at once: one block of 4 warps per (chunk, value head, 64 value columns), grid
// (chunks over every sequence, value heads, Dv / 64); the output tile CP x 64 in registers (each
// warp a quarter of its 16 x 16 tiles). The block sums A_qk's lower tiles and, forward, the state
// term over slabs of the key dim (Q, K and 64 rows of the state's 64 columns staged per slab), then
// writes A_qk masked and scaled into shared memory (the token dtype: the product's left operand,
// read transposed for dV_local) and takes one product with V_new's (or dO's) 64 columns. Vector
// gates' scores as in cuda/chunked_delta.cuh; the forward's state term takes Q . exp(b) (<= 1).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.cuh"

namespace lattn::cuda {
namespace {

constexpr int kOutThreads = 128;
constexpr int kOutWarps = 4;
constexpr int kOutCols = 64;                                       // value columns per block
constexpr int kOutTiles = kMaxSubs * (kOutCols / 16) / kOutWarps;  // output tiles per warp

struct OutputLayout {
  int ldS, ldX, ldF, ldT, ldB;
  std::size_t q, k, st, qg, yk, lhs, bt, ref, sf, bsum, scratch, total;
};

__host__ __device__ constexpr OutputLayout output_layout(int CP, int es, Gates gates, bool transposed) {
  const int W = kSlabBytes / es, NB = CP / kSub;
  const bool vector = gates == Gates::vector;
  OutputLayout L{};
  L.ldS = padded(W, es);
  L.ldX = padded(kOutCols, es);
  L.ldF = CP + 4;
  L.ldT = padded(CP, es);
  L.ldB = W + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align128(bytes);
    return here;
  };
  auto larger = [](std::size_t a, std::size_t b) { return a > b ? a : b; };
  // Q's slab, later the product's right operand (V_new or dO); K's slab, later A_qk as an operand.
  L.q = take(larger(std::size_t(CP) * L.ldS, std::size_t(CP) * L.ldX) * es);
  L.k = take(larger(std::size_t(CP) * L.ldS, std::size_t(CP) * L.ldT) * es);
  L.st = take(transposed ? 0 : std::size_t(W) * L.ldX * es);
  L.qg = take(vector && !transposed ? std::size_t(CP) * L.ldS * es : 0);
  L.yk = take(vector ? std::size_t(CP) * L.ldS * es : 0);
  L.lhs = take(vector ? std::size_t(kOutWarps) * 16 * L.ldS * es : 0);
  L.bt = take(vector ? std::size_t(CP) * L.ldB * 4 : 0);
  L.ref = take(vector ? std::size_t(NB + 1) * W * 8 : 0);
  L.sf = take(std::size_t(CP) * L.ldF * 4);
  L.bsum = take(vector ? 0 : std::size_t(kDeltaMaxChunk) * 8);
  L.scratch = take(std::size_t(kOutWarps) * 16 * kTileScratchLd * 4);
  L.total = at;
  return L;
}

struct OutputParams {
  DeltaShape shape;
  const void* q;
  const void* k;
  const float* g;
  const void* states;
  const void* x;  // V_new (forward) or dO (backward): v's rows
  float* out;
  float scale;
};

// The launch bounds' blocks per multiprocessor: what fits at the longest chunk (cuda/chunked_delta.cuh).
template <class T, Gates kG, bool kTransposed>
constexpr int kOutMinBlocks = a100_blocks(output_layout(kDeltaMaxChunk, int(sizeof(T)), kG, kTransposed).total, 4);

template <class T, Gates kG, bool kTransposed>
__global__ void __launch_bounds__(kOutThreads, kOutMinBlocks<T, kG, kTransposed>) delta_output_kernel(OutputParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int W = slab_cols<T>();
  constexpr bool kVector = kG == Gates::vector;
  const DeltaShape& s = p.shape;
  const DeltaChunk ch = delta_chunk(s, int(blockIdx.x), int(blockIdx.y));
  const int n = ch.n, CP = round16(s.C), NB = CP / kSub, Dk = s.Dk, Dv = s.Dv, col0 = int(blockIdx.z) * kOutCols;
  const OutputLayout L = output_layout(CP, int(sizeof(T)), kG, kTransposed);
  T* sq = reinterpret_cast<T*>(smem + L.q);
  T* sk = reinterpret_cast<T*>(smem + L.k);
  T* sst = reinterpret_cast<T*>(smem + L.st);
  T* qg = reinterpret_cast<T*>(smem + L.qg);
  T* yk = reinterpret_cast<T*>(smem + L.yk);
  float* bt = reinterpret_cast<float*>(smem + L.bt);
  double* ref = reinterpret_cast<double*>(smem + L.ref);
  float* sf = reinterpret_cast<float*>(smem + L.sf);
  double* bsum = reinterpret_cast<double*>(smem + L.bsum);
  const int warp = int(threadIdx.x) >> 5;
  T* lhs = reinterpret_cast<T*>(smem + L.lhs) + warp * 16 * L.ldS;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;
  const T* Q = static_cast<const T*>(p.q) + ch.key;
  const T* K = static_cast<const T*>(p.k) + ch.key;
  const T* S = kTransposed ? nullptr : static_cast<const T*>(p.states) + ch.state * std::size_t(Dk) * Dv;
  const float* gv = kVector ? p.g + ch.tok * Dk : nullptr;
  const VectorGates vg{bt, ref, L.ldB, W, NB};
  const int cols = min(kOutCols, Dv - col0), col_tiles = (cols + 15) / 16, tiles = NB * col_tiles;

  if constexpr (!kVector)
    scalar_gate_sums(bsum, kG == Gates::scalar ? p.g + ch.tok : nullptr, fixed_log_gate(s.retnet, ch.head), n);
  if constexpr (kVector) zero_diagonal(sf, L.ldF, NB);

  // The output tiles (I, J) = (t / col_tiles, t % col_tiles), t = warp, warp + 4, ...
  typename Tiles<T>::Acc O[kOutTiles];
#pragma unroll
  for (int u = 0; u < kOutTiles; ++u) Tiles<T>::zero(O[u]);

  ScoreTiles<T, 3> scores(NB, kOutWarps);
  for (int c0 = 0; c0 < Dk; c0 += W) {
    const int valid = min(W, Dk - c0), ksteps = (valid + 15) / 16;
    stage_async<kOutThreads>(sq, L.ldS, Q + c0, std::size_t(Dk), n, valid, CP, W);
    stage_async<kOutThreads>(sk, L.ldS, K + c0, std::size_t(Dk), n, valid, CP, W);
    if (!kTransposed)
      stage_async<kOutThreads>(sst, L.ldX, S + std::size_t(c0) * Dv + col0, std::size_t(Dv), valid, cols, W, kOutCols);
    __pipeline_commit();
    if constexpr (kVector) vector_gate_slab(bt, L.ldB, ref, gv, Dk, c0, W, n, CP);
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (kVector) {
      scale_to_end(yk, sk, L.ldS, CP, W, vg);
      if (!kTransposed)
        for (int e = int(threadIdx.x); e < CP * W; e += kOutThreads) {
          const int i = e / W, j = e - i * W;
          qg[i * L.ldS + j] = from_float<T>(to_float(sq[i * L.ldS + j]) * vg.total(i, j));
        }
      __syncthreads();
      add_diagonal(sf, L.ldF, sq, sk, L.ldS, NB, W, vg);
      scores.add_vector(sq, yk, L.ldS, ksteps, lhs, vg);
    } else {
      scores.add_plain(sq, sk, L.ldS, ksteps);
    }
    if (!kTransposed)
#pragma unroll
      for (int u = 0; u < kOutTiles; ++u) {
        const int t = warp + u * kOutWarps;
        if (t < tiles)
          tile_mma<false, false>(O[u], kVector ? qg : sq, L.ldS, sst, L.ldX, t / col_tiles, t % col_tiles, 0, ksteps);
      }
    __syncthreads();
  }
  scores.store(sf, L.ldF, kVector);
  // The right operand: V_new's (or dO's) block of columns, into Q's slab.
  T* sx = sq;
  stage_async<kOutThreads>(sx, L.ldX, static_cast<const T*>(p.x) + ch.tok * Dv + col0, std::size_t(Dv), n, cols, CP,
                           kOutCols);
  __pipeline_commit();
  if (!kTransposed)  // the state term's row factors: s exp(b_i) (vector gates: exp(b) is in Q . exp(b))
#pragma unroll
    for (int u = 0; u < kOutTiles; ++u) {
      const int t = warp + u * kOutWarps;
      if (t >= tiles) continue;
      const int I = t / col_tiles;
      tile_each<true, T>(O[u], scratch, [&](int r, int, float& x) {
        x *= kVector ? p.scale : p.scale * expf(float(bsum[min(I * 16 + r, kDeltaMaxChunk - 1)]));
      });
    }
  __syncthreads();
  // A_qk: lower with its diagonal, rows past n zero, times s (and the scalar gates' exp(b_i - b_m)),
  // into K's slab as the product's left operand.
  T* aop = sk;
  for (int e = int(threadIdx.x); e < CP * CP; e += kOutThreads) {
    const int i = e / CP, m = e - i * CP;
    float a = 0.0f;
    if (m <= i && i < n) {
      a = p.scale * sf[i * L.ldF + m];
      if constexpr (!kVector) a *= exp_diff(bsum[i], bsum[m]);
    }
    aop[i * L.ldT + m] = from_float<T>(a);
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  float* out = p.out + ch.tok * Dv + col0;
#pragma unroll
  for (int u = 0; u < kOutTiles; ++u) {
    const int t = warp + u * kOutWarps;
    if (t >= tiles) continue;
    const int I = t / col_tiles, J = t % col_tiles;
    if (kTransposed)
      tile_mma<true, false>(O[u], aop, L.ldT, sx, L.ldX, I, J, I, NB);
    else
      tile_mma<false, false>(O[u], aop, L.ldT, sx, L.ldX, I, J, 0, I + 1);
    tile_each<false, T>(O[u], scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r, j = J * 16 + c;
      if (i < n && j < cols) out[std::size_t(i) * Dv + j] = x;
    });
  }
}

template <class T, bool kTransposed>
void launch_typed(const DeltaLaunch& l, const OutputParams& params, cudaStream_t stream) {
  const Problem& p = *l.problem;
  const Gates gates = params.shape.gates;
  const std::size_t shared = output_layout(round16(l.chunk), int(sizeof(T)), gates, kTransposed).total;
  const dim3 grid(unsigned(l.total_chunks), unsigned(p.heads), unsigned((p.value_dim() + kOutCols - 1) / kOutCols));
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kOutThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (gates == Gates::vector)
    go(delta_output_kernel<T, Gates::vector, kTransposed>);
  else if (gates == Gates::scalar)
    go(delta_output_kernel<T, Gates::scalar, kTransposed>);
  else
    go(delta_output_kernel<T, Gates::fixed, kTransposed>);
}

}  // namespace

std::size_t delta_output_shared(const Problem& p, Dtype dtype) {
  return output_layout(round16(std::min(p.chunk, kDeltaMaxChunk)), element_size(dtype), gates_of(p), false).total;
}

ChunkedKernel delta_output_info(const Problem& p, Dtype dtype, bool transposed) {
  const std::size_t shared =
      output_layout(round16(std::min(p.chunk, kDeltaMaxChunk)), element_size(dtype), gates_of(p), transposed).total;
  const char* name = transposed ? "delta_output_kernel (dV_local)" : "delta_output_kernel";
  auto info = [&](auto t, auto tr) {
    using T = decltype(t);
    constexpr bool kT = decltype(tr)::value;
    auto one = [&](auto kernel, int bounds) { return kernel_info(name, kernel, kOutThreads, shared, bounds); };
    switch (gates_of(p)) {
      case Gates::vector:
        return one(delta_output_kernel<T, Gates::vector, kT>, kOutMinBlocks<T, Gates::vector, kT>);
      case Gates::scalar:
        return one(delta_output_kernel<T, Gates::scalar, kT>, kOutMinBlocks<T, Gates::scalar, kT>);
      default:
        return one(delta_output_kernel<T, Gates::fixed, kT>, kOutMinBlocks<T, Gates::fixed, kT>);
    }
  };
  using Yes = std::integral_constant<bool, true>;
  using No = std::integral_constant<bool, false>;
  if (dtype == Dtype::f32) return transposed ? info(float{}, Yes{}) : info(float{}, No{});
  return transposed ? info(bf16{}, Yes{}) : info(bf16{}, No{});
}

void delta_output(const DeltaLaunch& l, const void* q, const void* k, const float* g, const void* states, const void* x,
                  float* out, bool transposed, cudaStream_t stream) {
  const OutputParams params{delta_shape(l), q, k, g, states, x, out, float(attention_scale(l.problem->dim))};
  if (l.dtype == Dtype::f32)
    transposed ? launch_typed<float, true>(l, params, stream) : launch_typed<float, false>(l, params, stream);
  else
    transposed ? launch_typed<bf16, true>(l, params, stream) : launch_typed<bf16, false>(l, params, stream);
}

}  // namespace lattn::cuda

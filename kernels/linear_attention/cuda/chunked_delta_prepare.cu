// The delta rule's chunked form on the GPU, its intra-chunk part (docs/kernels.md, the delta rule's
// chunked WY form): per chunk of n rows, with b the cumulative log-gates from the chunk's start,
//     A = diag(beta) ((K K^T) . exp(b_i - b_m))   strictly lower,   T = (I + A)^-1,
//     W = T diag(beta) (K . exp(b)),   U = T diag(beta) V,
// which the state pass (cuda/chunked_delta_states.cu) turns into the pending values
// V_new = U - W S. Nothing here depends on the state, so every chunk runs at once: one block of 4
// warps per (chunk, value head), grid (chunks over every sequence, value heads).
//
// Per block: A's lower 16 x 16 tiles are summed over slabs of the key dim (64 bf16 or 32 float
// columns, staged by cp.async), each warp holding up to three tiles in registers; vector gates
// take their tiles below the diagonal from operands scaled by factors <= 1 and their diagonal tiles
// pair by pair (cuda/chunked_delta.cuh). A goes to shared memory in float32, masked and scaled by
// beta, and T is solved in place in float32 (blocked forward substitution). T diag(beta) (and for
// scalar gates T diag(beta exp(b))) is rounded to the token dtype as the products' left operand;
// W and U are written slab by slab, each output tile k-steps deep only as far as T's triangle.
// Shared memory depends on the chunk and the slab, not on Dk or Dv.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.cuh"

namespace lattn::cuda {
namespace {

constexpr int kPrepareThreads = 128;
constexpr int kPrepareWarps = kPrepareThreads / 32;

struct PrepareLayout {
  int ldS, ldF, ldT, ldB;  // slab, float scores, T operand, vector gates (elements)
  std::size_t slab, yk, lhs, bt, ref, sf, top, top2, beta, bsum, scratch, total;
};

__host__ __device__ constexpr PrepareLayout prepare_layout(int CP, int es, Gates gates) {
  const int W = kSlabBytes / es, NB = CP / kSub;
  const bool vector = gates == Gates::vector, scalar = !vector;
  PrepareLayout L{};
  L.ldS = padded(W, es);
  L.ldF = CP + 4;
  L.ldT = padded(CP, es);
  L.ldB = W + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align128(bytes);
    return here;
  };
  L.slab = take(std::size_t(CP) * L.ldS * es);
  L.yk = take(vector ? std::size_t(CP) * L.ldS * es : 0);
  L.lhs = take(vector ? std::size_t(kPrepareWarps) * 16 * L.ldS * es : 0);
  L.bt = take(vector ? std::size_t(CP) * L.ldB * 4 : 0);
  L.ref = take(vector ? std::size_t(NB + 1) * W * 8 : 0);
  L.sf = take(std::size_t(CP) * L.ldF * 4);
  L.top = take(std::size_t(CP) * L.ldT * es);
  L.top2 = take(scalar ? std::size_t(CP) * L.ldT * es : 0);
  L.beta = take(std::size_t(CP) * 4);
  L.bsum = take(scalar ? std::size_t(kDeltaMaxChunk) * 8 : 0);
  L.scratch = take(std::size_t(kPrepareWarps) * 16 * kTileScratchLd * 4);
  L.total = at;
  return L;
}

struct PrepareParams {
  DeltaShape shape;
  const void* k;
  const void* v;
  const float* beta;
  const float* g;
  void* w;
  void* u;
};

// out[rows of the chunk][c0 + columns] = L X for L (CP x CP, lower, leading dimension ldT) and a slab
// X (CP x W): every output tile by one warp, k-steps up to its row of tiles.
template <class T>
__device__ void lower_times_slab(const T* Lm, int ldT, const T* X, int ldS, int CP, int W, int valid_cols, T* out,
                                 int D, int n, float* scratch) {
  const int warp = int(threadIdx.x) >> 5, NB = CP / kSub, cols = (valid_cols + 15) / 16;
  for (int t = warp; t < NB * cols; t += kPrepareWarps) {
    const int I = t / cols, J = t - I * cols;
    typename Tiles<T>::Acc acc;
    Tiles<T>::zero(acc);
    tile_mma<false, false>(acc, Lm, ldT, X, ldS, I, J, 0, I + 1);
    tile_each<false, T>(acc, scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r, j = J * 16 + c;
      if (i < n && j < valid_cols) out[std::size_t(i) * D + j] = from_float<T>(x);
    });
  }
  (void)W;
}

// The launch bounds' blocks per multiprocessor: what fits at the longest chunk (cuda/chunked_delta.cuh).
template <class T, Gates kG>
constexpr int kPrepareMinBlocks = a100_blocks(prepare_layout(kDeltaMaxChunk, int(sizeof(T)), kG).total, 4);

template <class T, Gates kG>
__global__ void __launch_bounds__(kPrepareThreads, kPrepareMinBlocks<T, kG>) delta_prepare_kernel(PrepareParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int W = slab_cols<T>();
  constexpr bool kVector = kG == Gates::vector;
  const DeltaShape& s = p.shape;
  const DeltaChunk ch = delta_chunk(s, int(blockIdx.x), int(blockIdx.y));
  const int n = ch.n, CP = round16(s.C), NB = CP / kSub, Dk = s.Dk, Dv = s.Dv;
  const PrepareLayout L = prepare_layout(CP, int(sizeof(T)), kG);
  T* slab = reinterpret_cast<T*>(smem + L.slab);
  T* yk = reinterpret_cast<T*>(smem + L.yk);
  float* bt = reinterpret_cast<float*>(smem + L.bt);
  double* ref = reinterpret_cast<double*>(smem + L.ref);
  float* sf = reinterpret_cast<float*>(smem + L.sf);
  T* top = reinterpret_cast<T*>(smem + L.top);
  T* top2 = reinterpret_cast<T*>(smem + L.top2);
  float* beta = reinterpret_cast<float*>(smem + L.beta);
  double* bsum = reinterpret_cast<double*>(smem + L.bsum);
  const int warp = int(threadIdx.x) >> 5;
  T* lhs = reinterpret_cast<T*>(smem + L.lhs) + warp * 16 * L.ldS;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;
  const T* K = static_cast<const T*>(p.k) + ch.key;
  const float* gv = kVector ? p.g + ch.tok * Dk : nullptr;
  const VectorGates vg{bt, ref, L.ldB, W, NB};

  for (int i = int(threadIdx.x); i < CP; i += kPrepareThreads) beta[i] = i < n ? p.beta[ch.tok + i] : 0.0f;
  if constexpr (!kVector)
    scalar_gate_sums(bsum, kG == Gates::scalar ? p.g + ch.tok : nullptr, fixed_log_gate(s.retnet, ch.head), n);
  if constexpr (kVector) zero_diagonal(sf, L.ldF, NB);

  // A = K K^T with the gates, over slabs of the key dim.
  ScoreTiles<T, 3> scores(NB, kPrepareWarps);
  for (int c0 = 0; c0 < Dk; c0 += W) {
    const int valid = min(W, Dk - c0), ksteps = (valid + 15) / 16;
    stage_async<kPrepareThreads>(slab, L.ldS, K + c0, std::size_t(Dk), n, valid, CP, W);
    __pipeline_commit();
    if constexpr (kVector) vector_gate_slab(bt, L.ldB, ref, gv, Dk, c0, W, n, CP);
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (kVector) {
      scale_to_end(yk, slab, L.ldS, CP, W, vg);
      __syncthreads();
      add_diagonal(sf, L.ldF, slab, slab, L.ldS, NB, W, vg);
      scores.add_vector(slab, yk, L.ldS, ksteps, lhs, vg);
    } else {
      scores.add_plain(slab, slab, L.ldS, ksteps);
    }
    __syncthreads();
  }
  scores.store(sf, L.ldF, kVector);
  __syncthreads();
  // A: strictly lower, rows past n zero, scaled by beta (and the scalar gates' exp(b_i - b_m)).
  for (int e = int(threadIdx.x); e < CP * CP; e += kPrepareThreads) {
    const int i = e / CP, m = e - i * CP;
    float a = 0.0f;
    if (m < i && i < n) {
      a = beta[i] * sf[i * L.ldF + m];
      if constexpr (!kVector) a *= exp_diff(bsum[i], bsum[m]);
    }
    sf[i * L.ldF + m] = a;
  }
  __syncthreads();
  invert_unit_lower(sf, L.ldF, NB, scratch);
  // The left operands: T diag(beta), and for scalar gates T diag(beta exp(b)).
  for (int e = int(threadIdx.x); e < CP * CP; e += kPrepareThreads) {
    const int i = e / CP, m = e - i * CP;
    const float t = sf[i * L.ldF + m] * beta[m];
    top[i * L.ldT + m] = from_float<T>(t);
    if constexpr (!kVector) top2[i * L.ldT + m] = from_float<T>(t * expf(float(bsum[m])));
  }
  // W = T diag(beta) (K . exp(b)), slab by slab of the key dim.
  T* w = static_cast<T*>(p.w) + ch.tok * Dk;
  for (int c0 = 0; c0 < Dk; c0 += W) {
    const int valid = min(W, Dk - c0);
    __syncthreads();  // the slab's last readers are done (and the operands above are written)
    stage_async<kPrepareThreads>(slab, L.ldS, K + c0, std::size_t(Dk), n, valid, CP, W);
    __pipeline_commit();
    if constexpr (kVector) vector_gate_slab(bt, L.ldB, ref, gv, Dk, c0, W, n, CP);
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (kVector) {
      for (int e = int(threadIdx.x); e < CP * W; e += kPrepareThreads) {
        const int i = e / W, j = e - i * W;
        slab[i * L.ldS + j] = from_float<T>(to_float(slab[i * L.ldS + j]) * vg.total(i, j));
      }
      __syncthreads();
    }
    lower_times_slab(kVector ? top : top2, L.ldT, slab, L.ldS, CP, W, valid, w + c0, Dk, n, scratch);
  }
  // U = T diag(beta) V, slab by slab of the value dim.
  const T* V = static_cast<const T*>(p.v) + ch.tok * Dv;
  T* u = static_cast<T*>(p.u) + ch.tok * Dv;
  for (int c0 = 0; c0 < Dv; c0 += W) {
    const int valid = min(W, Dv - c0);
    __syncthreads();
    stage_async<kPrepareThreads>(slab, L.ldS, V + c0, std::size_t(Dv), n, valid, CP, W);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    lower_times_slab(top, L.ldT, slab, L.ldS, CP, W, valid, u + c0, Dv, n, scratch);
  }
}

template <class T>
void launch_typed(const DeltaLaunch& l, const PrepareParams& params, cudaStream_t stream) {
  const Problem& p = *l.problem;
  const Gates gates = params.shape.gates;
  const std::size_t shared = prepare_layout(round16(l.chunk), int(sizeof(T)), gates).total;
  const dim3 grid(unsigned(l.total_chunks), unsigned(p.heads));
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kPrepareThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (gates == Gates::vector)
    go(delta_prepare_kernel<T, Gates::vector>);
  else if (gates == Gates::scalar)
    go(delta_prepare_kernel<T, Gates::scalar>);
  else
    go(delta_prepare_kernel<T, Gates::fixed>);
}

}  // namespace

std::size_t delta_prepare_shared(const Problem& p, Dtype dtype) {
  return prepare_layout(round16(std::min(p.chunk, kDeltaMaxChunk)), element_size(dtype), gates_of(p)).total;
}

ChunkedKernel delta_prepare_info(const Problem& p, Dtype dtype) {
  const std::size_t shared = delta_prepare_shared(p, dtype);
  auto info = [&](auto t) {
    using T = decltype(t);
    auto one = [&](auto kernel, int bounds) {
      return kernel_info("delta_prepare_kernel", kernel, kPrepareThreads, shared, bounds);
    };
    switch (gates_of(p)) {
      case Gates::vector:
        return one(delta_prepare_kernel<T, Gates::vector>, kPrepareMinBlocks<T, Gates::vector>);
      case Gates::scalar:
        return one(delta_prepare_kernel<T, Gates::scalar>, kPrepareMinBlocks<T, Gates::scalar>);
      default:
        return one(delta_prepare_kernel<T, Gates::fixed>, kPrepareMinBlocks<T, Gates::fixed>);
    }
  };
  return dtype == Dtype::f32 ? info(float{}) : info(bf16{});
}

void delta_prepare(const DeltaLaunch& l, const void* k, const void* v, const float* beta, const float* g, void* w,
                   void* u, cudaStream_t stream) {
  const PrepareParams params{delta_shape(l), k, v, beta, g, w, u};
  if (l.dtype == Dtype::f32)
    launch_typed<float>(l, params, stream);
  else
    launch_typed<bf16>(l, params, stream);
}

}  // namespace lattn::cuda

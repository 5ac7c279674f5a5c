// The delta rule's chunked backward on the GPU through the WY form (docs/kernels.md): per chunk, with
// A = (K K^T) . exp(b_i - b_m) (strictly lower), T = (I + diag(beta) A)^-1, W = T diag(beta)
// (K . exp(b)), U = T diag(beta) V, and the gradients dV_new (= dU: cuda/chunked_delta_states.cu,
// reverse) and dW (cuda/chunked_delta_dqk.cu):
//     dR = T^T dV_new,        dv = diag(beta) dR,               dbeta += rows of dR . V
//     Y  = T^T dW,            dk_read += beta exp(b) . Y,        dbeta += rows of Y . K . exp(b)
//     dB = -dR V_new^T,       dbeta += rows of dB . A,           dA = diag(beta) dB (strictly lower)
//     dk_read += dA * K,      dk_write += dA^T * K               (* with the gates, as for dq)
// added to the dk the dq / dk kernel wrote, and dg per chunk from the identity (docs/kernels.md)
//     dg_i = rowsum(dS . S) - sum_{tau < i} (q . dq - k . dk_write + k . dk_read)_tau
// with S the state entering the chunk and dS its gradient (their row sums from the reverse state
// pass), per key channel for vector gates, summed over them for scalar gates.
//
// Tiling: one block of 4 warps per (chunk, value head), grid (chunks over every sequence, value
// heads). A's lower tiles are summed over slabs of the key dim as in cuda/chunked_delta_prepare.cu
// and T solved in float32; then the value dim in slabs (dR's tiles by T^T's triangle, dv written,
// dB's lower tiles summed in registers), then the key dim in slabs again (Y, dA * K, dA^T * K per
// output tile, dk written, dg's terms). Row sums (dbeta, scalar gates' dg) and the vector gates'
// running sums down a channel go through shared memory in a fixed order: no atomics, the same bits
// every run. Slabs are 64 bytes wide here (32 bf16 or 16 float columns): this kernel keeps more
// CP x CP and CP x slab buffers than the others.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.cuh"

namespace lattn::cuda {
namespace {

constexpr int kWyThreads = 128;
constexpr int kWyWarps = 4;
constexpr int kWySlabBytes = 64;

template <class T>
constexpr int wy_cols() {
  return kWySlabBytes / int(sizeof(T));
}

struct WyLayout {
  int ldS, ldF, ldT, ldB, ldX;
  std::size_t s1, s2, s3, s4, yk, lhs, bt, ref, af, tf, top, dpk, xb, yb, beta, dbeta, xrow, bsum, rhs, scratch, total;
};

__host__ __device__ constexpr WyLayout wy_layout(int CP, int es, Gates gates) {
  const int W = kWySlabBytes / es, NB = CP / kSub;
  const bool vector = gates == Gates::vector;
  WyLayout L{};
  L.ldS = padded(W, es);
  L.ldF = CP + 4;
  L.ldT = padded(CP, es);
  L.ldB = W + 4;
  L.ldX = W + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align128(bytes);
    return here;
  };
  const std::size_t slab = std::size_t(CP) * L.ldS * es, square = std::size_t(CP) * L.ldF * 4;
  L.s1 = take(slab);  // K; dV_new
  L.s2 = take(slab);  // V_new; dW
  L.s3 = take(slab);  // V; Q
  L.s4 = take(slab);  // dR
  L.yk = take(vector ? slab : 0);
  L.lhs = take(vector ? std::size_t(kWyWarps) * 16 * L.ldS * es : 0);
  L.bt = take(vector ? std::size_t(CP) * L.ldB * 4 : 0);
  L.ref = take(vector ? std::size_t(NB + 1) * W * 8 : 0);
  L.af = take(square);                         // A (no beta), for dbeta
  L.tf = take(square);                         // diag(beta) A, then T, then dR V_new^T
  L.top = take(std::size_t(CP) * L.ldT * es);  // T, the left operand of T^T products
  L.dpk = take(std::size_t(CP) * L.ldT * es);  // dA (with scalar gates' exp(b_i - b_m))
  L.xb = take(std::size_t(CP) * L.ldX * 4);    // per element: dR . V, then dg's terms
  L.yb = take(std::size_t(CP) * L.ldX * 4);    // per element: Y . K . exp(b)
  L.beta = take(std::size_t(CP) * 4);
  L.dbeta = take(std::size_t(CP) * 4);
  L.xrow = take(std::size_t(CP) * 8);  // scalar gates: dg's terms summed over the channels
  L.bsum = take(vector ? 0 : std::size_t(kDeltaMaxChunk) * 8);
  L.rhs = take(vector ? std::size_t(kWyWarps) * 16 * padded(16, es) * es : 0);
  L.scratch = take(std::size_t(kWyWarps) * 2 * 16 * kTileScratchLd * 4);
  L.total = at;
  return L;
}

struct WyParams {
  DeltaShape shape;
  const void *q, *k, *v, *v_new;
  const float *beta, *g, *dv_new, *dw, *dq, *row_sums;
  float *dk, *dv, *dbeta, *dg;
  bool parts;
  int sum_tiles;  // the reverse state pass's blocks of columns (row_sums' first dim)
};

template <class T, Gates kG>
constexpr int kWyMinBlocks = a100_blocks(wy_layout(kDeltaMaxChunk, int(sizeof(T)), kG).total, 4);

template <class T, Gates kG>
__global__ void __launch_bounds__(kWyThreads, kWyMinBlocks<T, kG>) delta_wy_kernel(WyParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int W = wy_cols<T>();
  constexpr bool kVector = kG == Gates::vector;
  const DeltaShape& s = p.shape;
  const DeltaChunk ch = delta_chunk(s, int(blockIdx.x), int(blockIdx.y));
  const int n = ch.n, CP = round16(s.C), NB = CP / kSub, Dk = s.Dk, Dv = s.Dv, tid = int(threadIdx.x);
  const WyLayout L = wy_layout(CP, int(sizeof(T)), kG);
  T* s1 = reinterpret_cast<T*>(smem + L.s1);
  T* s2 = reinterpret_cast<T*>(smem + L.s2);
  T* s3 = reinterpret_cast<T*>(smem + L.s3);
  T* s4 = reinterpret_cast<T*>(smem + L.s4);
  T* yk = reinterpret_cast<T*>(smem + L.yk);
  float* bt = reinterpret_cast<float*>(smem + L.bt);
  double* ref = reinterpret_cast<double*>(smem + L.ref);
  float* af = reinterpret_cast<float*>(smem + L.af);
  float* tf = reinterpret_cast<float*>(smem + L.tf);
  T* top = reinterpret_cast<T*>(smem + L.top);
  T* dpk = reinterpret_cast<T*>(smem + L.dpk);
  float* xb = reinterpret_cast<float*>(smem + L.xb);
  float* yb = reinterpret_cast<float*>(smem + L.yb);
  float* beta = reinterpret_cast<float*>(smem + L.beta);
  float* dbeta = reinterpret_cast<float*>(smem + L.dbeta);
  double* xrow = reinterpret_cast<double*>(smem + L.xrow);
  double* bsum = reinterpret_cast<double*>(smem + L.bsum);
  const int warp = tid >> 5;
  T* lhs = reinterpret_cast<T*>(smem + L.lhs) + warp * 16 * L.ldS;
  T* rhs = reinterpret_cast<T*>(smem + L.rhs) + warp * 16 * rhs_ld<T>();
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 2 * 16 * kTileScratchLd;
  float* scratch2 = scratch + 16 * kTileScratchLd;
  const VectorGates vg{bt, ref, L.ldB, W, NB};
  const T* K = static_cast<const T*>(p.k) + ch.key;
  const float* gv = kVector ? p.g + ch.tok * Dk : nullptr;
  const std::size_t slots = std::size_t(s.total_chunks) * s.H;

  for (int i = tid; i < CP; i += kWyThreads) {
    beta[i] = i < n ? p.beta[ch.tok + i] : 0.0f;
    dbeta[i] = 0.0f;
    xrow[i] = 0.0;
  }
  if constexpr (!kVector)
    scalar_gate_sums(bsum, kG == Gates::scalar ? p.g + ch.tok : nullptr, fixed_log_gate(s.retnet, ch.head), n);
  if constexpr (kVector) zero_diagonal(af, L.ldF, NB);

  // A = K K^T with the gates (cuda/chunked_delta_prepare.cu's first phase).
  {
    ScoreTiles<T, 3> scores(NB, kWyWarps);
    for (int c0 = 0; c0 < Dk; c0 += W) {
      const int valid = min(W, Dk - c0), ksteps = (valid + 15) / 16;
      stage_async<kWyThreads>(s1, L.ldS, K + c0, std::size_t(Dk), n, valid, CP, W);
      __pipeline_commit();
      if constexpr (kVector) vector_gate_slab(bt, L.ldB, ref, gv, Dk, c0, W, n, CP);
      __pipeline_wait_prior(0);
      __syncthreads();
      if constexpr (kVector) {
        scale_to_end(yk, s1, L.ldS, CP, W, vg);
        __syncthreads();
        add_diagonal(af, L.ldF, s1, s1, L.ldS, NB, W, vg);
        scores.add_vector(s1, yk, L.ldS, ksteps, lhs, vg);
      } else {
        scores.add_plain(s1, s1, L.ldS, ksteps);
      }
      __syncthreads();
    }
    scores.store(af, L.ldF, kVector);
  }
  __syncthreads();
  for (int e = tid; e < CP * CP; e += kWyThreads) {
    const int i = e / CP, m = e - i * CP;
    float a = 0.0f;
    if (m < i && i < n) {
      a = af[i * L.ldF + m];
      if constexpr (!kVector) a *= exp_diff(bsum[i], bsum[m]);
    }
    af[i * L.ldF + m] = a;
    tf[i * L.ldF + m] = beta[i] * a;
  }
  __syncthreads();
  invert_unit_lower(tf, L.ldF, NB, scratch);
  for (int e = tid; e < CP * CP; e += kWyThreads)
    top[(e / CP) * L.ldT + e % CP] = from_float<T>(tf[(e / CP) * L.ldF + e % CP]);

  // The value dim: dR = T^T dV_new, dv = beta dR, dbeta's rows of dR . V; dR V_new^T's lower tiles.
  const int Wt = W / 16;
  {
    ScoreTiles<T, 3> scores(NB, kWyWarps);
    for (int c0 = 0; c0 < Dv; c0 += W) {
      const int valid = min(W, Dv - c0), ksteps = (valid + 15) / 16;
      __syncthreads();  // the slabs' last readers are done (and T's operand is written)
      stage_async<kWyThreads>(s2, L.ldS, static_cast<const T*>(p.v_new) + ch.tok * Dv + c0, std::size_t(Dv), n, valid,
                              CP, W);
      stage_async<kWyThreads>(s3, L.ldS, static_cast<const T*>(p.v) + ch.tok * Dv + c0, std::size_t(Dv), n, valid, CP,
                              W);
      __pipeline_commit();
      for (int e = tid; e < CP * W; e += kWyThreads) {
        const int i = e / W, j = e - i * W;
        s1[i * L.ldS + j] = from_float<T>(i < n && j < valid ? p.dv_new[(ch.tok + i) * Dv + c0 + j] : 0.0f);
      }
      __pipeline_wait_prior(0);
      __syncthreads();
      for (int t = warp; t < NB * Wt; t += kWyWarps) {
        const int I = t / Wt, J = t % Wt;
        typename Tiles<T>::Acc acc;
        Tiles<T>::zero(acc);
        tile_mma<true, false>(acc, top, L.ldT, s1, L.ldS, I, J, I, NB);
        tile_each<false, T>(acc, scratch, [&](int r, int c, float& x) {
          const int i = I * 16 + r, j = J * 16 + c;
          const bool live = i < n && j < valid;
          if (live) p.dv[(ch.tok + i) * Dv + c0 + j] = beta[i] * x;
          xb[i * L.ldX + j] = live ? x * to_float(s3[i * L.ldS + j]) : 0.0f;
          s4[i * L.ldS + j] = from_float<T>(live ? x : 0.0f);
        });
      }
      __syncthreads();
      for (int i = tid; i < CP; i += kWyThreads) {
        float sum = 0.0f;
        for (int j = 0; j < W; ++j) sum += xb[i * L.ldX + j];
        dbeta[i] += sum;
      }
      scores.add_plain(s4, s2, L.ldS, ksteps);
    }
    scores.store(tf, L.ldF, false);  // T's float copy is no longer needed
  }
  __syncthreads();
  // dB = -dR V_new^T: dbeta's rows of dB . A; dA = diag(beta) dB (times the scalar gates' mask).
  for (int i = tid; i < CP; i += kWyThreads) {
    float sum = 0.0f;
    for (int m = 0; m < i; ++m) sum -= tf[i * L.ldF + m] * af[i * L.ldF + m];
    dbeta[i] += sum;
  }
  for (int e = tid; e < CP * CP; e += kWyThreads) {
    const int i = e / CP, m = e - i * CP;
    float d = 0.0f;
    if (m < i && i < n) {
      d = -beta[i] * tf[i * L.ldF + m];
      if constexpr (!kVector) d *= exp_diff(bsum[i], bsum[m]);
    }
    dpk[i * L.ldT + m] = from_float<T>(d);
  }

  // The key dim: Y = T^T dW, dk = dk + beta exp(b) . Y + dA * K + dA^T * K, dg's terms.
  const std::size_t key_rows = p.parts ? ch.tok * Dk : ch.key;
  for (int c0 = 0; c0 < Dk; c0 += W) {
    const int valid = min(W, Dk - c0);
    __syncthreads();
    stage_async<kWyThreads>(s1, L.ldS, K + c0, std::size_t(Dk), n, valid, CP, W);
    stage_async<kWyThreads>(s3, L.ldS, static_cast<const T*>(p.q) + ch.key + c0, std::size_t(Dk), n, valid, CP, W);
    __pipeline_commit();
    if constexpr (kVector) vector_gate_slab(bt, L.ldB, ref, gv, Dk, c0, W, n, CP);
    for (int e = tid; e < CP * W; e += kWyThreads) {
      const int i = e / W, j = e - i * W;
      s2[i * L.ldS + j] = from_float<T>(i < n && j < valid ? p.dw[(ch.tok + i) * Dk + c0 + j] : 0.0f);
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int t = warp; t < NB * Wt; t += kWyWarps) {
      const int I = t / Wt, J = t % Wt;
      typename Tiles<T>::Acc read, write;
      Tiles<T>::zero(read);
      Tiles<T>::zero(write);
      tile_mma<true, false>(read, top, L.ldT, s2, L.ldS, I, J, I, NB);  // Y
      tile_each<true, T>(read, scratch, [&](int r, int c, float& y) {
        const int i = I * 16 + r, j = J * 16 + c;
        const float gk = (kVector ? vg.total(i, j) : expf(float(bsum[i]))) * to_float(s1[i * L.ldS + j]);
        yb[i * L.ldX + j] = y * gk;
        y *= beta[i] * (kVector ? vg.total(i, j) : expf(float(bsum[i])));
      });
      if constexpr (kVector) {
        gated_star_tile<false>(read, dpk, L.ldT, s1, L.ldS, I, J, NB, rhs, scratch, vg);
        gated_star_tile<true>(write, dpk, L.ldT, s1, L.ldS, I, J, NB, rhs, scratch, vg);
      } else {
        tile_mma<false, false>(read, dpk, L.ldT, s1, L.ldS, I, J, 0, I + 1);
        tile_mma<true, false>(write, dpk, L.ldT, s1, L.ldS, I, J, I, NB);
      }
      tile_each_pair<T>(read, write, scratch, scratch2, [&](int r, int c, float rd, float wr) {
        const int i = I * 16 + r, j = J * 16 + c;
        float x = 0.0f;
        if (i < n && j < valid) {
          const std::size_t e = key_rows + std::size_t(i) * Dk + c0 + j;
          const float old = p.dk[e], kij = to_float(s1[i * L.ldS + j]);
          p.dk[e] = old + rd + wr;
          x = to_float(s3[i * L.ldS + j]) * p.dq[e] - kij * (old + wr) + kij * rd;
        }
        xb[i * L.ldX + j] = x;
      });
    }
    __syncthreads();
    for (int i = tid; i < CP; i += kWyThreads) {
      float sum = 0.0f;
      double terms = 0.0;
      for (int j = 0; j < W; ++j) sum += yb[i * L.ldX + j], terms += xb[i * L.ldX + j];
      dbeta[i] += sum;
      xrow[i] += terms;
    }
    if constexpr (kVector)  // dg down each channel: its row sum of dS . S, less the terms of the rows before
      for (int j = tid; j < valid; j += kWyThreads) {
        double run = 0.0;
        for (int t = 0; t < p.sum_tiles; ++t) run += p.row_sums[(std::size_t(t) * slots + ch.state) * Dk + c0 + j];
        for (int i = 0; i < n; ++i) {
          p.dg[(ch.tok + i) * Dk + c0 + j] = float(run);
          run -= xb[i * L.ldX + j];
        }
      }
  }
  __syncthreads();
  if (tid < 32 && !kVector && p.dg) {  // scalar gates: the same over every channel, by warp 0
    double total = 0.0;
    for (int e = tid; e < p.sum_tiles * Dk; e += 32)
      total += p.row_sums[(std::size_t(e / Dk) * slots + ch.state) * Dk + e % Dk];
    for (int d = 16; d > 0; d /= 2) total += __shfl_xor_sync(0xffffffffu, total, d);
    if (tid == 0)
      for (int i = 0; i < n; ++i) {
        p.dg[ch.tok + i] = float(total);
        total -= xrow[i];
      }
  }
  for (int i = tid; i < n; i += kWyThreads) p.dbeta[ch.tok + i] = dbeta[i];
}

template <class T>
void launch_typed(const DeltaLaunch& l, const WyParams& params, cudaStream_t stream) {
  const Problem& p = *l.problem;
  const Gates gates = params.shape.gates;
  const std::size_t shared = wy_layout(round16(l.chunk), int(sizeof(T)), gates).total;
  const dim3 grid(unsigned(l.total_chunks), unsigned(p.heads));
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kWyThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (gates == Gates::vector)
    go(delta_wy_kernel<T, Gates::vector>);
  else if (gates == Gates::scalar)
    go(delta_wy_kernel<T, Gates::scalar>);
  else
    go(delta_wy_kernel<T, Gates::fixed>);
}

}  // namespace

std::size_t delta_wy_shared(const Problem& p, Dtype dtype) {
  return wy_layout(round16(std::min(p.chunk, kDeltaMaxChunk)), element_size(dtype), gates_of(p)).total;
}

ChunkedKernel delta_wy_info(const Problem& p, Dtype dtype) {
  const std::size_t shared = delta_wy_shared(p, dtype);
  auto info = [&](auto t) {
    using T = decltype(t);
    auto one = [&](auto kernel, int bounds) {
      return kernel_info("delta_wy_kernel", kernel, kWyThreads, shared, bounds);
    };
    switch (gates_of(p)) {
      case Gates::vector:
        return one(delta_wy_kernel<T, Gates::vector>, kWyMinBlocks<T, Gates::vector>);
      case Gates::scalar:
        return one(delta_wy_kernel<T, Gates::scalar>, kWyMinBlocks<T, Gates::scalar>);
      default:
        return one(delta_wy_kernel<T, Gates::fixed>, kWyMinBlocks<T, Gates::fixed>);
    }
  };
  return dtype == Dtype::f32 ? info(float{}) : info(bf16{});
}

void delta_wy(const DeltaLaunch& l, const DeltaWyArgs& a, cudaStream_t stream) {
  const WyParams params{delta_shape(l),
                        a.q,
                        a.k,
                        a.v,
                        a.v_new,
                        a.beta,
                        a.g,
                        a.dv_new,
                        a.dw,
                        a.dq,
                        a.row_sums,
                        a.dk,
                        a.dv,
                        a.dbeta,
                        a.dg,
                        a.parts,
                        (l.problem->value_dim() + kDeltaStateCols - 1) / kDeltaStateCols};
  if (l.dtype == Dtype::f32)
    launch_typed<float>(l, params, stream);
  else
    launch_typed<bf16>(l, params, stream);
}

}  // namespace lattn::cuda

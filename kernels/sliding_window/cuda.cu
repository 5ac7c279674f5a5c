// Sliding-window softmax attention on the GPU (docs/spec.md section 2), forward and backward, float32 or
// bf16 token inputs; every softmax, accumulation and output is float32. bf16 tile products run on
// the tensor cores (WMMA 16x16x16, bf16 operands, float32 accumulators), float32 ones on the FMA
// units (the 16 x 16 warp tiles of kernels/cuda/warp_tiles.cuh).
//
// Math. Per (batch, head), with s = Dh^-1/2 and the window of query t, J(t) = [max(0, t-W+1), t]:
//     S_{t,tau} = s q_t . k_tau,   P_{t,tau} = exp(S_{t,tau} - L_t) on J(t) (0 elsewhere),
//     L_t = log sum_{tau in J(t)} exp(S_{t,tau}),   o_t = sum_tau P_{t,tau} v_tau.
// The forward saves L (float32, [B][H][T]). The backward of <O, dO> (FlashAttention-2):
//     D_t = dO_t . o_t  (= sum_tau P_{t,tau} dP_{t,tau}),   dP_{t,tau} = dO_t . v_tau,
//     dS_{t,tau} = P_{t,tau} (dP_{t,tau} - D_t),
//     dq_t = s sum_tau dS_{t,tau} k_tau,  dk_tau = s sum_t dS_{t,tau} q_t,  dv_tau = sum_t P_{t,tau} dO_t.
// P is recomputed from L in the backward, so nothing of size T x W is ever stored.
//
// Tiling. Query and key blocks of Bt rows (Bt = 64, else 32 or 16: the largest whose tiles fit in
// the opt-in shared memory; Dh zero-padded to Dp, a multiple of 16). One block (8 warps) per
// (batch x head, Bt-row block):
//   forward: a query block [q0, q0+Bt) visits only the key blocks that meet the union of its
//     windows, keys [max(0, q0-W+1), min(q0+Bt, T)-1]: at most ceil((Bt+W-1)/Bt)+1 blocks, so the
//     work is O(T (W + Bt) Dh) and the memory O(T Dh). Per key block: S = Q K^T (tile products into
//     shared memory), then one warp per row masks it, takes the running max m and sum l (online
//     softmax: O and l are rescaled by exp(m_old - m_new)), writes P (bf16-rounded for the tensor
//     cores), then O += P V. Fully masked rows (padding, or a key block before a row's window)
//     keep m = -inf and contribute exp(-inf) = 0; every real row sees its own key, so l > 0.
//   D: one warp per row, D_t = dO_t . o_t, into scratch from the Allocator (B*H*T floats).
//   dK, dV: a key block [k0, k0+Bt) keeps K, V and float32 dK, dV accumulators in shared memory and
//     visits the query blocks that can see it, [k0, min(T-1, k0+Bt-1+W-1)]; per query block:
//     P = exp(S - L), dV += P^T dO, dP = dO V^T, dS = P (dP - D), dK += dS^T Q.
//   dQ: a query block walks its key blocks as the forward does: P, dP, dS again, dQ += dS K.
// dQ is a separate launch instead of FlashAttention-2's atomics: deterministic, no float atomics,
// at the price of the score and dP products being computed twice. Accumulators live in shared
// memory (float32), tiles are zero-padded, so ragged T, any Dh and any W need no special path.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/problem.hpp"  // attention_scale
#include "kernels/sliding_window/cuda.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/warp_tiles.cuh"
#include "core/error.hpp"

namespace lattn::cuda {
namespace {

enum class Kind { forward, dq, dkv };

// Dynamic shared memory (byte offsets) of one block. Token tiles a..d are Bt x Dp (leading
// dimension ldD, element size es): forward Q, K, V; dq and dkv Q, dO, K, V. s and dp: float
// Bt x Bt score and dP tiles (ldS); p_op: the P / dS tensor-core operand (bf16; for float32 it is
// s itself, ldP = ldS); acc0 (acc1): float Bt x Dp accumulators (O or dQ; dK and dV); rows0,
// rows1: per-row floats (m and l; L and D).
struct Layout {
  int Bt, Dp, ldD, ldS, ldP, ldA;
  std::size_t a, b, c, d, s, dp, p_op, acc0, acc1, rows0, rows1, total;
};

__host__ __device__ inline Layout make_layout(Kind kind, int Bt, int D, int es) {
  Layout L{};
  L.Bt = Bt;
  L.Dp = round16(D);
  const int pad = 16 / es;  // one 16-byte access of padding per row against bank conflicts
  L.ldD = L.Dp + pad;
  L.ldS = Bt + 4;
  L.ldP = es == 4 ? L.ldS : Bt + pad;
  L.ldA = L.Dp + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at = align128(at + bytes);
    return here;
  };
  const std::size_t tile = std::size_t(Bt) * L.ldD * es, scores = std::size_t(Bt) * L.ldS * 4;
  const std::size_t acc = std::size_t(Bt) * L.ldA * 4;
  L.a = take(tile);
  L.b = take(tile);
  L.c = take(tile);
  L.d = kind == Kind::forward ? 0 : take(tile);
  L.s = take(scores);
  L.dp = kind == Kind::forward ? 0 : take(scores);
  L.p_op = es == 4 ? L.s : take(std::size_t(Bt) * L.ldP * es);
  L.acc0 = take(acc);
  L.acc1 = kind == Kind::dkv ? take(acc) : 0;
  L.rows0 = take(std::size_t(Bt) * 4);
  L.rows1 = take(std::size_t(Bt) * 4);
  L.total = at;
  return L;
}

struct SwaParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dO;
  const float* o;      // forward output (backward input)
  const float* lse;    // L (backward input)
  float* delta;        // D: written by the delta kernel, read by the dq and dkv kernels
  float* out;          // O (forward) or dQ (dq)
  float* lse_out;      // L (forward)
  float* dk;
  float* dv;
  int T, D, W, Bt;
  float scale;
};

// C (+)= A B over mt x nt output tiles of 16 x 16, kt tiles deep; warps take output tiles in turn.
// A tile (i, k) is read row-major at A + (i*16) lda + k*16 or, with ACol, column-major at
// A + (k*16) lda + i*16 (A is then the transpose of what is stored); likewise B tile (k, j).
template <class T, bool ACol, bool BCol, bool Accumulate>
__device__ void gemm(float* C, int ldc, const T* A, int lda, const T* B, int ldb, int mt, int nt, int kt) {
  using Ops = Tiles<T>;
  const int warp = int(threadIdx.x) / 32;
  for (int t = warp; t < mt * nt; t += kWarps) {
    const int i = t / nt, j = t - i * nt;
    typename Ops::Acc acc;
    if constexpr (Accumulate)
      Ops::load(acc, C + i * 16 * ldc + j * 16, ldc);
    else
      Ops::zero(acc);
    for (int k = 0; k < kt; ++k) {
      const T* a = ACol ? A + k * 16 * lda + i * 16 : A + i * 16 * lda + k * 16;
      const T* b = BCol ? B + j * 16 * ldb + k * 16 : B + k * 16 * ldb + j * 16;
      Ops::template mma<ACol, BCol>(acc, a, lda, b, ldb);
    }
    Ops::store(C + i * 16 * ldc + j * 16, acc, ldc);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Query t sees key tau.
__device__ __forceinline__ bool in_window(int t, int tau, int T, int W) { return t < T && tau <= t && tau > t - W; }

template <class T>
__global__ void __launch_bounds__(kThreads) swa_forward_kernel(SwaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(Kind::forward, p.Bt, p.D, int(sizeof(T)));
  T* Qs = reinterpret_cast<T*>(smem + L.a);
  T* Ks = reinterpret_cast<T*>(smem + L.b);
  T* Vs = reinterpret_cast<T*>(smem + L.c);
  float* Sf = reinterpret_cast<float*>(smem + L.s);
  T* Pop = reinterpret_cast<T*>(smem + L.p_op);
  float* Oacc = reinterpret_cast<float*>(smem + L.acc0);
  float* mrow = reinterpret_cast<float*>(smem + L.rows0);
  float* lrow = reinterpret_cast<float*>(smem + L.rows1);
  const int Bt = L.Bt, nb = Bt / 16, nd = L.Dp / 16, warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31;
  const std::size_t head = std::size_t(blockIdx.x) * p.T;
  const T* q = static_cast<const T*>(p.q) + head * p.D;
  const T* k = static_cast<const T*>(p.k) + head * p.D;
  const T* v = static_cast<const T*>(p.v) + head * p.D;
  const int q0 = int(blockIdx.y) * Bt, q_last = min(q0 + Bt, p.T) - 1;

  stage(Qs, L.ldD, q + std::size_t(q0) * p.D, p.D, 0, q_last - q0 + 1, Bt, L.Dp);
  for (int e = int(threadIdx.x); e < Bt * L.Dp; e += kThreads) Oacc[(e / L.Dp) * L.ldA + e % L.Dp] = 0.0f;
  for (int r = int(threadIdx.x); r < Bt; r += kThreads) mrow[r] = -INFINITY, lrow[r] = 0.0f;

  const int k_first = max(0, q0 - p.W + 1) / Bt * Bt;
  for (int k0 = k_first; k0 <= q_last; k0 += Bt) {
    __syncthreads();  // the last block's K, V, P are read; Q and the accumulators are set
    const int valid = min(Bt, p.T - k0);
    stage(Ks, L.ldD, k + std::size_t(k0) * p.D, p.D, 0, valid, Bt, L.Dp);
    stage(Vs, L.ldD, v + std::size_t(k0) * p.D, p.D, 0, valid, Bt, L.Dp);
    __syncthreads();
    gemm<T, false, true, false>(Sf, L.ldS, Qs, L.ldD, Ks, L.ldD, nb, nb, nd);  // S = Q K^T
    __syncthreads();
    for (int r = warp; r < Bt; r += kWarps) {  // online softmax, one warp per row
      const int t = q0 + r;
      float sv[2];
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        sv[u] = (c < Bt && in_window(t, k0 + c, p.T, p.W)) ? Sf[r * L.ldS + c] * p.scale : -INFINITY;
        mx = fmaxf(mx, sv[u]);
      }
      mx = warp_max(mx);
      const float m_old = mrow[r], m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing seen yet
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        if (c < Bt) {
          const float e = expf(sv[u] - m_use);  // exp(-inf) = 0 outside the window
          sum += e;
          Pop[r * L.ldP + c] = from_float<T>(e);
        }
      }
      sum = warp_sum(sum);
      const float alpha = expf(m_old - m_use);
      for (int d = lane; d < L.Dp; d += 32) Oacc[r * L.ldA + d] *= alpha;
      __syncwarp();
      if (lane == 0) mrow[r] = m_new, lrow[r] = lrow[r] * alpha + sum;
    }
    __syncthreads();
    gemm<T, false, false, true>(Oacc, L.ldA, Pop, L.ldP, Vs, L.ldD, nb, nd, nb);  // O += P V
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < Bt * p.D; e += kThreads) {
    const int r = e / p.D, d = e - r * p.D;
    if (q0 + r < p.T) p.out[(head + q0 + r) * p.D + d] = Oacc[r * L.ldA + d] / lrow[r];
  }
  if (p.lse_out)  // a forward-only call keeps no L
    for (int r = int(threadIdx.x); r < Bt; r += kThreads)
      if (q0 + r < p.T) p.lse_out[head + q0 + r] = mrow[r] + logf(lrow[r]);
}

// D_t = dO_t . o_t, one warp per row of all B*H*T rows.
template <class T>
__global__ void __launch_bounds__(kThreads) swa_delta_kernel(SwaParams p, std::size_t rows) {
  const std::size_t row = std::size_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const T* g = static_cast<const T*>(p.dO) + row * p.D;
  const float* o = p.o + row * p.D;
  float sum = 0.0f;
  for (int d = int(threadIdx.x) & 31; d < p.D; d += 32) sum += to_float(g[d]) * o[d];
  sum = warp_sum(sum);
  if ((threadIdx.x & 31) == 0) p.delta[row] = sum;
}

// Stages the query-side tiles (Q, dO) of rows [q0, q0+Bt) with their L and D.
template <class T>
__device__ void stage_queries(const SwaParams& p, const Layout& L, unsigned char* smem, std::size_t head, int q0) {
  const int valid = min(L.Bt, p.T - q0);
  stage(reinterpret_cast<T*>(smem + L.a), L.ldD, static_cast<const T*>(p.q) + (head + q0) * p.D, p.D, 0, valid, L.Bt, L.Dp);
  stage(reinterpret_cast<T*>(smem + L.b), L.ldD, static_cast<const T*>(p.dO) + (head + q0) * p.D, p.D, 0, valid, L.Bt, L.Dp);
  float* Lr = reinterpret_cast<float*>(smem + L.rows0);
  float* Dr = reinterpret_cast<float*>(smem + L.rows1);
  for (int r = int(threadIdx.x); r < L.Bt; r += kThreads) {
    Lr[r] = r < valid ? p.lse[head + q0 + r] : 0.0f;
    Dr[r] = r < valid ? p.delta[head + q0 + r] : 0.0f;
  }
}

template <class T>
__device__ void stage_keys(const SwaParams& p, const Layout& L, unsigned char* smem, std::size_t head, int k0) {
  const int valid = min(L.Bt, p.T - k0);
  stage(reinterpret_cast<T*>(smem + L.c), L.ldD, static_cast<const T*>(p.k) + (head + k0) * p.D, p.D, 0, valid, L.Bt, L.Dp);
  stage(reinterpret_cast<T*>(smem + L.d), L.ldD, static_cast<const T*>(p.v) + (head + k0) * p.D, p.D, 0, valid, L.Bt, L.Dp);
}

template <class T>
__device__ void zero_acc(float* acc, const Layout& L) {
  for (int e = int(threadIdx.x); e < L.Bt * L.Dp; e += kThreads) acc[(e / L.Dp) * L.ldA + e % L.Dp] = 0.0f;
}

// dS = P (dP - D) for query rows [q0, q0+Bt) and keys [k0, k0+Bt): into p_op (for float32 that is
// the score tile itself). With p_in_s, s already holds P (the dkv kernel); else it holds the raw
// scores and P = exp(s S - L) is formed here.
template <class T, bool p_in_s>
__device__ void form_ds(const SwaParams& p, const Layout& L, unsigned char* smem, int q0, int k0) {
  float* Sf = reinterpret_cast<float*>(smem + L.s);
  const float* dPf = reinterpret_cast<const float*>(smem + L.dp);
  T* Pop = reinterpret_cast<T*>(smem + L.p_op);
  const float* Lr = reinterpret_cast<const float*>(smem + L.rows0);
  const float* Dr = reinterpret_cast<const float*>(smem + L.rows1);
  for (int e = int(threadIdx.x); e < L.Bt * L.Bt; e += kThreads) {
    const int r = e / L.Bt, c = e - r * L.Bt;
    float P;
    if constexpr (p_in_s)
      P = Sf[r * L.ldS + c];
    else
      P = in_window(q0 + r, k0 + c, p.T, p.W) ? expf(Sf[r * L.ldS + c] * p.scale - Lr[r]) : 0.0f;
    Pop[r * L.ldP + c] = from_float<T>(P * (dPf[r * L.ldS + c] - Dr[r]));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) swa_dq_kernel(SwaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(Kind::dq, p.Bt, p.D, int(sizeof(T)));
  const T* Qs = reinterpret_cast<const T*>(smem + L.a);
  const T* dOs = reinterpret_cast<const T*>(smem + L.b);
  const T* Ks = reinterpret_cast<const T*>(smem + L.c);
  const T* Vs = reinterpret_cast<const T*>(smem + L.d);
  float* Sf = reinterpret_cast<float*>(smem + L.s);
  float* dPf = reinterpret_cast<float*>(smem + L.dp);
  const T* Pop = reinterpret_cast<const T*>(smem + L.p_op);
  float* dQacc = reinterpret_cast<float*>(smem + L.acc0);
  const int Bt = L.Bt, nb = Bt / 16, nd = L.Dp / 16;
  const std::size_t head = std::size_t(blockIdx.x) * p.T;
  const int q0 = int(blockIdx.y) * Bt, q_last = min(q0 + Bt, p.T) - 1;
  stage_queries<T>(p, L, smem, head, q0);
  zero_acc<T>(dQacc, L);
  for (int k0 = max(0, q0 - p.W + 1) / Bt * Bt; k0 <= q_last; k0 += Bt) {
    __syncthreads();
    stage_keys<T>(p, L, smem, head, k0);
    __syncthreads();
    gemm<T, false, true, false>(Sf, L.ldS, Qs, L.ldD, Ks, L.ldD, nb, nb, nd);    // S = Q K^T
    gemm<T, false, true, false>(dPf, L.ldS, dOs, L.ldD, Vs, L.ldD, nb, nb, nd);  // dP = dO V^T
    __syncthreads();
    form_ds<T, false>(p, L, smem, q0, k0);
    __syncthreads();
    gemm<T, false, false, true>(dQacc, L.ldA, Pop, L.ldP, Ks, L.ldD, nb, nd, nb);  // dQ += dS K
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < Bt * p.D; e += kThreads) {
    const int r = e / p.D, d = e - r * p.D;
    if (q0 + r < p.T) p.out[(head + q0 + r) * p.D + d] = p.scale * dQacc[r * L.ldA + d];
  }
}

// (kThreads, 1): from Dh 64 up its shared memory (~116 KiB at bf16 Bt 64) allows one block per
// multiprocessor anyway; without the 1, ptxas held the float32 instance to 64 registers and spilled.
template <class T>
__global__ void __launch_bounds__(kThreads, 1) swa_dkv_kernel(SwaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(Kind::dkv, p.Bt, p.D, int(sizeof(T)));
  const T* Qs = reinterpret_cast<const T*>(smem + L.a);
  const T* dOs = reinterpret_cast<const T*>(smem + L.b);
  const T* Ks = reinterpret_cast<const T*>(smem + L.c);
  const T* Vs = reinterpret_cast<const T*>(smem + L.d);
  float* Sf = reinterpret_cast<float*>(smem + L.s);
  float* dPf = reinterpret_cast<float*>(smem + L.dp);
  T* Pop = reinterpret_cast<T*>(smem + L.p_op);
  float* dKacc = reinterpret_cast<float*>(smem + L.acc0);
  float* dVacc = reinterpret_cast<float*>(smem + L.acc1);
  const float* Lr = reinterpret_cast<const float*>(smem + L.rows0);
  const int Bt = L.Bt, nb = Bt / 16, nd = L.Dp / 16;
  const std::size_t head = std::size_t(blockIdx.x) * p.T;
  const int k0 = int(blockIdx.y) * Bt, k_last = min(k0 + Bt, p.T) - 1;
  const int q_last = min(p.T - 1, k_last + p.W - 1);  // W <= T (the launcher clamps it): no overflow
  stage_keys<T>(p, L, smem, head, k0);
  zero_acc<T>(dKacc, L);
  zero_acc<T>(dVacc, L);
  for (int q0 = k0; q0 <= q_last; q0 += Bt) {  // k0 is a multiple of Bt: query blocks start there
    __syncthreads();
    stage_queries<T>(p, L, smem, head, q0);
    __syncthreads();
    gemm<T, false, true, false>(Sf, L.ldS, Qs, L.ldD, Ks, L.ldD, nb, nb, nd);  // S = Q K^T
    __syncthreads();
    for (int e = int(threadIdx.x); e < Bt * Bt; e += kThreads) {  // P = exp(S - L), float and operand
      const int r = e / Bt, c = e - r * Bt;
      const float P = in_window(q0 + r, k0 + c, p.T, p.W) ? expf(Sf[r * L.ldS + c] * p.scale - Lr[r]) : 0.0f;
      Sf[r * L.ldS + c] = P;
      if constexpr (!std::is_same_v<T, float>) Pop[r * L.ldP + c] = from_float<T>(P);
    }
    __syncthreads();
    gemm<T, true, false, true>(dVacc, L.ldA, Pop, L.ldP, dOs, L.ldD, nb, nd, nb);  // dV += P^T dO
    gemm<T, false, true, false>(dPf, L.ldS, dOs, L.ldD, Vs, L.ldD, nb, nb, nd);   // dP = dO V^T
    __syncthreads();
    form_ds<T, true>(p, L, smem, q0, k0);
    __syncthreads();
    gemm<T, true, false, true>(dKacc, L.ldA, Pop, L.ldP, Qs, L.ldD, nb, nd, nb);  // dK += dS^T Q
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < Bt * p.D; e += kThreads) {
    const int r = e / p.D, d = e - r * p.D;
    if (k0 + r < p.T) {
      p.dk[(head + k0 + r) * p.D + d] = p.scale * dKacc[r * L.ldA + d];
      p.dv[(head + k0 + r) * p.D + d] = dVacc[r * L.ldA + d];
    }
  }
}


std::size_t shared_bytes(Kind kind, const SwaProblem& p, Dtype dtype, int bt) {
  return make_layout(kind, bt, p.dim, element_size(dtype)).total;
}

// The block height: 64, 32 or 16 rows, the largest whose tiles fit (and not far beyond T); 0 if none.
int block_rows(Kind kind, const SwaProblem& p, Dtype dtype, std::size_t limit) {
  for (int bt : {64, 32, 16}) {
    if (bt > 16 && bt / 2 >= round16(p.seq)) continue;
    if (shared_bytes(kind, p, dtype, bt) <= limit) return bt;
  }
  return 0;
}

SwaParams base_params(const SwaProblem& pr) {
  SwaParams s{};
  s.T = pr.seq;
  s.D = pr.dim;
  s.W = std::min(pr.window, pr.seq);  // a window beyond T is the full causal one
  s.scale = float(attention_scale(pr.dim));
  return s;
}

template <class Kernel>
void launch_tiles(Kernel kernel, Kind kind, const SwaProblem& pr, Dtype dtype, SwaParams params, cudaStream_t stream) {
  const int device = current_device();
  params.Bt = block_rows(kind, pr, dtype, max_shared_bytes(device));
  if (params.Bt == 0) throw RuntimeFailure("sliding window: the tiles do not fit in shared memory");
  const std::size_t shared = shared_bytes(kind, pr, dtype, params.Bt);
  allow_shared(kernel, device, shared);
  const dim3 grid(unsigned(pr.heads_total()), unsigned((pr.seq + params.Bt - 1) / params.Bt));
  kernel<<<grid, kThreads, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

void check_problem(const SwaProblem& p) {
  if (p.batch < 0 || p.heads < 0 || p.seq < 0 || p.dim < 1 || p.dim > kSwaMaxDim || p.window < 1)
    throw RuntimeFailure("sliding window: unsupported shape (dim 1.." + std::to_string(kSwaMaxDim) + ", window >= 1)");
}

}  // namespace

std::size_t swa_shared_bytes(const SwaProblem& p, Dtype dtype, bool backward, int rows) {
  if (!backward) return shared_bytes(Kind::forward, p, dtype, rows);
  return std::max(shared_bytes(Kind::dq, p, dtype, rows), shared_bytes(Kind::dkv, p, dtype, rows));
}

std::optional<std::string> swa_unsupported(const SwaProblem& p, Dtype dtype, std::size_t limit) {
  if (p.dim < 1 || p.dim > kSwaMaxDim)
    return "the CUDA sliding-window kernels take dim 1.." + std::to_string(kSwaMaxDim) + ", not " + std::to_string(p.dim);
  if (p.window < 1) return "the sliding window must be at least 1, not " + std::to_string(p.window);
  if ((p.seq + 15) / 16 > 65535) return "the CUDA sliding-window grid takes seq up to 16 * 65535";
  for (Kind kind : {Kind::forward, Kind::dq, Kind::dkv})
    if (block_rows(kind, p, dtype, limit) == 0)
      return "the CUDA sliding-window tiles for dim " + std::to_string(p.dim) + " need " +
             std::to_string(shared_bytes(kind, p, dtype, 16)) + " bytes of shared memory per block; this device has " +
             std::to_string(limit);
  return std::nullopt;
}

void swa_forward(const SwaProblem& p, Dtype dtype, const DeviceSwaForward& a, Allocator&, cudaStream_t stream) {
  check_problem(p);
  if (p.seq == 0 || p.heads_total() == 0) return;
  SwaParams f = base_params(p);
  f.q = a.q, f.k = a.k, f.v = a.v, f.out = a.o, f.lse_out = a.lse;
  if (dtype == Dtype::f32)
    launch_tiles(swa_forward_kernel<float>, Kind::forward, p, dtype, f, stream);
  else
    launch_tiles(swa_forward_kernel<bf16>, Kind::forward, p, dtype, f, stream);
}

void swa_backward(const SwaProblem& p, Dtype dtype, const DeviceSwaBackward& a, Allocator& allocator,
                  cudaStream_t stream) {
  check_problem(p);
  if (p.seq == 0 || p.heads_total() == 0) return;
  // D lives only for this call's three launches, all on `stream`: the block goes back to the
  // allocator when this function returns (the device allocator's cache, or the layer's arena,
  // whose next slice is then taken by work later on the same stream), so nothing can overwrite it
  // while the launches still read it.
  Workspace<float> delta(allocator, swa_backward_workspace_bytes(p) / sizeof(float));
  SwaParams b = base_params(p);
  b.q = a.q, b.k = a.k, b.v = a.v, b.dO = a.dO, b.o = a.o, b.lse = a.lse, b.delta = delta.data();
  b.out = a.dq, b.dk = a.dk, b.dv = a.dv;
  const std::size_t rows = p.heads_total() * std::size_t(p.seq);
  const unsigned delta_blocks = unsigned((rows + kWarps - 1) / kWarps);
  if (dtype == Dtype::f32) {
    swa_delta_kernel<float><<<delta_blocks, kThreads, 0, stream>>>(b, rows);
    LATTN_CUDA_CHECK_LAUNCH();
    launch_tiles(swa_dkv_kernel<float>, Kind::dkv, p, dtype, b, stream);
    launch_tiles(swa_dq_kernel<float>, Kind::dq, p, dtype, b, stream);
  } else {
    swa_delta_kernel<bf16><<<delta_blocks, kThreads, 0, stream>>>(b, rows);
    LATTN_CUDA_CHECK_LAUNCH();
    launch_tiles(swa_dkv_kernel<bf16>, Kind::dkv, p, dtype, b, stream);
    launch_tiles(swa_dq_kernel<bf16>, Kind::dq, p, dtype, b, stream);
  }
}

}  // namespace lattn::cuda

// The decode step on the GPU (cuda.hpp). At decode sizes the step is a stream over the states:
// each Dk x Dv state is read once and written once per step whatever its tokens, and those bytes
// bound the time (docs/spec.md section 1d). The kernel is laid out for that stream:
//
// - A thread holds one vector of a state row, 4 columns (16 bytes of float32, 8 of bf16), in each
//   of its rows rg, rg + RG, ... (RG row groups, up to 16 rows: 64 floats of state in registers).
//   Consecutive threads take consecutive vectors of a row (CV vectors across the block's column
//   slice), then the next row, so a warp's load is up to 512 (bf16: 256) contiguous bytes, and
//   every thread issues all of its state loads before it uses any: 16 independent loads, 256
//   bytes (bf16: 128) in flight per thread.
//   A bf16 state takes 4 columns a thread in 8-byte vectors, not 8 in 16-byte ones: 8 columns
//   (8 rows, the same 64 floats and bytes in flight) double the per-column read-out sums each
//   thread carries through a token (y and u), and the delta rule's kernel then spilled at the 128
//   registers that two resident blocks of 256 threads allow; 4 columns keep the float32 layout,
//   registers and reductions, at twice the load instructions for the same bytes.
//   A Dv that is not a multiple of 4 (or a tensor not 16-byte aligned) takes the same layout
//   element by element (`vec` false), the columns past Dv zero.
// - A block is at most 256 threads: a head's column slice takes RG x CV of them (both powers of
//   two), and heads whose slice is smaller than a warp or a block share one (HB heads a block,
//   e.g. 4 at D 64, 16 at D 32), as long as the grid keeps a block per multiprocessor; so blocks
//   are never tiny and a multiprocessor holds two (launch bounds: 128 registers a thread), 64 KiB
//   of float32 state loads in flight each at D 128. With fewer heads than multiprocessors a head's
//   columns are split over more blocks instead (down to 8 vectors, 128 bytes of a float32 row).
// - One instance per q, k, v dtype, state dtype and rule: each holds only its rule's registers
//   (the additive rule keeps v's columns through the rows, the delta rule u and k . q).
// - The step's tokens are staged in shared memory once per block, up to 8 at a time: v's slice,
//   q and k of the value head's q/k head (grouped heads read the same rows in place; the group's
//   blocks share them in L2), exp(g) (per key channel for vector gates, else the token's decay)
//   and beta, widened to float32. The state stays in registers over all of them.
// - Per token, each thread decays its rows and sums its part of the read-outs over them; the
//   partial sums of the threads holding a column's rows meet by warp shuffles (xor over the row
//   groups within a warp), then, where a head's slice spans several warps, in shared memory
//   (double-buffered: one barrier per token, none when a head's slice fits in a warp); every
//   thread adds them up in the same order and finishes the token itself, row group 0 writing o:
//     additive: S = A S + k v^T, then o = s S^T q;
//     delta:    S' = A S, u = S'^T k, y = S'^T q, w = v - u, S = S' + beta k w^T,
//               o = s (y + beta (k . q) w)    (one pass over the rows: the update needs only w).
// The earlier snapshots are written from the registers after their token (float32). The state is
// found at its sequence's slot (a pooled step's state_index) and read and written in its dtype: a
// bf16 state is widened into the registers and rounded once, when the new state is written back.
// Over 500 lines: the kernel, its launch shape (decode_launch, which the tests check) and the seed
// and gather kernels of a pooled step share the layout above, and read best in one file.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/decode/cuda.hpp"

namespace lattn::cuda {
namespace {

constexpr int kThreads = 256;           // a block's most threads (two resident at 128 registers)
constexpr int kMaxStage = 8;            // tokens staged in shared memory at a time
constexpr std::size_t kSharedBudget = 48 * 1024;  // no opt-in shared memory

// Columns a thread holds in each of its rows (one vector: 16 bytes of float32, 8 of bf16), and
// its most rows: 64 floats of state in registers.
constexpr int kVector = 4, kRows = 16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float low_bf16(unsigned w) { return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float high_bf16(unsigned w) { return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w >> 16))); }
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// x, through an empty asm statement, so that the compiler cannot prove it equal to x: the
// addresses the final stores (and the snapshots) make from it are computed there, rather than
// kept in registers from the loads over the whole token loop (16 row addresses: the kernel
// spilled at 128 registers that way).
template <class T>
__device__ __forceinline__ T* opaque(T* x) {
#ifdef __CUDA_ARCH__
  asm volatile("" : "+l"(x));
#endif
  return x;
}
__device__ __forceinline__ int opaque(int x) {
#ifdef __CUDA_ARCH__
  asm volatile("" : "+r"(x));
#endif
  return x;
}

// One row's vector of the state: one load or store (16 bytes of float32, 8 of bf16), or element by
// element (n valid columns; the ragged path).
__device__ __forceinline__ void load_vector(const float* at, bool vec, int n, float (&x)[4]) {
  if (vec && n == 4) {
    const float4 f = *reinterpret_cast<const float4*>(at);
    x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) x[c] = c < n ? at[c] : 0.0f;
}
__device__ __forceinline__ void load_vector(const __nv_bfloat16* at, bool vec, int n, float (&x)[4]) {
  if (vec && n == 4) {
    const unsigned long long u = *reinterpret_cast<const unsigned long long*>(at);
    const unsigned lo = unsigned(u), hi = unsigned(u >> 32);
    x[0] = low_bf16(lo), x[1] = high_bf16(lo), x[2] = low_bf16(hi), x[3] = high_bf16(hi);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) x[c] = c < n ? __bfloat162float(at[c]) : 0.0f;
}
__device__ __forceinline__ void store_vector(float* at, bool vec, int n, const float (&x)[4]) {
  if (vec && n == 4) {
    *reinterpret_cast<float4*>(at) = make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (c < n) at[c] = x[c];
}
__device__ __forceinline__ void store_vector(__nv_bfloat16* at, bool vec, int n, const float (&x)[4]) {
  if (vec && n == 4) {
    *reinterpret_cast<unsigned long long*>(at) =
        (static_cast<unsigned long long>(pack_bf16(x[2], x[3])) << 32) | pack_bf16(x[0], x[1]);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (c < n) at[c] = __float2bfloat16_rn(x[c]);
}
// float32 outputs (o, the snapshots) of a thread's V columns: 16-byte stores when vectorised.
template <int V>
__device__ __forceinline__ void store_floats(float* at, bool vec, int n, const float (&x)[V]) {
  if (vec && n == V) {
#pragma unroll
    for (int c = 0; c < V; c += 4) *reinterpret_cast<float4*>(at + c) = make_float4(x[c], x[c + 1], x[c + 2], x[c + 3]);
    return;
  }
#pragma unroll
  for (int c = 0; c < V; ++c)
    if (c < n) at[c] = x[c];
}

struct StepParams {
  const void *q, *k, *v;
  const float *g, *beta;
  float *state, *o, *snapshots;
  __nv_bfloat16* state_bf16;  // instead of state, for a bf16 state
  const int* state_index;     // a pooled step's slots, one per sequence; null: sequence b in slot b
  int T, Dk, Dv, H, Hk, group, extra, heads_total;
  bool delta, retnet, scalar_gates, vector_gates;
  float s;
  // The launch (DecodeLaunch): row groups, column vectors, heads per block, tokens staged at a
  // time, floats of one staged token of one head, whole-vector accesses (else element by element).
  int RG, CV, HB, TS, token_floats;
  bool vec;
  // Derived from those (here rather than in each thread's registers): a head's threads (RG CV) and
  // warps, columns of a slice (CV V), staged floats of q (RG R), where a staged token's decay lies,
  // and the floats of one warp's partial sums.
  int HT, WH, slice_cols, KP, s_at, PW;
};

// Where a staged token's parts lie in its token_floats: v's slice first, then q, k and the vector
// gates' exp(g), KP = RG x R floats each, and the token's decay and beta. q, k and exp(g) are
// stored by row group, key channel i at (i % RG) R + i / RG, zeros past Dk: a thread's rows are
// R consecutive floats, read 16 bytes at a time at offsets the compiler knows, and the rows past
// Dk (zero state, zero q and k) need no test.
__host__ __device__ inline int staged_scalars(int slice_cols, int KP, bool vector_gates) {
  return slice_cols + (vector_gates ? 3 : 2) * KP;
}
__host__ __device__ inline int staged_token_floats(int slice_cols, int KP, bool vector_gates) {
  return (staged_scalars(slice_cols, KP, vector_gates) + 2 + 3) / 4 * 4;
}

// Floats of one column vector's partial sums in shared memory: y (V), and u (V) for the delta
// rule, padded from 8 floats up so that the 16-byte accesses of 8 consecutive lanes (one shared
// memory wavefront) fall on distinct banks.
__host__ __device__ inline int partial_stride(int V, bool delta) {
  const int floats = delta ? 2 * V : V;
  return floats >= 8 ? floats + 4 : floats;
}

template <class In, class St, bool kDelta>
__global__ void __launch_bounds__(kThreads, 2) decode_step_kernel(StepParams p) {
  constexpr int V = kVector, R = kRows;
  extern __shared__ __align__(16) float smem[];  // staged tokens, then the partial sums
  const int Dk = p.Dk, Dv = p.Dv, T = p.T, RG = p.RG, CV = p.CV, HB = p.HB, TS = p.TS, TF = p.token_floats;
  const int HT = p.HT;  // threads of one head's slice
  const int tid = int(threadIdx.x), lane = tid & 31;
  const int hb = tid / HT, within = tid % HT, rg = within / CV, cv = within % CV;
  const int slice_cols = p.slice_cols, first_col = int(blockIdx.y) * slice_cols, j0 = first_col + cv * V;
  const int first_head = int(blockIdx.x) * HB;
  const bool head_ok = first_head + hb < p.heads_total;
  const int bh = head_ok ? first_head + hb : 0;
  const int ncols = head_ok ? max(0, min(V, Dv - j0)) : 0;  // the thread's columns inside Dv
  const std::size_t DD = std::size_t(Dk) * Dv;
  const int slot = p.state_index ? p.state_index[bh / p.H] : bh / p.H;
  const std::size_t state_at = (std::size_t(slot) * p.H + std::size_t(bh % p.H)) * DD;
  St* const state = reinterpret_cast<St*>(p.state_bf16 ? static_cast<void*>(p.state_bf16) : static_cast<void*>(p.state));

  // The thread's rows rg + m RG for m < rows, the first at `row0`, each RG rows below the last.
  const int rows = ncols > 0 && rg < Dk ? (Dk - rg + RG - 1) / RG : 0;
  St* const row0 = state + state_at + std::size_t(rg) * Dv + j0;
  const int row_step = RG * Dv;
  // Every state load is issued before anything uses one (the staging below overlaps them).
  float S[R][V];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (m < rows)
      load_vector(row0 + m * row_step, p.vec, ncols, S[m]);
    else
#pragma unroll
      for (int c = 0; c < V; ++c) S[m][c] = 0.0f;
  }

  float* const staged = smem;
  // The partial sums of a head's warps (partial_floats): y and u (delta) of each column vector, then
  // k . q once a warp.
  const int WH = p.WH, PS = partial_stride(V, kDelta), PW = p.PW;
  float* const partials = smem + std::size_t(HB) * TS * TF;
  const int KP = p.KP, s_at = p.s_at;

  for (int t0 = 0; t0 < T; t0 += TS) {
    const int n = min(TS, T - t0);
    if (t0 > 0) __syncthreads();  // the previous stage's tokens are read until the last one's end
    // Stage tokens t0 .. t0 + n - 1 of the block's heads (zeros past Dv and past the last head).
    for (int e = tid; e < HB * n * TF; e += int(blockDim.x)) {
      const int h = e / (n * TF), rest = e % (n * TF), tt = rest / TF, f = rest % TF;
      const int b2 = first_head + h, t = t0 + tt;
      float x = 0.0f;
      if (b2 < p.heads_total) {
        if (f < slice_cols) {
          const int j = first_col + f;
          if (j < Dv) x = to_float(static_cast<const In*>(p.v)[(std::size_t(b2) * T + t) * Dv + j]);
        } else if (f < s_at) {
          const int part = (f - slice_cols) / KP, at = (f - slice_cols) % KP;  // 0: q, 1: k, 2: the vector gates
          const int i = at % R * RG + at / R;
          const int key_head = b2 / p.H * p.Hk + b2 % p.H / p.group;
          if (i >= Dk) x = 0.0f;
          else if (part == 0) x = to_float(static_cast<const In*>(p.q)[(std::size_t(key_head) * T + t) * Dk + i]);
          else if (part == 1) x = to_float(static_cast<const In*>(p.k)[(std::size_t(key_head) * T + t) * Dk + i]);
          else x = expf(p.g[(std::size_t(b2) * T + t) * Dk + i]);
        } else if (f == s_at) {
          x = p.scalar_gates ? expf(p.g[std::size_t(b2) * T + t])
              : p.retnet     ? float(1.0 - ldexp(1.0, -5 - b2 % p.H))
                             : 1.0f;
        } else if (f == s_at + 1 && kDelta) {
          x = p.beta[std::size_t(b2) * T + t];
        }
      }
      staged[(h * TS + tt) * TF + f] = x;
    }
    __syncthreads();

    for (int tt = 0; tt < n; ++tt) {
      const int t = t0 + tt;
      const float* const tok = staged + (hb * TS + tt) * TF;
      // This thread's rows of q, k and exp(g).
      const float *const qs = tok + slice_cols + rg * R, *const ks = qs + KP, *const as = ks + KP;
      const float decay = tok[s_at], beta = tok[s_at + 1];
      // v's columns: the additive rule's update takes them row by row, the delta rule's only after
      // the sums (w = v - u, 16 bytes at a time).
      const float* const vs = tok + cv * V;
      float vv[V], y[V], u[V];
      if (!kDelta)
#pragma unroll
        for (int c = 0; c < V; c += 4) {
          const float4 f = *reinterpret_cast<const float4*>(vs + c);
          vv[c] = f.x, vv[c + 1] = f.y, vv[c + 2] = f.z, vv[c + 3] = f.w;
        }
#pragma unroll
      for (int c = 0; c < V; ++c) y[c] = u[c] = 0.0f;
      float kq = 0.0f;
#pragma unroll
      for (int m4 = 0; m4 < R; m4 += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(ks + m4), q4 = *reinterpret_cast<const float4*>(qs + m4);
        const float4 a4 = p.vector_gates ? *reinterpret_cast<const float4*>(as + m4) : make_float4(decay, decay, decay, decay);
        const float kk[4] = {k4.x, k4.y, k4.z, k4.w}, qq[4] = {q4.x, q4.y, q4.z, q4.w}, aa[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int mm = 0; mm < 4; ++mm) {
          const int m = m4 + mm;
#pragma unroll
          for (int c = 0; c < V; ++c) {
            float r = S[m][c] * aa[mm];
            if (kDelta) {
              u[c] = fmaf(kk[mm], r, u[c]);
              y[c] = fmaf(qq[mm], r, y[c]);
            } else {
              r = fmaf(kk[mm], vv[c], r);
              y[c] = fmaf(qq[mm], r, y[c]);
            }
            S[m][c] = r;
          }
          if (kDelta) kq = fmaf(kk[mm], qq[mm], kq);
        }
      }
      // The row groups within a warp (lanes CV apart), then the head's warps through shared memory.
      for (int off = CV; off < min(HT, 32); off <<= 1) {
#pragma unroll
        for (int c = 0; c < V; ++c) {
          y[c] += __shfl_xor_sync(0xffffffffu, y[c], off);
          if (kDelta) u[c] += __shfl_xor_sync(0xffffffffu, u[c], off);
        }
        if (kDelta) kq += __shfl_xor_sync(0xffffffffu, kq, off);
      }
      if (WH > 1) {
        // Double-buffered: the other buffer is written next token, this one only after the next barrier.
        float* const buf = partials + std::size_t((t & 1) * HB + hb) * WH * PW;
        const int wh = within / 32;
        if (lane < CV) {
          float* const at = buf + wh * PW + cv * PS;
#pragma unroll
          for (int c = 0; c < V; c += 4) {
            *reinterpret_cast<float4*>(at + c) = make_float4(y[c], y[c + 1], y[c + 2], y[c + 3]);
            if (kDelta) *reinterpret_cast<float4*>(at + V + c) = make_float4(u[c], u[c + 1], u[c + 2], u[c + 3]);
          }
        }
        if (kDelta && lane == 0) buf[wh * PW + CV * PS] = kq;
        __syncthreads();
#pragma unroll
        for (int c = 0; c < V; ++c) y[c] = u[c] = 0.0f;
        kq = 0.0f;
#pragma unroll 1
        for (int w = 0; w < WH; ++w) {
          const float* const at = buf + w * PW + cv * PS;
#pragma unroll
          for (int c = 0; c < V; c += 4) {
            const float4 y4 = *reinterpret_cast<const float4*>(at + c);
            y[c] += y4.x, y[c + 1] += y4.y, y[c + 2] += y4.z, y[c + 3] += y4.w;
            if (kDelta) {
              const float4 u4 = *reinterpret_cast<const float4*>(at + V + c);
              u[c] += u4.x, u[c + 1] += u4.y, u[c + 2] += u4.z, u[c + 3] += u4.w;
            }
          }
          if (kDelta) kq += buf[w * PW + CV * PS];
        }
      }
      if (kDelta) {
        const float bkq = beta * kq;
#pragma unroll
        for (int c = 0; c < V; c += 4) {
          const float4 f = *reinterpret_cast<const float4*>(vs + c);
          u[c] = f.x - u[c], u[c + 1] = f.y - u[c + 1], u[c + 2] = f.z - u[c + 2], u[c + 3] = f.w - u[c + 3];
#pragma unroll
          for (int x = c; x < c + 4; ++x) y[x] = fmaf(bkq, u[x], y[x]);
        }
      }
      // o first (y is then free for the delta rule's update). The addresses are made here from an
      // opaque copy of the head, rather than kept in registers over the token loop.
      const int head = opaque(bh);
      if (rg == 0 && ncols > 0) {
#pragma unroll
        for (int c = 0; c < V; ++c) y[c] *= p.s;
        store_floats<V>(p.o + (std::size_t(head) * T + t) * Dv + j0, p.vec, ncols, y);
      }
      if (kDelta) {
#pragma unroll
        for (int m4 = 0; m4 < R; m4 += 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(ks + m4);
          const float kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
          for (int mm = 0; mm < 4; ++mm) {
            const float bk = beta * kk[mm];
#pragma unroll
            for (int c = 0; c < V; ++c) S[m4 + mm][c] = fmaf(bk, u[c], S[m4 + mm][c]);
          }
        }
      }
      if (ncols == 0) continue;
      // Slot i (1..extra) is the state i tokens before the step's end.
      const int snap = T - 1 - t;
      if (snap >= 1 && snap <= p.extra) {
        float* const at = p.snapshots + (std::size_t(head) * p.extra + std::size_t(snap - 1)) * DD + std::size_t(rg) * Dv + j0;
        const int step = opaque(row_step);
#pragma unroll
        for (int m = 0; m < R; ++m)
          if (m < rows) store_floats<V>(at + m * step, p.vec, ncols, S[m]);
      }
    }
  }
  St* const out = opaque(row0);
  const int step = opaque(row_step);
#pragma unroll
  for (int m = 0; m < R; ++m)
    if (m < rows) store_vector(out + m * step, p.vec, ncols, S[m]);
}

// Sequence b's states from h0 ([batch][H][Dk][Dv], float32) into its slot, in the state's dtype.
__global__ void seed_states_kernel(StepParams p, const float* h0, std::size_t head_elems, std::size_t total) {
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < total; e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t bh = e / head_elems, b = bh / std::size_t(p.H);
    const std::size_t slot = p.state_index ? std::size_t(p.state_index[b]) : b;
    const std::size_t at = (slot * p.H + bh % std::size_t(p.H)) * head_elems + e % head_elems;
    if (p.state_bf16) p.state_bf16[at] = __float2bfloat16_rn(h0[e]);
    else p.state[at] = h0[e];
  }
}

// The reverse: each sequence's states from its slot into hT ([batch][H][Dk][Dv], float32).
__global__ void gather_states_kernel(StepParams p, float* hT, std::size_t head_elems, std::size_t total) {
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < total; e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t bh = e / head_elems, b = bh / std::size_t(p.H);
    const std::size_t slot = p.state_index ? std::size_t(p.state_index[b]) : b;
    const std::size_t at = (slot * p.H + bh % std::size_t(p.H)) * head_elems + e % head_elems;
    hT[e] = p.state_bf16 ? __bfloat162float(p.state_bf16[at]) : p.state[at];
  }
}

StepParams step_params(const DecodeProblem& pr, const DecodeArgs<void>& a) {
  StepParams p{};
  p.q = a.q, p.k = a.k, p.v = a.v, p.g = a.g, p.beta = a.beta;
  p.state = a.state, p.o = a.o, p.snapshots = a.snapshots;
  p.state_bf16 = pr.state_bf16 ? reinterpret_cast<__nv_bfloat16*>(a.state_bf16) : nullptr;
  p.state_index = pr.pooled() ? a.state_index : nullptr;
  p.T = pr.tokens, p.Dk = pr.dim, p.Dv = pr.value_dim(), p.H = pr.heads, p.Hk = pr.qk_heads(), p.group = pr.group();
  p.extra = pr.extra_slots();
  p.heads_total = int(pr.heads_total());
  p.delta = pr.delta();
  p.retnet = pr.decay == Decay::retnet;
  p.scalar_gates = pr.decay == Decay::scalar;
  p.vector_gates = pr.decay == Decay::vector;
  p.s = float(attention_scale(pr.dim));
  return p;
}

unsigned copy_blocks(std::size_t total) { return unsigned(std::min<std::size_t>((total + 255) / 256, 4096)); }

template <class In, class St>
void launch_rule(bool delta, dim3 grid, unsigned threads, std::size_t shared, cudaStream_t stream, const StepParams& p) {
  if (delta)
    decode_step_kernel<In, St, true><<<grid, threads, shared, stream>>>(p);
  else
    decode_step_kernel<In, St, false><<<grid, threads, shared, stream>>>(p);
  LATTN_CUDA_CHECK_LAUNCH();
}
void launch_step(Dtype dtype, bool state_bf16, bool delta, dim3 grid, unsigned threads, std::size_t shared,
                 cudaStream_t stream, const StepParams& p) {
  if (dtype == Dtype::f32) {
    if (state_bf16) launch_rule<float, __nv_bfloat16>(delta, grid, threads, shared, stream, p);
    else launch_rule<float, float>(delta, grid, threads, shared, stream, p);
  } else {
    if (state_bf16) launch_rule<__nv_bfloat16, __nv_bfloat16>(delta, grid, threads, shared, stream, p);
    else launch_rule<__nv_bfloat16, float>(delta, grid, threads, shared, stream, p);
  }
}

int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

bool aligned16(const void* ptr) { return ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

DecodeLaunch decode_launch(const DecodeProblem& pr, int multiprocessors) {
  DecodeLaunch l{};
  const int V = kVector, R = kRows;
  const int Dk = pr.dim, Dv = pr.value_dim();
  const std::size_t heads = pr.heads_total();
  l.vector = V;
  l.vectorised = Dv % V == 0;
  const int vectors = (Dv + V - 1) / V;  // per state row
  // The fewest row groups that keep a thread's rows in its R registers' worth, then as many
  // column vectors as the row takes, up to a block of kThreads.
  l.row_groups = pow2_at_least((Dk + R - 1) / R);
  l.column_vectors = std::min(pow2_at_least(vectors), kThreads / l.row_groups);
  auto blocks_across = [&] { return (vectors + l.column_vectors - 1) / l.column_vectors; };
  // Few heads (small batches): narrower column slices, down to 8 vectors (128 contiguous bytes of
  // a float32 row), so that the grid has a block per multiprocessor.
  while (heads * std::size_t(blocks_across()) < std::size_t(multiprocessors) && l.column_vectors > 8 &&
         l.row_groups * l.column_vectors >= 64)
    l.column_vectors /= 2;
  l.column_slices = blocks_across();
  const int head_threads = l.row_groups * l.column_vectors;
  // Small heads share a block: at least a warp's worth, then more while the grid keeps a block
  // per multiprocessor.
  l.heads_per_block = head_threads < 32 ? 32 / head_threads : 1;
  auto grid_with = [&](int hb) { return (heads + std::size_t(hb) - 1) / std::size_t(hb) * std::size_t(l.column_slices); };
  while (head_threads * l.heads_per_block * 2 <= kThreads && grid_with(l.heads_per_block * 2) >= std::size_t(multiprocessors))
    l.heads_per_block *= 2;
  l.rows_per_thread = (Dk + l.row_groups - 1) / l.row_groups;
  l.threads = head_threads * l.heads_per_block;
  l.blocks = unsigned((heads + std::size_t(l.heads_per_block) - 1) / std::size_t(l.heads_per_block));
  // Shared memory: the staged tokens, and the warps' partial sums (two buffers) where a head spans warps.
  const int warps_per_head = head_threads / 32;
  const std::size_t per_token = std::size_t(l.heads_per_block) *
                                staged_token_floats(l.column_vectors * V, l.row_groups * R, pr.decay == Decay::vector) * sizeof(float);
  const std::size_t sums = warps_per_head > 1 ? 2 * std::size_t(l.heads_per_block) * warps_per_head *
                                                    (partial_stride(V, pr.delta()) * l.column_vectors + 4) * sizeof(float)
                                              : 0;
  l.stage_tokens = std::min(pr.tokens, kMaxStage);
  while (l.stage_tokens > 1 && sums + per_token * std::size_t(l.stage_tokens) > kSharedBudget) --l.stage_tokens;
  l.shared_bytes = sums + per_token * std::size_t(l.stage_tokens);
  return l;
}

std::optional<std::string> decode_unsupported(const DecodeProblem& p) {
  if (p.dplr()) return std::string("the CUDA decode step has no kernel for rule dplr");
  if (p.trapezoidal()) return std::string("the CUDA decode step has no trapezoidal rule (Mamba-3): the CPU's steps it");
  if (p.bonus) return std::string("the CUDA decode step has no bonus (RWKV-6) form");
  if (p.householder > 1) return std::string("the CUDA decode step takes one Householder write per token only");
  if (p.dim > kDecodeMaxDim)
    return "the CUDA decode step holds a head's state rows in one block's registers: dim (the key dim) over " +
           std::to_string(kDecodeMaxDim);
  return std::nullopt;
}

void decode_step(const DecodeProblem& pr, Dtype dtype, const DecodeArgs<void>& a, cudaStream_t stream) {
  if (auto why = decode_unsupported(pr)) throw RuntimeFailure(*why);
  int device = 0, multiprocessors = 0;
  LATTN_CUDA_CHECK(cudaGetDevice(&device));
  LATTN_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  const DecodeLaunch l = decode_launch(pr, multiprocessors);
  if (l.shared_bytes > kSharedBudget) throw RuntimeFailure("the CUDA decode step's staged tokens do not fit in 48 KiB");
  StepParams p = step_params(pr, a);
  p.RG = l.row_groups, p.CV = l.column_vectors, p.HB = l.heads_per_block, p.TS = l.stage_tokens;
  p.HT = l.row_groups * l.column_vectors, p.WH = p.HT / 32;
  p.slice_cols = l.column_vectors * l.vector;
  p.KP = l.row_groups * kRows;
  p.s_at = staged_scalars(p.slice_cols, p.KP, p.vector_gates);
  p.token_floats = staged_token_floats(p.slice_cols, p.KP, p.vector_gates);
  p.PW = partial_stride(l.vector, p.delta) * l.column_vectors + 4;
  // 16-byte accesses where every row starts on a vector and the tensors are 16-byte aligned.
  p.vec = l.vectorised && aligned16(a.state) && aligned16(a.state_bf16) && aligned16(a.o) && aligned16(a.snapshots);
  const dim3 grid(l.blocks, unsigned(l.column_slices));
  const unsigned threads = unsigned(l.threads);
  launch_step(dtype, pr.state_bf16, p.delta, grid, threads, l.shared_bytes, stream, p);
}

void decode_seed_states(const DecodeProblem& pr, const DecodeArgs<void>& a, const float* h0, cudaStream_t stream) {
  const std::size_t total = pr.state_elems();
  if (total == 0) return;
  seed_states_kernel<<<copy_blocks(total), 256, 0, stream>>>(step_params(pr, a), h0, pr.head_state_elems(), total);
  LATTN_CUDA_CHECK_LAUNCH();
}

void decode_gather_states(const DecodeProblem& pr, const DecodeArgs<void>& a, float* hT, cudaStream_t stream) {
  const std::size_t total = pr.state_elems();
  if (total == 0) return;
  gather_states_kernel<<<copy_blocks(total), 256, 0, stream>>>(step_params(pr, a), hT, pr.head_state_elems(), total);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace lattn::cuda

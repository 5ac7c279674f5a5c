// The decode step on the GPU (cuda.hpp). One block per (sequence x value head, slice of 32 value
// columns): lane x owns column x of the slice, warp y the state's key rows y, y + R, ... (16 per
// thread, in registers), so the Dk x Dv state is read from memory once and written once per step,
// whatever the step's tokens. A value head reads q and k of its q/k head in place (grouped heads:
// the group's blocks share those rows in L2). Per token, each thread decays its rows and sums its
// part of the read-outs over them; the warps' partial sums meet in shared memory (double-buffered:
// one barrier per token), every warp adds them up and finishes the token itself, warp 0 writing o:
//   additive: S = A S + k v^T, then o = s S^T q;
//   delta:    S' = A S, u = S'^T k, y = S'^T q, w = v - u, S = S' + beta k w^T,
//             o = s (y + beta (k . q) w)    (one pass over the rows: the update needs only w).
// The earlier snapshots are written from the registers after their token. The state is found at its
// sequence's slot (a pooled step's state_index) and read and written in its dtype: a bf16 state is
// widened into the registers and rounded once, when the new state is written back.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/decode/cuda.hpp"

namespace lattn::cuda {
namespace {

constexpr int kCols = 32;
constexpr int kRows = 16;  // state rows per thread
constexpr int kSums = 3;   // per token: u (delta), y, k . q (delta)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

struct StepParams {
  const void *q, *k, *v;
  const float *g, *beta;
  float *state, *o, *snapshots;
  __nv_bfloat16* state_bf16;  // instead of state, for a bf16 state
  const int* state_index;     // a pooled step's slots, one per sequence; null: sequence b in slot b
  int T, Dk, Dv, H, Hk, group, extra;
  bool delta, retnet, scalar_gates, vector_gates;
  float s;
};

template <class In>
__global__ void decode_step_kernel(StepParams p) {
  extern __shared__ float sums[];  // 2 x R x kSums x kCols
  const int Dk = p.Dk, Dv = p.Dv, T = p.T, R = int(blockDim.y);
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int bh = int(blockIdx.x), j = int(blockIdx.y) * kCols + lane;
  const bool j_ok = j < Dv;
  // Rows of this value head's tokens (v, o; the vector gates, Dk wide) and of its q/k head's (q, k).
  const int key_head = bh / p.H * p.Hk + bh % p.H / p.group;
  const std::size_t value_tok = std::size_t(bh) * T * Dv, gate_tok = std::size_t(bh) * T * Dk;
  const std::size_t key_tok = std::size_t(key_head) * T * Dk, DD = std::size_t(Dk) * Dv;
  const int slot = p.state_index ? p.state_index[bh / p.H] : bh / p.H;
  const std::size_t state_at = (std::size_t(slot) * p.H + std::size_t(bh % p.H)) * DD;
  auto load_state = [&](std::size_t e) {
    return p.state_bf16 ? __bfloat162float(p.state_bf16[state_at + e]) : p.state[state_at + e];
  };
  auto store_state = [&](std::size_t e, float x) {
    if (p.state_bf16) p.state_bf16[state_at + e] = __float2bfloat16_rn(x);
    else p.state[state_at + e] = x;
  };
  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - bh % p.H)) : 1.0f;
  auto key = [&](const void* x, int t, int i) {
    return to_float(static_cast<const In*>(x)[key_tok + std::size_t(t) * Dk + i]);
  };

  float S[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    S[m] = (j_ok && i < Dk) ? load_state(std::size_t(i) * Dv + j) : 0.0f;
  }
  for (int t = 0; t < T; ++t) {
    const float scalar_decay = p.scalar_gates ? expf(p.g[std::size_t(bh) * T + t]) : gamma;
    float y[kSums] = {0.0f, 0.0f, 0.0f};
    const float vj = j_ok ? to_float(static_cast<const In*>(p.v)[value_tok + std::size_t(t) * Dv + j]) : 0.0f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = wy + m * R;
      if (i >= Dk) continue;
      const float a = p.vector_gates ? expf(p.g[gate_tok + std::size_t(t) * Dk + i]) : scalar_decay;
      const float ki = key(p.k, t, i), qi = key(p.q, t, i);
      float r = S[m] * a;
      if (p.delta) {
        y[0] = fmaf(ki, r, y[0]);
        y[1] = fmaf(qi, r, y[1]);
        y[2] = fmaf(ki, qi, y[2]);
      } else {
        r = fmaf(ki, vj, r);
        y[1] = fmaf(qi, r, y[1]);
      }
      S[m] = r;
    }
    float* buf = sums + (t & 1) * R * kSums * kCols;
#pragma unroll
    for (int x = 0; x < kSums; ++x) buf[(wy * kSums + x) * kCols + lane] = y[x];
    __syncthreads();
    float total[kSums] = {0.0f, 0.0f, 0.0f};
    for (int w = 0; w < R; ++w)
#pragma unroll
      for (int x = 0; x < kSums; ++x) total[x] += buf[(w * kSums + x) * kCols + lane];
    // The other buffer is written next token; this one only after the next barrier.
    float out = total[1];
    if (p.delta) {
      const float beta = p.beta[std::size_t(bh) * T + t], w = vj - total[0];
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        const int i = wy + m * R;
        if (i < Dk) S[m] = fmaf(beta * key(p.k, t, i), w, S[m]);
      }
      out = fmaf(beta * total[2], w, total[1]);
    }
    if (!j_ok) continue;
    if (wy == 0) p.o[value_tok + std::size_t(t) * Dv + j] = p.s * out;
    // Slot i (1..extra) is the state i tokens before the step's end.
    const int slot = T - 1 - t;
    if (slot >= 1 && slot <= p.extra) {
      float* snap = p.snapshots + (std::size_t(bh) * p.extra + std::size_t(slot - 1)) * DD;
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        const int i = wy + m * R;
        if (i < Dk) snap[std::size_t(i) * Dv + j] = S[m];
      }
    }
  }
  if (!j_ok) return;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    if (i < Dk) store_state(std::size_t(i) * Dv + j, S[m]);
  }
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
  p.delta = pr.delta();
  p.retnet = pr.decay == Decay::retnet;
  p.scalar_gates = pr.decay == Decay::scalar;
  p.vector_gates = pr.decay == Decay::vector;
  p.s = float(attention_scale(pr.dim));
  return p;
}

unsigned copy_blocks(std::size_t total) { return unsigned(std::min<std::size_t>((total + 255) / 256, 4096)); }

}  // namespace

std::optional<std::string> decode_unsupported(const DecodeProblem& p) {
  if (p.dim > kDecodeMaxDim)
    return "the CUDA decode step holds a head's state rows in one block's registers: dim (the key dim) over " +
           std::to_string(kDecodeMaxDim);
  return std::nullopt;
}

void decode_step(const DecodeProblem& pr, Dtype dtype, const DecodeArgs<void>& a, cudaStream_t stream) {
  if (auto why = decode_unsupported(pr)) throw RuntimeFailure(*why);
  const StepParams p = step_params(pr, a);
  const int R = std::max(1, (pr.dim + kRows - 1) / kRows);
  const dim3 block(kCols, unsigned(R));
  const dim3 grid(unsigned(pr.heads_total()), unsigned((p.Dv + kCols - 1) / kCols));
  const std::size_t shared = sizeof(float) * 2 * std::size_t(R) * kSums * kCols;
  if (dtype == Dtype::f32)
    decode_step_kernel<float><<<grid, block, shared, stream>>>(p);
  else
    decode_step_kernel<__nv_bfloat16><<<grid, block, shared, stream>>>(p);
  LATTN_CUDA_CHECK_LAUNCH();
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

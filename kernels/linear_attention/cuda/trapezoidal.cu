// The trapezoidal rule on the GPU (cuda/trapezoidal.hpp; docs/kernels.md, "The trapezoidal rule";
// the algebra is kernels/linear_attention/trapezoidal.hpp's, shared with the CPU's adapter
// cpu/trapezoidal.cpp). The inner row (the scan or the gated chunked form, float32) computes the
// decayed causal sum over R rows per token; the kernels here do the per-token rest:
//   prepare:    v' = (c_t / s) v and, for R > 1, the inner log-gates (g_t on a token's first row, 0
//               on the others); h0' = h0 / s (s = Dk^-1/2, the inner readout's scale, which the
//               rule does not have, undone through v and h0);
//   correction: o_r += sum_r' w_rr' (q_r . k_r') v_r', w_rr' = c_t [r' > r] - mu_{t+1}; hT = s hT';
//   backward:   dc_t = <v, dv'> / s, dv = (c_t / s) dv' plus the correction's dv, and its dq, dk;
//               dmu_{t+1} = dc_t - sum_rr' A B; then ddt, dtrap from dc_t and dmu_t, dg from the
//               inner dg of the token's first row; dh0 = dh0' / s.
// One warp per token of a q/k head: it computes A = Q_t K_t^T once and walks the head's value heads
// one after another, so dq and dk rows, which they share, are added to by one warp only (summed as
// the R x R matrix M = sum over value heads of w . B before one pass over the rows), with no
// atomics: deterministic. Lanes stride the rows' channels; dot products are butterfly sums over
// the warp. A token ends its sequence where t is the batch row's last or the next document starts
// (the document boundaries in device memory, cuda/scan_shapes.cuh), and mu past it is 0.
// bf16 tokens: the inner row runs float32 on q, k (and dO) widened; these kernels read the tokens
// as they are. Tests: tests/cuda_emulation/test_trapezoidal.cpp.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/scan_shapes.cuh"
#include "kernels/linear_attention/cuda/trapezoidal.hpp"
#include "kernels/linear_attention/trapezoidal.hpp"

namespace lattn::cuda {
namespace {

constexpr int kWarps = 4;  // tokens per block: one warp each
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFull, x, offset);
  return x;
}

// Where the per-token kernels find a token: batch row b, value head h (or q/k head), token t of
// the row's T; R rows per token.
struct TokenShape {
  int B, T, H, Hk, group, R, Dk, Dv;
  const int* cu;  // packed: the documents' boundaries (docs + 1); null: dense
  int docs;
  float s;  // the inner readout's scale Dk^-1/2
};

// Whether a document starts at token x (0 < x < T) of a packed row.
__device__ bool starts_document(const TokenShape& z, int x) {
  if (!z.cu) return false;
  int lo = 1, hi = z.docs - 1;  // the inner boundaries cu[1..docs-1]
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (z.cu[mid] == x) return true;
    if (z.cu[mid] < x) lo = mid + 1;
    else hi = mid - 1;
  }
  return false;
}

__device__ __forceinline__ bool first_token(const TokenShape& z, int t) { return t == 0 || starts_document(z, t); }
__device__ __forceinline__ bool last_token(const TokenShape& z, int t) {
  return t + 1 == z.T || starts_document(z, t + 1);
}

// Token t's weights in value head row `bh` (b H + h): dt and trap are [B][H][T].
__device__ TrapezoidalWeights<float> weights_at(const TokenShape& z, const float* dt, const float* trap,
                                                std::size_t bh, int t) {
  const std::size_t i = bh * z.T + t;
  const bool last = last_token(z, t);
  return trapezoidal_weights<float>(dt[i], trap[i], last ? 0.0f : dt[i + 1], last ? 0.0f : trap[i + 1], last);
}

struct PrepareParams {
  const void* v;
  const float* g;
  const float* dt;
  const float* trap;
  float* v_inner;
  float* g_inner;  // R > 1 only
  TokenShape z;
};

// One warp per token of a value head.
template <class T>
__global__ void __launch_bounds__(32 * kWarps) trapezoidal_prepare_kernel(PrepareParams p) {
  const TokenShape& z = p.z;
  const long token = long(blockIdx.x) * kWarps + threadIdx.y;
  if (token >= long(z.B) * z.H * z.T) return;
  const std::size_t bh = std::size_t(token) / z.T;
  const int t = int(std::size_t(token) % z.T), lane = int(threadIdx.x);
  const float c = weights_at(z, p.dt, p.trap, bh, t).c / z.s;
  const int n = z.R * z.Dv;
  const T* v = static_cast<const T*>(p.v) + std::size_t(token) * n;
  float* out = p.v_inner + std::size_t(token) * n;
  for (int e = lane; e < n; e += 32) out[e] = c * to_float(v[e]);
  if (p.g_inner)
    for (int r = lane; r < z.R; r += 32) p.g_inner[std::size_t(token) * z.R + r] = r == 0 ? p.g[token] : 0.0f;
}

// A = Q_t K_t^T of q/k head row `bk` (b Hk + hk)'s token t into `A` (R x R, shared by the warp).
template <class T>
__device__ void token_scores(const TokenShape& z, const T* q, const T* k, float* A) {
  const int lane = int(threadIdx.x);
  for (int e = 0; e < z.R * z.R; ++e) {
    const int r = e / z.R, r2 = e - r * z.R;
    float part = 0.0f;
    for (int i = lane; i < z.Dk; i += 32) part = fmaf(to_float(q[r * z.Dk + i]), to_float(k[r2 * z.Dk + i]), part);
    const float sum = warp_sum(part);
    if (lane == 0) A[e] = sum;
  }
  __syncwarp();
}

struct CorrectionParams {
  const void* q;
  const void* k;
  const void* v;
  const float* dt;
  const float* trap;
  float* o;
  TokenShape z;
};

// One warp per token of a q/k head, over its value heads: o_r += sum_r' w_rr' A_rr' v_r'.
template <class T>
__global__ void __launch_bounds__(32 * kWarps) trapezoidal_correction_kernel(CorrectionParams p) {
  extern __shared__ float scores[];  // kWarps x R x R
  const TokenShape& z = p.z;
  const long token = long(blockIdx.x) * kWarps + threadIdx.y;
  if (token >= long(z.B) * z.Hk * z.T) return;
  const std::size_t bk = std::size_t(token) / z.T;
  const int t = int(std::size_t(token) % z.T), lane = int(threadIdx.x);
  const std::size_t b = bk / z.Hk, hk = bk % z.Hk;
  float* A = scores + threadIdx.y * z.R * z.R;
  const std::size_t key = std::size_t(token) * z.R * z.Dk;
  token_scores(z, static_cast<const T*>(p.q) + key, static_cast<const T*>(p.k) + key, A);
  for (int m = 0; m < z.group; ++m) {
    const std::size_t bh = b * z.H + hk * z.group + m;
    const TrapezoidalWeights<float> w = weights_at(z, p.dt, p.trap, bh, t);
    const std::size_t row = (bh * z.T + t) * z.R * z.Dv;
    const T* v = static_cast<const T*>(p.v) + row;
    float* o = p.o + row;
    for (int r = 0; r < z.R; ++r)
      for (int j = lane; j < z.Dv; j += 32) {
        float add = 0.0f;
        for (int r2 = 0; r2 < z.R; ++r2)
          add = fmaf(trapezoidal_correction_weight(w, r, r2) * A[r * z.R + r2], to_float(v[r2 * z.Dv + j]), add);
        o[r * z.Dv + j] += add;
      }
  }
}

struct BackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dO;
  const float* dt;
  const float* trap;
  float* dq;
  float* dk;
  float* dv;        // in: the inner dv'; out: dv
  float* dc;        // dc_t per token of each value head (ddt's place until the dt pass)
  float* dmu_next;  // dmu_{t+1} per token of each value head
  TokenShape z;
};

// One warp per token of a q/k head, over its value heads (this file's header).
template <class T>
__global__ void __launch_bounds__(32 * kWarps) trapezoidal_backward_kernel(BackwardParams p) {
  extern __shared__ float matrices[];  // kWarps x (A, M), each R x R
  const TokenShape& z = p.z;
  const long token = long(blockIdx.x) * kWarps + threadIdx.y;
  if (token >= long(z.B) * z.Hk * z.T) return;
  const std::size_t bk = std::size_t(token) / z.T;
  const int t = int(std::size_t(token) % z.T), lane = int(threadIdx.x), RR = z.R * z.R;
  const std::size_t b = bk / z.Hk, hk = bk % z.Hk;
  float* A = matrices + threadIdx.y * 2 * RR;
  float* M = A + RR;
  const std::size_t key = std::size_t(token) * z.R * z.Dk;
  const T* q = static_cast<const T*>(p.q) + key;
  const T* k = static_cast<const T*>(p.k) + key;
  token_scores(z, q, k, A);
  for (int e = lane; e < RR; e += 32) M[e] = 0.0f;
  __syncwarp();
  for (int m = 0; m < z.group; ++m) {
    const std::size_t bh = b * z.H + hk * z.group + m, at = bh * z.T + t;
    const TrapezoidalWeights<float> w = weights_at(z, p.dt, p.trap, bh, t);
    const std::size_t row = at * z.R * z.Dv;
    const T* v = static_cast<const T*>(p.v) + row;
    const T* dO = static_cast<const T*>(p.dO) + row;
    float* dv = p.dv + row;
    // The inner gradient of v' = (c_t / s) v: dc_t from it, then dv in place (each lane its own elements).
    float part = 0.0f;
    for (int e = lane; e < z.R * z.Dv; e += 32) part = fmaf(to_float(v[e]), dv[e], part);
    float dc = warp_sum(part) / z.s, all = 0.0f;
    const float c = w.c / z.s;
    for (int e = lane; e < z.R * z.Dv; e += 32) dv[e] *= c;
    for (int e = 0; e < RR; ++e) {
      const int r = e / z.R, r2 = e - r * z.R;
      part = 0.0f;
      for (int j = lane; j < z.Dv; j += 32) part = fmaf(to_float(dO[r * z.Dv + j]), to_float(v[r2 * z.Dv + j]), part);
      const float B = warp_sum(part), ab = A[e] * B, weight = trapezoidal_correction_weight(w, r, r2);
      all += ab;
      if (r2 > r) dc += ab;
      if (lane == 0) M[e] += weight * B;
      const float scale = weight * A[e];
      for (int j = lane; j < z.Dv; j += 32) dv[r2 * z.Dv + j] = fmaf(scale, to_float(dO[r * z.Dv + j]), dv[r2 * z.Dv + j]);
    }
    if (lane == 0) {
      p.dc[at] = dc;
      p.dmu_next[at] = dc - all;
    }
  }
  __syncwarp();
  float* dq = p.dq + key;
  float* dk = p.dk + key;
  for (int r = 0; r < z.R; ++r)
    for (int i = lane; i < z.Dk; i += 32) {
      float add_q = 0.0f, add_k = 0.0f;
      for (int r2 = 0; r2 < z.R; ++r2) {
        add_q = fmaf(M[r * z.R + r2], to_float(k[r2 * z.Dk + i]), add_q);  // dq_r  += M_rr' k_r'
        add_k = fmaf(M[r2 * z.R + r], to_float(q[r2 * z.Dk + i]), add_k);  // dk_r  += M_r'r q_r'
      }
      dq[r * z.Dk + i] += add_q;
      dk[r * z.Dk + i] += add_k;
    }
}

struct InputGradParams {
  const float* dt;
  const float* trap;
  const float* dmu_next;
  const float* dg_inner;  // R > 1: the inner dg, B H T R; null: the inner row wrote dg itself
  float* ddt;             // in: dc_t
  float* dtrap;
  float* dg;
  TokenShape z;
};

// One thread per token of a value head: ddt and dtrap from dc_t and dmu_t, dg from the inner's.
__global__ void trapezoidal_input_grad_kernel(InputGradParams p) {
  const TokenShape& z = p.z;
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(z.B) * z.H * z.T) return;
  const int t = int(i % z.T);
  const float dmu = first_token(z, t) ? 0.0f : p.dmu_next[i - 1];
  const float lambda = 1.0f / (1.0f + expf(-p.trap[i]));
  const TrapezoidalInputGrads<float> d = trapezoidal_input_grads<float>(lambda, p.dt[i], p.ddt[i], dmu);
  p.ddt[i] = d.ddt;
  p.dtrap[i] = d.dtrap;
  if (p.dg_inner) p.dg[i] = p.dg_inner[std::size_t(i) * z.R];
}

// y = a x, in place when y == x.
__global__ void trapezoidal_scale_kernel(float* y, const float* x, float a, long n) {
  for (long i = long(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) y[i] = a * x[i];
}

__global__ void trapezoidal_widen_kernel(const __nv_bfloat16* x, float* y, long n) {
  for (long i = long(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

unsigned flat_blocks(long n, unsigned threads) { return unsigned(std::min<long>((n + threads - 1) / threads, 4096)); }

void scale(float* y, const float* x, float a, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  trapezoidal_scale_kernel<<<flat_blocks(long(n), 256), 256, 0, stream>>>(y, x, a, long(n));
  LATTN_CUDA_CHECK_LAUNCH();
}

// bf16 token tensors widened for the float32 inner row (float32 ones as they are).
const void* widened(Dtype dtype, const void* x, float* into, std::size_t n, cudaStream_t stream) {
  if (dtype == Dtype::f32) return x;
  if (n) {
    trapezoidal_widen_kernel<<<flat_blocks(long(n), 256), 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), into,
                                                                            long(n));
    LATTN_CUDA_CHECK_LAUNCH();
  }
  return into;
}

TokenShape token_shape(const Problem& p, const ScanShape& shape) {
  return {p.batch, p.seq, p.heads, p.qk_heads(), p.group(), p.rows(), p.dim, p.value_dim(), shape.cu, p.sequences(),
          float(attention_scale(p.dim))};
}

std::size_t floats(std::size_t n) { return n * sizeof(float); }

// What both directions hold while the inner row runs, before its own scratch (the header's list).
std::size_t passes_bytes(const Problem& p, Dtype dtype, bool backward) {
  const std::size_t gates = p.rows() > 1 ? trapezoidal_inner(p).gate_elems() : 0;
  const std::size_t widened_tokens = dtype == Dtype::f32 ? 0 : 2 * p.key_elems() + (backward ? p.value_elems() : 0);
  return scan_shape_bytes(p) +
         floats(p.value_elems() + p.state_elems() + gates + widened_tokens + (backward ? p.state_elems() + gates : 0));
}

// The inner row's enqueued runs, float32.
void inner_forward(TrapezoidalInner inner, const Problem& in, const DeviceForward& a, Allocator& m, cudaStream_t s,
                   void* kept) {
  if (inner == TrapezoidalInner::scan) return scan_additive_forward(in, Dtype::f32, a, m, s);
  chunked_gated_forward(in, Dtype::f32, a, m, s, kept);
}

void inner_backward(TrapezoidalInner inner, const Problem& in, const DeviceBackward& a, Allocator& m, cudaStream_t s,
                    const void* kept) {
  if (inner == TrapezoidalInner::scan) return scan_additive_backward(in, Dtype::f32, a, m, s);
  chunked_gated_backward(in, Dtype::f32, a, m, s, kept);
}

void prepare(const Problem& p, Dtype dtype, const TokenShape& z, const void* v, const float* g, const float* dt,
             const float* trap, const float* h0, float* v_inner, float* g_inner, float* h0_inner,
             cudaStream_t stream) {
  const long tokens = long(z.B) * z.H * z.T;
  const PrepareParams params{v, g, dt, trap, v_inner, g_inner, z};
  const dim3 block(32, kWarps);
  const unsigned grid = unsigned((tokens + kWarps - 1) / kWarps);
  if (dtype == Dtype::f32)
    trapezoidal_prepare_kernel<float><<<grid, block, 0, stream>>>(params);
  else
    trapezoidal_prepare_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
  scale(h0_inner, h0, 1.0f / z.s, p.state_elems(), stream);
}

unsigned qk_token_blocks(const TokenShape& z) {
  return unsigned((long(z.B) * z.Hk * z.T + kWarps - 1) / kWarps);
}

}  // namespace

std::optional<std::string> trapezoidal_scan_limits(const Problem& p) {
  if (auto why = trapezoidal_chunked_limits(p)) return why;
  return scan_unsupported(p);
}

std::optional<std::string> trapezoidal_chunked_limits(const Problem& p) {
  if (p.rows() > kTrapezoidalMaxRank)
    return "the CUDA trapezoidal passes take mimo_rank <= " + std::to_string(kTrapezoidalMaxRank) + ", not " +
           std::to_string(p.rows());
  return std::nullopt;
}

std::optional<std::string> trapezoidal_chunked_unsupported(const Problem& p, Dtype, std::size_t max_shared_bytes) {
  return chunked_gated_unsupported(trapezoidal_inner(p), Dtype::f32, max_shared_bytes);
}

std::size_t trapezoidal_kept_bytes(const Problem& p, Dtype) {
  return chunked_gated_states_bytes(trapezoidal_inner(p), Dtype::f32);
}

std::size_t trapezoidal_forward_workspace_bytes(TrapezoidalInner inner, const Problem& p, Dtype dtype) {
  const Problem in = trapezoidal_inner(p);
  return passes_bytes(p, dtype, false) + (inner == TrapezoidalInner::scan
                                              ? scan_additive_forward_workspace_bytes(in)
                                              : chunked_gated_forward_workspace_bytes(in, Dtype::f32));
}

std::size_t trapezoidal_backward_workspace_bytes(TrapezoidalInner inner, const Problem& p, Dtype dtype, bool kept) {
  const Problem in = trapezoidal_inner(p);
  return passes_bytes(p, dtype, true) + (inner == TrapezoidalInner::scan
                                             ? scan_additive_backward_workspace_bytes(in)
                                             : chunked_gated_backward_workspace_bytes(in, Dtype::f32, kept));
}

void trapezoidal_forward(TrapezoidalInner inner, const Problem& p, Dtype dtype, const DeviceForward& a,
                         Allocator& allocator, cudaStream_t stream, void* kept) {
  if (auto why = trapezoidal_chunked_limits(p)) throw RuntimeFailure(*why);
  const Problem in = trapezoidal_inner(p);
  const bool multi = p.rows() > 1, bf16 = dtype != Dtype::f32;
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const TokenShape z = token_shape(p, scan_shape(p, cu, stream));
  Workspace<float> v_inner(allocator, p.value_elems()), h0_inner(allocator, p.state_elems());
  Workspace<float> g_inner(allocator, multi ? in.gate_elems() : 0);
  Workspace<float> q_wide(allocator, bf16 ? p.key_elems() : 0), k_wide(allocator, bf16 ? p.key_elems() : 0);
  prepare(p, dtype, z, a.v, a.g, a.dt, a.trap, a.h0, v_inner.data(), g_inner.data(), h0_inner.data(), stream);
  DeviceForward f{};
  f.q = widened(dtype, a.q, q_wide.data(), p.key_elems(), stream);
  f.k = widened(dtype, a.k, k_wide.data(), p.key_elems(), stream);
  f.v = v_inner.data(), f.h0 = h0_inner.data(), f.o = a.o, f.hT = a.hT;
  f.g = multi ? g_inner.data() : a.g;
  inner_forward(inner, in, f, allocator, stream, kept);

  scale(a.hT, a.hT, z.s, p.state_elems(), stream);
  const CorrectionParams params{a.q, a.k, a.v, a.dt, a.trap, a.o, z};
  const dim3 block(32, kWarps);
  const std::size_t shared = sizeof(float) * kWarps * z.R * z.R;
  if (dtype == Dtype::f32)
    trapezoidal_correction_kernel<float><<<qk_token_blocks(z), block, shared, stream>>>(params);
  else
    trapezoidal_correction_kernel<__nv_bfloat16><<<qk_token_blocks(z), block, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

void trapezoidal_backward(TrapezoidalInner inner, const Problem& p, Dtype dtype, const DeviceBackward& a,
                          Allocator& allocator, cudaStream_t stream, const void* kept) {
  if (auto why = trapezoidal_chunked_limits(p)) throw RuntimeFailure(*why);
  const Problem in = trapezoidal_inner(p);
  const bool multi = p.rows() > 1, bf16 = dtype != Dtype::f32;
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const TokenShape z = token_shape(p, scan_shape(p, cu, stream));
  Workspace<float> v_inner(allocator, p.value_elems()), h0_inner(allocator, p.state_elems());
  Workspace<float> g_inner(allocator, multi ? in.gate_elems() : 0);
  Workspace<float> q_wide(allocator, bf16 ? p.key_elems() : 0), k_wide(allocator, bf16 ? p.key_elems() : 0);
  Workspace<float> dhT_inner(allocator, p.state_elems()), dg_inner(allocator, multi ? in.gate_elems() : 0);
  Workspace<float> dO_wide(allocator, bf16 ? p.value_elems() : 0);
  prepare(p, dtype, z, a.v, a.g, a.dt, a.trap, a.h0, v_inner.data(), g_inner.data(), h0_inner.data(), stream);
  scale(dhT_inner.data(), a.dhT, z.s, p.state_elems(), stream);
  DeviceBackward b{};
  b.q = widened(dtype, a.q, q_wide.data(), p.key_elems(), stream);
  b.k = widened(dtype, a.k, k_wide.data(), p.key_elems(), stream);
  b.dO = widened(dtype, a.dO, dO_wide.data(), p.value_elems(), stream);
  b.v = v_inner.data(), b.h0 = h0_inner.data(), b.dhT = dhT_inner.data();
  b.dq = a.dq, b.dk = a.dk, b.dv = a.dv, b.dh0 = a.dh0;
  b.g = multi ? g_inner.data() : a.g;
  b.dg = multi ? dg_inner.data() : a.dg;
  inner_backward(inner, in, b, allocator, stream, kept);

  // v' is no longer read: it holds dmu_{t+1} per token (B H T <= its B H T R Dv floats).
  float* dmu_next = v_inner.data();
  const BackwardParams params{a.q, a.k, a.v, a.dO, a.dt, a.trap, a.dq, a.dk, a.dv, a.ddt, dmu_next, z};
  const dim3 block(32, kWarps);
  const std::size_t shared = sizeof(float) * kWarps * 2 * z.R * z.R;
  if (dtype == Dtype::f32)
    trapezoidal_backward_kernel<float><<<qk_token_blocks(z), block, shared, stream>>>(params);
  else
    trapezoidal_backward_kernel<__nv_bfloat16><<<qk_token_blocks(z), block, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
  const long tokens = long(z.B) * z.H * z.T;
  const InputGradParams grads{a.dt, a.trap, dmu_next, multi ? dg_inner.data() : nullptr, a.ddt, a.dtrap, a.dg, z};
  trapezoidal_input_grad_kernel<<<unsigned((tokens + 127) / 128), 128, 0, stream>>>(grads);
  LATTN_CUDA_CHECK_LAUNCH();
  scale(a.dh0, a.dh0, 1.0f / z.s, p.state_elems(), stream);
}

}  // namespace lattn::cuda

// The delta rule's recurrent (scan) form on the GPU (docs/spec.md section 1b), forward and backward, every
// decay, float32 or bf16 token inputs, float32 state and accumulation. The same passes as the CPU
// scan (cpu_scan_delta.cpp, docs/kernels.md):
//   forward  (S):   S'_t = A_t S_{t-1}, u_t = S'^T k_t, w_t = beta_t (v_t - u_t), S_t = S'_t + k_t w_t^T,
//                   o_t = s (S'^T q_t + (q_t . k_t) w_t)                               -> o, hT
//   F1 (S):         e_t = v_t - u_t                                                    -> scratch E
//   R1 (G, reverse): G_t = A_{t+1} P_{t+1} + s q_t do_t^T, dw_t = G_t^T k_t,
//                   P_t = G_t - beta_t k_t dw_t^T                                      -> dw (in dv), dh0 = A_0 P_0
//   R2 (G^T, reverse): the same transposed, dk_write_t = beta_t G_t e_t                -> dk
//   F2 (S^T):       dk_read_t = -S'_t dv_t, dq_t = s S_t do_t; dg's running sums      -> dq, dk, dg
//   finish:         dbeta_t = dw_t . e_t, dv_t = beta_t dw_t; scalar gates' dg summed over channels
// Tiling as the additive scan (cuda_scan.cu): one block per (batch x head, slice of 32 state
// columns), lane x owning column x, warp y the rows y, y + R, ... in registers. A delta-rule token
// cannot start before the previous token's readout is summed over every row (its update needs
// v_t - u_t), so the warps' partial sums go through shared memory once per token, double-buffered:
// one barrier per token, and every warp then holds each column's sums and runs the token's
// epilogue itself (warp 0 writes). Scratch: E (B x H x T x D floats) and, for scalar gates, the
// per-channel dg sums (as many).
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/linear_attention/cuda.hpp"

namespace lattn::cuda {
namespace {

constexpr int kCols = 32;
constexpr int kRows = 16;  // state rows per thread
constexpr int kSums = 4;   // readouts per token summed over the warps

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

enum class Pass { forward, f1, r1, r2, f2 };

struct DeltaParams {
  Pass pass;
  const void *q, *k, *v, *dO;  // token inputs in the case's dtype
  const float *beta, *g, *s0;  // s0: h0, dhT (row-major D x D), read transposed for S^T and G^T
  float *o, *hT, *E, *dq, *dk, *dw, *dh0, *dg, *dg_channels;
  int T, D, H;
  bool retnet, vector_gates, scalar_gates;
  float s;
};

template <class In>
__device__ __forceinline__ float at(const void* base, std::size_t i) {
  return to_float(static_cast<const In*>(base)[i]);
}

template <class In>
__global__ void delta_scan_kernel(DeltaParams p) {
  extern __shared__ float sums[];  // 2 x R x kSums x kCols
  const int D = p.D, T = p.T, R = int(blockDim.y);
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int bh = int(blockIdx.x), col0 = int(blockIdx.y) * kCols, j = col0 + lane;
  const bool j_ok = j < D;
  const std::size_t tok = std::size_t(bh) * T * D, st = std::size_t(bh) * D * D;
  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - bh % p.H)) : 1.0f;
  const float* beta = p.beta + std::size_t(bh) * T;
  const float* g = p.g ? p.g + std::size_t(bh) * T * (p.vector_gates ? D : 1) : nullptr;
  const bool transposed = p.pass == Pass::r2 || p.pass == Pass::f2;  // rows: value channels
  const bool reverse = p.pass == Pass::r1 || p.pass == Pass::r2;

  // The state decay of token t (t == T: none) for row i, or for this lane's column.
  auto decay = [&](int t, int i) -> float {
    if (t >= T) return 1.0f;
    if (p.scalar_gates) return expf(g[t]);
    if (p.vector_gates) return expf(g[std::size_t(t) * D + (transposed ? j : i)]);
    return gamma;
  };
  auto tk = [&](const void* x, int t, int i) { return at<In>(x, tok + std::size_t(t) * D + i); };

  float S[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    S[m] = (j_ok && i < D) ? (transposed ? p.s0[st + std::size_t(j) * D + i] : p.s0[st + std::size_t(i) * D + j]) : 0.0f;
  }
  float c1 = 0.0f;  // the pending update's column operand (forward, F1: w_{t-1}; R1: -beta dw_{t+1})
  double dg_acc = 0.0;
  if (p.pass == Pass::f2 && g && j_ok)
    for (int e = 0; e < D; ++e) dg_acc += double(p.dh0[st + std::size_t(j) * D + e]) * p.s0[st + std::size_t(j) * D + e];

  for (int step = 0; step < T; ++step) {
    const int t = reverse ? T - 1 - step : step;
    const int tp = reverse ? t + 1 : t - 1;  // the token of the pending update
    const bool has_prev = tp >= 0 && tp < T;
    float col1 = c1, col2 = 0.0f, colA = 1.0f;
    if (p.pass == Pass::r1) col2 = j_ok ? p.s * tk(p.dO, t, j) : 0.0f;
    if (p.pass == Pass::r2) {
      col1 = has_prev && j_ok ? -tk(p.k, tp, j) : 0.0f;
      col2 = j_ok ? p.s * tk(p.q, t, j) : 0.0f;
    }
    if (p.pass == Pass::f2) col2 = j_ok ? beta[t] * tk(p.k, t, j) : 0.0f;
    const int td = reverse ? t + 1 : t;  // the decay applied in this step
    if (transposed) colA = j_ok ? decay(td, 0) : 1.0f;  // S^T, G^T: a factor per column (rows: per row below)
    float y[kSums] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = wy + m * R;
      if (i >= D) continue;
      float r = S[m];
      switch (p.pass) {
        case Pass::forward:
        case Pass::f1:
          if (has_prev) r = fmaf(tk(p.k, tp, i), col1, r);
          r *= decay(t, i);
          y[0] = fmaf(tk(p.k, t, i), r, y[0]);
          if (p.pass == Pass::forward) {
            y[1] = fmaf(tk(p.q, t, i), r, y[1]);
            y[3] = fmaf(tk(p.q, t, i), tk(p.k, t, i), y[3]);
          }
          break;
        case Pass::r1:
          if (has_prev) r = fmaf(tk(p.k, tp, i), col1, r);
          r *= decay(td, i);
          r = fmaf(tk(p.q, t, i), col2, r);
          y[2] = fmaf(tk(p.k, t, i), r, y[2]);
          break;
        case Pass::r2:
          if (has_prev) r = fmaf(beta[tp] * p.dw[tok + std::size_t(tp) * D + i], col1, r);
          r *= colA;
          r = fmaf(tk(p.dO, t, i), col2, r);
          y[2] = fmaf(p.E[tok + std::size_t(t) * D + i], r, y[2]);
          break;
        case Pass::f2:
          r *= colA;
          y[0] = fmaf(beta[t] * p.dw[tok + std::size_t(t) * D + i], r, y[0]);
          r = fmaf(p.E[tok + std::size_t(t) * D + i], col2, r);
          y[2] = fmaf(tk(p.dO, t, i), r, y[2]);
          break;
      }
      S[m] = r;
    }
    float* buf = sums + (step & 1) * R * kSums * kCols;
#pragma unroll
    for (int x = 0; x < kSums; ++x) buf[(wy * kSums + x) * kCols + lane] = y[x];
    __syncthreads();
    float total[kSums] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int w = 0; w < R; ++w)
#pragma unroll
      for (int x = 0; x < kSums; ++x) total[x] += buf[(w * kSums + x) * kCols + lane];
    // The other buffer is written next step; this one only after the next barrier.
    if (!j_ok) continue;
    const std::size_t e = tok + std::size_t(t) * D + j;
    const bool writer = wy == 0;
    switch (p.pass) {
      case Pass::forward: {
        const float w = beta[t] * (tk(p.v, t, j) - total[0]);
        c1 = w;
        if (writer) p.o[e] = p.s * (total[1] + total[3] * w);
        break;
      }
      case Pass::f1: {
        const float ev = tk(p.v, t, j) - total[0];
        c1 = beta[t] * ev;
        if (writer) p.E[e] = ev;
        break;
      }
      case Pass::r1:
        c1 = -beta[t] * total[2];
        if (writer) p.dw[e] = total[2];
        break;
      case Pass::r2:
        if (writer) p.dk[e] = beta[t] * total[2];
        break;
      case Pass::f2: {
        if (!writer) break;  // dk is read and written here: by one warp only
        const float dq = p.s * total[2], read = -total[0], write = p.dk[e];
        p.dq[e] = dq;
        p.dk[e] = write + read;
        if (p.vector_gates) p.dg[std::size_t(bh) * T * D + std::size_t(t) * D + j] = float(dg_acc);
        if (p.scalar_gates) p.dg_channels[e] = float(dg_acc);
        const float qj = tk(p.q, t, j), kj = tk(p.k, t, j);
        dg_acc -= double(qj) * dq - double(kj) * write + double(kj) * read;
        break;
      }
    }
  }

  // The last pending update: forward, hT = S'_{T-1} + k_{T-1} w^T; R1, dh0 = A_0 (G_0 - k_0 (beta dw_0)^T).
  const bool last_update = p.pass == Pass::forward || p.pass == Pass::r1;
  if (!last_update || !j_ok) return;
  const int t = p.pass == Pass::forward ? T - 1 : 0;
  float* out = p.pass == Pass::forward ? p.hT : p.dh0;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    if (i >= D) continue;
    float r = fmaf(tk(p.k, t, i), c1, S[m]);
    if (p.pass == Pass::r1) r *= decay(0, i);
    out[st + std::size_t(i) * D + j] = r;
  }
}

// dbeta_t = dw_t . e_t, dv_t = beta_t dw_t (dw arrives in dv's storage); scalar gates: dg_t summed
// over the channels. One thread per (batch x head, token).
__global__ void delta_finish_kernel(float* dv, const float* E, const float* beta, float* dbeta, const float* dg_channels,
                                    float* dg, int D, long tokens) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= tokens) return;
  const std::size_t r = std::size_t(n) * D;
  float db = 0.0f;
  double sum = 0.0;
  for (int d = 0; d < D; ++d) {
    db = fmaf(dv[r + d], E[r + d], db);
    dv[r + d] *= beta[n];
    if (dg_channels) sum += dg_channels[r + d];
  }
  dbeta[n] = db;
  if (dg_channels) dg[n] = float(sum);
}

void launch(const Problem& pr, Dtype dtype, DeltaParams params, cudaStream_t stream) {
  if (pr.dim > kScanMaxDim) throw RuntimeFailure("scan: dim over " + std::to_string(kScanMaxDim));
  params.T = pr.seq;
  params.D = pr.dim;
  params.H = pr.heads;
  params.retnet = pr.decay == Decay::retnet;
  params.vector_gates = pr.decay == Decay::vector;
  params.scalar_gates = pr.decay == Decay::scalar;
  params.s = float(attention_scale(pr.dim));
  const int R = std::max(1, (pr.dim + kRows - 1) / kRows);
  const dim3 block(kCols, unsigned(R));
  const dim3 grid(unsigned(pr.heads_total()), unsigned((pr.dim + kCols - 1) / kCols));
  const std::size_t shared = sizeof(float) * 2 * std::size_t(R) * kSums * kCols;
  if (dtype == Dtype::f32)
    delta_scan_kernel<float><<<grid, block, shared, stream>>>(params);
  else
    delta_scan_kernel<__nv_bfloat16><<<grid, block, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void scan_delta_forward(const Problem& p, Dtype dtype, const DeviceForward& a, cudaStream_t stream) {
  DeltaParams f{};
  f.pass = Pass::forward;
  f.q = a.q, f.k = a.k, f.v = a.v, f.beta = a.beta, f.g = gated(p.decay) ? a.g : nullptr, f.s0 = a.h0;
  f.o = a.o, f.hT = a.hT;
  launch(p, dtype, f, stream);
}

void scan_delta_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                         cudaStream_t stream) {
  Workspace<float> E(allocator, p.token_elems());
  Workspace<float> channels(allocator, p.decay == Decay::scalar ? p.token_elems() : 0);
  DeltaParams b{};
  b.q = a.q, b.k = a.k, b.v = a.v, b.dO = a.dO, b.beta = a.beta, b.g = gated(p.decay) ? a.g : nullptr;
  b.E = E.data(), b.dq = a.dq, b.dk = a.dk, b.dw = a.dv, b.dh0 = a.dh0, b.dg = a.dg, b.dg_channels = channels.data();
  for (Pass pass : {Pass::f1, Pass::r1, Pass::r2, Pass::f2}) {
    b.pass = pass;
    b.s0 = pass == Pass::r1 || pass == Pass::r2 ? a.dhT : a.h0;
    launch(p, dtype, b, stream);
  }
  const long tokens = long(p.heads_total()) * p.seq;
  const unsigned threads = 128;
  delta_finish_kernel<<<unsigned((tokens + threads - 1) / threads), threads, 0, stream>>>(
      a.dv, E.data(), a.beta, a.dbeta, p.decay == Decay::scalar ? channels.data() : nullptr, a.dg, p.dim, tokens);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace lattn::cuda

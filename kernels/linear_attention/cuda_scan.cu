// The recurrent (scan) form on the GPU, forward and backward, float32 or bf16 token inputs,
// float32 state and accumulation.
//
// One kernel covers all four recurrences. With a row vector r_t (indexes state rows), a column
// vector c_t (state columns) and a query x_t (rows), it runs
//     S <- decay_t S + alpha r_t c_t^T,    out_t = beta S^T x_t
// over t = 1..T (or T..1 when reversed) and optionally writes the last S times final_scale:
//   forward   r = k, c = v, x = q, S0 = h0,    alpha 1, beta s        -> o, hT
//   dq        r = v, c = k, x = dO, S0 = h0^T, alpha 1, beta s        -> dq_t = s S_t dO_t (S' = S^T)
//   dv        reversed, r = q, c = dO, x = k, S0 = dhT, alpha s, beta 1, no decay at the first
//             step (G_T = dhT + s q_T dO_T^T)                         -> dv_t = G_t^T k_t, dh0 = gamma G_1
//   dk        reversed, r = dO, c = q, x = v, S0 = dhT^T               -> dk_t = G_t v_t (G' = G^T)
// (docs/spec.md section 1's backward: a forward recurrence for dq and a reverse one for dk, dv; no per-token
// state is stored, so no scratch memory.)
//
// Gated decays (docs/spec.md section 1b): decay_t is exp(g) of the step's token (forward, dq) or of the
// token after it (dv, dk: G_t = A_{t+1} G_{t+1} + s q_t do_t^T, and the first reverse step, having
// no token after it, does not decay), a scalar per token or, for vector gates, per key channel:
// the rows of S and G (forward, dv: a factor per state row), the columns of S^T and G^T (dq, dk: a
// factor per lane). The gates are float32 whatever the dtype; exp(g) of a stage's tokens is staged
// with them. dh0 = A_0 G_0. dg comes from a second kernel after the passes:
//   dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q_tau . dq_tau - k_tau . dk_tau)
// (per key channel for vector gates, summed over the channels for scalar gates; docs/kernels.md),
// one block per head, one thread per channel, summed in double.
//
// Tiling: one block per (batch x head, slice of 32 state columns). Lane x of every warp owns
// column x of the slice; warp y owns state rows y, y + R, y + 2R, ... (R = ceil(D / 16) warps, so
// at most 16 rows per thread, held in registers). Tokens are staged 8 at a time in shared memory
// (r, x: all D entries; c: the slice's 32); each thread updates its rows and keeps its partial dot
// product with x per token; the R partials of a column are summed after the stage. Two barriers
// per 8 tokens; the state never leaves registers.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/linear_attention/cuda.hpp"

namespace lattn::cuda {
namespace {

constexpr int kCols = 32;          // state columns per block: one per lane
constexpr int kRowsPerThread = 16;  // state rows per thread (registers)
constexpr int kStage = 8;          // tokens staged in shared memory at a time
static_assert(kScanMaxDim <= kRowsPerThread * 16, "at most 16 warps of 16 rows");

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// How a pass's state decays: gamma (retnet, or 1), or a gate per token, per state row or per column.
enum class GateScale { none, scalar, rows, columns };

struct ScanParams {
  const void* row;
  const void* col;
  const void* query;
  const float* s0;
  bool s0_transposed;
  float* out;
  float* final_state;
  bool final_times_gamma;
  int T, D, H;
  bool retnet;
  bool reverse;
  float alpha, beta;
  const float* gate;  // log-gates [B][H][T] or [B][H][T][D] (null: no gate)
  GateScale gate_scale;
  int gate_shift;  // 0: the step's own token's gate; 1: the next token's (reverse passes)
};

template <class T>
__global__ void scan_kernel(ScanParams p) {
  extern __shared__ float smem[];
  const int D = p.D, R = int(blockDim.y);
  float* r_stage = smem;                         // kStage x D
  float* x_stage = r_stage + kStage * D;         // kStage x D
  float* c_stage = x_stage + kStage * D;         // kStage x kCols
  float* partial = c_stage + kStage * kCols;     // R x kStage x kCols
  float* a_stage = partial + R * kStage * kCols;  // kStage x D: exp(g) (gated passes only)
  const GateScale gs = p.gate ? p.gate_scale : GateScale::none;
  const int gw = gs == GateScale::scalar ? 1 : D;  // gates per token

  const int bh = int(blockIdx.x);
  const int head = bh % p.H;
  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - head)) : 1.0f;
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int tid = wy * kCols + lane, nthreads = R * kCols;
  const int col0 = int(blockIdx.y) * kCols;
  const int j = col0 + lane;
  const bool j_ok = j < D;
  const std::size_t tok = std::size_t(bh) * p.T * D;
  const std::size_t st = std::size_t(bh) * D * D;
  const T* row = static_cast<const T*>(p.row) + tok;
  const T* colv = static_cast<const T*>(p.col) + tok;
  const T* query = static_cast<const T*>(p.query) + tok;
  const float* gates = p.gate ? p.gate + std::size_t(bh) * p.T * gw : nullptr;

  float S[kRowsPerThread];
#pragma unroll
  for (int m = 0; m < kRowsPerThread; ++m) {
    const int i = wy + m * R;
    S[m] = (j_ok && i < D) ? (p.s0_transposed ? p.s0[st + std::size_t(j) * D + i] : p.s0[st + std::size_t(i) * D + j])
                           : 0.0f;
  }

  for (int u0 = 0; u0 < p.T; u0 += kStage) {
    const int nu = min(kStage, p.T - u0);
    for (int e = tid; e < nu * D; e += nthreads) {
      const int u = e / D, i = e - u * D;
      const int t = p.reverse ? p.T - 1 - (u0 + u) : u0 + u;
      r_stage[u * D + i] = to_float(row[std::size_t(t) * D + i]);
      x_stage[u * D + i] = to_float(query[std::size_t(t) * D + i]);
      const int tg = t + p.gate_shift;  // past the last token: the first reverse step, no decay
      if (gates && i < gw) a_stage[u * D + i] = tg < p.T ? expf(gates[std::size_t(tg) * gw + i]) : 1.0f;
    }
    for (int e = tid; e < nu * kCols; e += nthreads) {
      const int u = e / kCols, jj = e - u * kCols;
      const int t = p.reverse ? p.T - 1 - (u0 + u) : u0 + u;
      c_stage[u * kCols + jj] = col0 + jj < D ? to_float(colv[std::size_t(t) * D + col0 + jj]) : 0.0f;
    }
    __syncthreads();

    for (int u = 0; u < nu; ++u) {
      const float* a = a_stage + u * D;
      float decay = (p.reverse && u0 + u == 0) ? 1.0f : gamma;
      if (gs == GateScale::scalar) decay = a[0];
      if (gs == GateScale::columns) decay = j_ok ? a[j] : 1.0f;
      const float c = p.alpha * c_stage[u * kCols + lane];
      const float* r = r_stage + u * D;
      const float* x = x_stage + u * D;
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < kRowsPerThread; ++m) {
        const int i = wy + m * R;
        if (i < D) {
          S[m] = fmaf(gs == GateScale::rows ? a[i] : decay, S[m], r[i] * c);
          acc = fmaf(S[m], x[i], acc);
        }
      }
      partial[(wy * kStage + u) * kCols + lane] = acc;
    }
    __syncthreads();

    // The next stage's loads overwrite r, x, c only; `partial` is written again only after the
    // next stage's barrier, by which time every thread has finished this reduction.
    for (int e = tid; e < nu * kCols; e += nthreads) {
      const int u = e / kCols, jj = e - u * kCols;
      if (col0 + jj >= D) continue;
      float sum = 0.0f;
      for (int y = 0; y < R; ++y) sum += partial[(y * kStage + u) * kCols + jj];
      const int t = p.reverse ? p.T - 1 - (u0 + u) : u0 + u;
      p.out[tok + std::size_t(t) * D + col0 + jj] = p.beta * sum;
    }
  }

  if (p.final_state) {
    const float scale = p.final_times_gamma ? gamma : 1.0f;
#pragma unroll
    for (int m = 0; m < kRowsPerThread; ++m) {
      const int i = wy + m * R;
      // dh0 = A_0 G_0: with gates, A_0's factor for row i.
      const float a0 = !gates || !p.final_times_gamma ? 1.0f : expf(gates[gs == GateScale::scalar ? 0 : i]);
      if (j_ok && i < D) p.final_state[st + std::size_t(i) * D + j] = scale * a0 * S[m];
    }
  }
}

struct GateGradParams {
  const void* q;
  const void* k;
  const float* dq;
  const float* dk;
  const float* h0;
  const float* dh0;
  float* dg;
  int T, D;
  bool scalar;
};

// Every thread's x summed over the block (blockDim.x a power of two), returned to all of them.
__device__ double block_sum(double* sums, double x) {
  const int d = int(threadIdx.x);
  sums[d] = x;
  __syncthreads();
  for (int half = int(blockDim.x) / 2; half > 0; half /= 2) {
    if (d < half) sums[d] += sums[d + half];
    __syncthreads();
  }
  const double total = sums[0];
  __syncthreads();  // before the next call writes sums again
  return total;
}

// dg of one head (this file's header): thread d owns key channel d; scalar gates sum the channels.
template <class T>
__global__ void gate_grad_kernel(GateGradParams p) {
  extern __shared__ double sums[];
  const int D = p.D, d = int(threadIdx.x);
  const bool on = d < D;
  const std::size_t tok = std::size_t(blockIdx.x) * p.T * D, st = std::size_t(blockIdx.x) * D * D;
  const T* q = static_cast<const T*>(p.q) + tok;
  const T* k = static_cast<const T*>(p.k) + tok;
  float* dg = p.dg + std::size_t(blockIdx.x) * p.T * (p.scalar ? 1 : D);
  double acc = 0.0;  // rowsum(dh0 . h0), then minus each token's terms
  if (on)
    for (int j = 0; j < D; ++j) acc += double(p.dh0[st + std::size_t(d) * D + j]) * p.h0[st + std::size_t(d) * D + j];
  if (p.scalar) acc = block_sum(sums, acc);
  for (int t = 0; t < p.T; ++t) {
    const std::size_t e = std::size_t(t) * D + d;
    const double term = on ? double(to_float(q[e])) * p.dq[tok + e] - double(to_float(k[e])) * p.dk[tok + e] : 0.0;
    if (p.scalar) {
      const double step = block_sum(sums, term);
      if (d == 0) dg[t] = float(acc);
      acc -= step;
    } else if (on) {
      dg[e] = float(acc);
      acc -= term;
    }
  }
}

// transposed: the pass runs on S^T or G^T, whose columns are the key channels a vector gate scales.
void launch(const Problem& pr, Dtype dtype, ScanParams params, cudaStream_t stream, const float* g = nullptr,
            bool transposed = false, int gate_shift = 0) {
  if (pr.dim > kScanMaxDim) throw RuntimeFailure("scan: dim over " + std::to_string(kScanMaxDim));
  params.T = pr.seq;
  params.D = pr.dim;
  params.H = pr.heads;
  params.retnet = pr.decay == Decay::retnet;
  params.gate = gated(pr.decay) ? g : nullptr;
  params.gate_scale = pr.decay == Decay::scalar ? GateScale::scalar
                      : pr.decay == Decay::vector ? (transposed ? GateScale::columns : GateScale::rows)
                                                  : GateScale::none;
  params.gate_shift = gate_shift;
  const int R = std::max(1, (pr.dim + kRowsPerThread - 1) / kRowsPerThread);
  const dim3 block(kCols, unsigned(R));
  const dim3 grid(unsigned(pr.heads_total()), unsigned((pr.dim + kCols - 1) / kCols));
  const std::size_t shared = sizeof(float) * (3 * kStage * pr.dim + kStage * kCols + std::size_t(R) * kStage * kCols);
  if (dtype == Dtype::f32)
    scan_kernel<float><<<grid, block, shared, stream>>>(params);
  else
    scan_kernel<__nv_bfloat16><<<grid, block, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::optional<std::string> scan_unsupported(const Problem& p) {
  if (p.dim > kScanMaxDim)
    return "the CUDA scan keeps the state in registers and handles dim <= " + std::to_string(kScanMaxDim) +
           ", not " + std::to_string(p.dim);
  return std::nullopt;
}

void scan_additive_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator&, cudaStream_t stream) {
  const float s = float(attention_scale(p.dim));
  ScanParams f{};
  f.row = a.k, f.col = a.v, f.query = a.q, f.s0 = a.h0, f.s0_transposed = false;
  f.out = a.o, f.final_state = a.hT, f.final_times_gamma = false;
  f.reverse = false, f.alpha = 1.0f, f.beta = s;
  launch(p, dtype, f, stream, a.g, false, 0);
}

void scan_additive_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator&, cudaStream_t stream) {
  const float s = float(attention_scale(p.dim));
  ScanParams dq{};  // forward recurrence of S^T: dq_t = s S_t dO_t
  dq.row = a.v, dq.col = a.k, dq.query = a.dO, dq.s0 = a.h0, dq.s0_transposed = true;
  dq.out = a.dq, dq.final_state = nullptr, dq.reverse = false, dq.alpha = 1.0f, dq.beta = s;
  launch(p, dtype, dq, stream, a.g, true, 0);

  ScanParams dv{};  // reverse recurrence of G: dv_t = G_t^T k_t, dh0 = gamma G_1
  dv.row = a.q, dv.col = a.dO, dv.query = a.k, dv.s0 = a.dhT, dv.s0_transposed = false;
  dv.out = a.dv, dv.final_state = a.dh0, dv.final_times_gamma = true;
  dv.reverse = true, dv.alpha = s, dv.beta = 1.0f;
  launch(p, dtype, dv, stream, a.g, false, 1);

  ScanParams dk{};  // reverse recurrence of G^T: dk_t = G_t v_t
  dk.row = a.dO, dk.col = a.q, dk.query = a.v, dk.s0 = a.dhT, dk.s0_transposed = true;
  dk.out = a.dk, dk.final_state = nullptr, dk.reverse = true, dk.alpha = s, dk.beta = 1.0f;
  launch(p, dtype, dk, stream, a.g, true, 1);
  if (!gated(p.decay)) return;

  GateGradParams gg{a.q, a.k, a.dq, a.dk, a.h0, a.dh0, a.dg, p.seq, p.dim, p.decay == Decay::scalar};
  unsigned threads = 32;
  while (threads < unsigned(p.dim)) threads *= 2;
  const std::size_t shared = sizeof(double) * threads;
  if (dtype == Dtype::f32)
    gate_grad_kernel<float><<<unsigned(p.heads_total()), threads, shared, stream>>>(gg);
  else
    gate_grad_kernel<__nv_bfloat16><<<unsigned(p.heads_total()), threads, shared, stream>>>(gg);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace lattn::cuda

// The delta rule's recurrent (scan) form on the GPU (docs/spec.md section 1b), forward and backward, every
// decay, float32 or bf16 token inputs, float32 state and accumulation. The same passes as the CPU
// scan (cpu/scan/scan_delta.cpp, docs/kernels.md):
//   forward  (S):   S'_t = A_t S_{t-1}, u_t = S'^T k_t, w_t = beta_t (v_t - u_t), S_t = S'_t + k_t w_t^T,
//                   o_t = s (S'^T q_t + (q_t . k_t) w_t)                               -> o, hT
//   F1 (S):         e_t = v_t - u_t                                                    -> scratch E
//   R1 (G, reverse): G_t = A_{t+1} P_{t+1} + s q_t do_t^T, dw_t = G_t^T k_t,
//                   P_t = G_t - beta_t k_t dw_t^T                                      -> dw (in dv), dh0 = A_0 P_0
//   R2 (G^T, reverse): the same transposed, dk_write_t = beta_t G_t e_t                -> dk
//   F2 (S^T):       dk_read_t = -S'_t dv_t, dq_t = s S_t do_t; dg's running sums      -> dq, dk, dg
//   finish:         dbeta_t = dw_t . e_t, dv_t = beta_t dw_t; scalar gates' dg summed over channels
// S and G are Dk x Dv (rows: key channels), S^T and G^T (R2, F2) Dv x Dk; every shape of docs/spec.md
// section 1c (cuda/scan_shapes.cuh): a packed document is one block row's tokens, from its own h0.
// Tiling as the additive scan (cuda/scan.cu): one block per ((sequence, value head) pair, slice of
// 32 state columns), lane x owning column x, warp y the rows y, y + R, ... in registers. A delta-rule token
// cannot start before the previous token's readout is summed over every row (its update needs
// v_t - u_t), so the warps' partial sums go through shared memory once per token, double-buffered:
// one barrier per token, and every warp then holds each column's sums and runs the token's
// epilogue itself (warp 0 writes). Scratch: E (B x H x T x Dv floats), for scalar gates the
// per-channel dg sums (B x H x T x Dk), with grouped heads dq and dk per value head (as many
// each: F2 reads back R2's dk of its own value head, and dg's running sums need both; the group's
// sums come last, sum_group_keys), and a packed problem's document boundaries.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/scan_shapes.cuh"

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
  const float *beta, *g, *s0;  // s0: h0, dhT (row-major Dk x Dv), read transposed for S^T and G^T
  // dq, dk, dg_channels: per value head (the key parts; dq and dk themselves for group 1).
  float *o, *hT, *E, *dq, *dk, *dw, *dh0, *dg, *dg_channels;
  ScanShape shape;
  bool retnet, vector_gates, scalar_gates;
  float s;
};

template <class In>
__device__ __forceinline__ float at(const void* base, std::size_t i) {
  return to_float(static_cast<const In*>(base)[i]);
}

// One instance per pass (kPass): with the pass known, each keeps the loads of its own branch in
// registers only, at most 128 a thread, so that 16 warps (rows up to kScanMaxDim) fit a block's
// 64K registers; one kernel for every pass took 166 to 220 (by arch and dtype) and could not
// launch past 9 to 12 warps (rows 144 to 192).
template <class In, Pass kPass>
__global__ void __launch_bounds__(kCols * 16, 1) delta_scan_kernel(DeltaParams p) {
  extern __shared__ float sums[];  // 2 x R x kSums x kCols
  const ScanSlice slice = scan_slice(p.shape, int(blockIdx.x));
  const int Dk = p.shape.Dk, Dv = p.shape.Dv, T = slice.seq, R = int(blockDim.y);
  const bool transposed = kPass == Pass::r2 || kPass == Pass::f2;  // rows: value channels
  const bool reverse = kPass == Pass::r1 || kPass == Pass::r2;
  const int Dr = transposed ? Dv : Dk, Dc = transposed ? Dk : Dv;  // state rows, columns
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int col0 = int(blockIdx.y) * kCols, j = col0 + lane;
  const bool j_ok = j < Dc;
  const std::size_t st = slice.state;
  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - slice.head)) : 1.0f;
  const float* beta = p.beta + slice.beta;
  const float* g = p.g ? p.g + slice.gate : nullptr;

  // The state decay of token t (t == T: none) for row i, or for this lane's column.
  auto decay = [&](int t, int i) -> float {
    if (t >= T) return 1.0f;
    if (p.scalar_gates) return expf(g[t]);
    if (p.vector_gates) return expf(g[std::size_t(t) * Dk + (transposed ? j : i)]);
    return gamma;
  };
  // Token t's channel i of a key tensor (q, k: the pair's q/k head) or of a value tensor (v, dO).
  auto key = [&](const void* x, int t, int i) { return at<In>(x, slice.key + std::size_t(t) * Dk + i); };
  auto val = [&](const void* x, int t, int i) { return at<In>(x, slice.value + std::size_t(t) * Dv + i); };
  // Where token t's channel i lives in the float value tensors (o, E, dw) and the key parts.
  auto val_at = [&](int t, int i) { return slice.value + std::size_t(t) * Dv + i; };
  auto part_at = [&](int t, int i) { return slice.key_part + std::size_t(t) * Dk + i; };

  float S[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    S[m] = (j_ok && i < Dr) ? p.s0[st + (transposed ? std::size_t(j) * Dv + i : std::size_t(i) * Dv + j)] : 0.0f;
  }
  float c1 = 0.0f;  // the pending update's column operand (forward, F1: w_{t-1}; R1: -beta dw_{t+1})
  double dg_acc = 0.0;
  if (kPass == Pass::f2 && g && j_ok)
    for (int e = 0; e < Dv; ++e) dg_acc += double(p.dh0[st + std::size_t(j) * Dv + e]) * p.s0[st + std::size_t(j) * Dv + e];

  for (int step = 0; step < T; ++step) {
    const int t = reverse ? T - 1 - step : step;
    const int tp = reverse ? t + 1 : t - 1;  // the token of the pending update
    const bool has_prev = tp >= 0 && tp < T;
    float col1 = c1, col2 = 0.0f, colA = 1.0f;
    if (kPass == Pass::r1) col2 = j_ok ? p.s * val(p.dO, t, j) : 0.0f;
    if (kPass == Pass::r2) {
      col1 = has_prev && j_ok ? -key(p.k, tp, j) : 0.0f;
      col2 = j_ok ? p.s * key(p.q, t, j) : 0.0f;
    }
    if (kPass == Pass::f2) col2 = j_ok ? beta[t] * key(p.k, t, j) : 0.0f;
    const int td = reverse ? t + 1 : t;  // the decay applied in this step
    if (transposed) colA = j_ok ? decay(td, 0) : 1.0f;  // S^T, G^T: a factor per column (rows: per row below)
    float y[kSums] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = wy + m * R;
      if (i >= Dr) continue;
      float r = S[m];
      switch (kPass) {
        case Pass::forward:
        case Pass::f1:
          if (has_prev) r = fmaf(key(p.k, tp, i), col1, r);
          r *= decay(t, i);
          y[0] = fmaf(key(p.k, t, i), r, y[0]);
          if (kPass == Pass::forward) {
            y[1] = fmaf(key(p.q, t, i), r, y[1]);
            y[3] = fmaf(key(p.q, t, i), key(p.k, t, i), y[3]);
          }
          break;
        case Pass::r1:
          if (has_prev) r = fmaf(key(p.k, tp, i), col1, r);
          r *= decay(td, i);
          r = fmaf(key(p.q, t, i), col2, r);
          y[2] = fmaf(key(p.k, t, i), r, y[2]);
          break;
        case Pass::r2:
          if (has_prev) r = fmaf(beta[tp] * p.dw[val_at(tp, i)], col1, r);
          r *= colA;
          r = fmaf(val(p.dO, t, i), col2, r);
          y[2] = fmaf(p.E[val_at(t, i)], r, y[2]);
          break;
        case Pass::f2:
          r *= colA;
          y[0] = fmaf(beta[t] * p.dw[val_at(t, i)], r, y[0]);
          r = fmaf(p.E[val_at(t, i)], col2, r);
          y[2] = fmaf(val(p.dO, t, i), r, y[2]);
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
    const bool writer = wy == 0;
    switch (kPass) {
      case Pass::forward: {
        const float w = beta[t] * (val(p.v, t, j) - total[0]);
        c1 = w;
        if (writer) p.o[val_at(t, j)] = p.s * (total[1] + total[3] * w);
        break;
      }
      case Pass::f1: {
        const float ev = val(p.v, t, j) - total[0];
        c1 = beta[t] * ev;
        if (writer) p.E[val_at(t, j)] = ev;
        break;
      }
      case Pass::r1:
        c1 = -beta[t] * total[2];
        if (writer) p.dw[val_at(t, j)] = total[2];
        break;
      case Pass::r2:
        if (writer) p.dk[part_at(t, j)] = beta[t] * total[2];
        break;
      case Pass::f2: {
        if (!writer) break;  // dk is read and written here: by one warp only
        const std::size_t e = part_at(t, j);
        const float dq = p.s * total[2], read = -total[0], write = p.dk[e];
        p.dq[e] = dq;
        p.dk[e] = write + read;
        if (p.vector_gates) p.dg[slice.gate + std::size_t(t) * Dk + j] = float(dg_acc);
        if (p.scalar_gates) p.dg_channels[e] = float(dg_acc);
        const float qj = key(p.q, t, j), kj = key(p.k, t, j);
        dg_acc -= double(qj) * dq - double(kj) * write + double(kj) * read;
        break;
      }
    }
  }

  // The last pending update: forward, hT = S'_{T-1} + k_{T-1} w^T; R1, dh0 = A_0 (G_0 - k_0 (beta dw_0)^T).
  const bool last_update = kPass == Pass::forward || kPass == Pass::r1;
  if (!last_update || !j_ok) return;
  const int t = kPass == Pass::forward ? T - 1 : 0;
  float* out = kPass == Pass::forward ? p.hT : p.dh0;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    if (i >= Dr) continue;
    float r = fmaf(key(p.k, t, i), c1, S[m]);
    if (kPass == Pass::r1) r *= decay(0, i);
    out[st + std::size_t(i) * Dv + j] = r;
  }
}

// dbeta_t = dw_t . e_t, dv_t = beta_t dw_t (dw arrives in dv's storage); scalar gates: dg_t summed
// over the key channels. One thread per (batch x value head, token): the same rows whatever the
// packing.
__global__ void delta_finish_kernel(float* dv, const float* E, const float* beta, float* dbeta, const float* dg_channels,
                                    float* dg, int Dk, int Dv, long tokens) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= tokens) return;
  const std::size_t r = std::size_t(n) * Dv;
  float db = 0.0f;
  for (int d = 0; d < Dv; ++d) {
    db = fmaf(dv[r + d], E[r + d], db);
    dv[r + d] *= beta[n];
  }
  dbeta[n] = db;
  if (!dg_channels) return;
  double sum = 0.0;
  for (int d = 0; d < Dk; ++d) sum += dg_channels[std::size_t(n) * Dk + d];
  dg[n] = float(sum);
}

void launch(const Problem& pr, const ScanShape& shape, Dtype dtype, DeltaParams params, cudaStream_t stream) {
  if (auto why = scan_unsupported(pr)) throw RuntimeFailure(*why);
  params.shape = shape;
  params.retnet = pr.decay == Decay::retnet;
  params.vector_gates = pr.decay == Decay::vector;
  params.scalar_gates = pr.decay == Decay::scalar;
  params.s = float(attention_scale(pr.dim));
  const bool transposed = params.pass == Pass::r2 || params.pass == Pass::f2;
  const int rows = transposed ? pr.value_dim() : pr.dim, cols = transposed ? pr.dim : pr.value_dim();
  const int R = std::max(1, (rows + kRows - 1) / kRows);
  const dim3 block(kCols, unsigned(R));
  const dim3 grid(unsigned(pr.slices()), unsigned((cols + kCols - 1) / kCols));
  const std::size_t shared = sizeof(float) * 2 * std::size_t(R) * kSums * kCols;
  const auto go = [&](auto pass) {
    if (dtype == Dtype::f32)
      delta_scan_kernel<float, decltype(pass)::value><<<grid, block, shared, stream>>>(params);
    else
      delta_scan_kernel<__nv_bfloat16, decltype(pass)::value><<<grid, block, shared, stream>>>(params);
  };
  switch (params.pass) {
    case Pass::forward: go(std::integral_constant<Pass, Pass::forward>{}); break;
    case Pass::f1: go(std::integral_constant<Pass, Pass::f1>{}); break;
    case Pass::r1: go(std::integral_constant<Pass, Pass::r1>{}); break;
    case Pass::r2: go(std::integral_constant<Pass, Pass::r2>{}); break;
    case Pass::f2: go(std::integral_constant<Pass, Pass::f2>{}); break;
  }
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::size_t scan_delta_forward_workspace_bytes(const Problem& p) { return scan_shape_bytes(p); }

std::size_t scan_delta_backward_workspace_bytes(const Problem& p) {
  const std::size_t keys_per_value_head = p.heads_total() * std::size_t(p.seq) * std::size_t(p.dim);
  return scan_shape_bytes(p) +
         (p.value_elems() + (p.decay == Decay::scalar ? keys_per_value_head : 0) + 2 * key_part_elems(p)) *
             sizeof(float);
}

void scan_delta_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator,
                        cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  DeltaParams f{};
  f.pass = Pass::forward;
  f.q = a.q, f.k = a.k, f.v = a.v, f.beta = a.beta, f.g = gated(p.decay) ? a.g : nullptr, f.s0 = a.h0;
  f.o = a.o, f.hT = a.hT;
  launch(p, shape, dtype, f, stream);
}

void scan_delta_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                         cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  const bool grouped = p.group() > 1;
  Workspace<float> E(allocator, p.value_elems());
  Workspace<float> channels(allocator, p.decay == Decay::scalar ? p.heads_total() * std::size_t(p.seq) * p.dim : 0);
  // With grouped heads F2 reads back the dk that R2 wrote for the same value head, and dg needs
  // each value head's dq and dk: both go to key parts, summed at the end (cuda/scan_shapes.cuh).
  Workspace<float> dq_parts(allocator, key_part_elems(p)), dk_parts(allocator, key_part_elems(p));
  DeltaParams b{};
  b.q = a.q, b.k = a.k, b.v = a.v, b.dO = a.dO, b.beta = a.beta, b.g = gated(p.decay) ? a.g : nullptr;
  b.E = E.data(), b.dw = a.dv, b.dh0 = a.dh0, b.dg = a.dg, b.dg_channels = channels.data();
  b.dq = grouped ? dq_parts.data() : a.dq;
  b.dk = grouped ? dk_parts.data() : a.dk;
  for (Pass pass : {Pass::f1, Pass::r1, Pass::r2, Pass::f2}) {
    b.pass = pass;
    b.s0 = pass == Pass::r1 || pass == Pass::r2 ? a.dhT : a.h0;
    launch(p, shape, dtype, b, stream);
  }
  const long tokens = long(p.heads_total()) * p.seq;
  const unsigned threads = 128;
  delta_finish_kernel<<<unsigned((tokens + threads - 1) / threads), threads, 0, stream>>>(
      a.dv, E.data(), a.beta, a.dbeta, p.decay == Decay::scalar ? channels.data() : nullptr, a.dg, p.dim,
      p.value_dim(), tokens);
  LATTN_CUDA_CHECK_LAUNCH();
  if (grouped) {
    sum_group_keys(p, dq_parts.data(), a.dq, stream);
    sum_group_keys(p, dk_parts.data(), a.dk, stream);
  }
}

}  // namespace lattn::cuda

// The diagonal-plus-low-rank rule's recurrent (scan) form on the GPU (`rule: dplr`, docs/spec.md
// section 1f), forward and backward, every decay, float32 or bf16 token inputs (q, k, v, dO; a, b
// and the gates are float32), float32 state and accumulation, every shape of section 1c
// (cuda/scan_shapes.cuh). Reference: kernels/linear_attention/reference_dplr.cpp; tests:
// tests/cuda_emulation/test_scan_dplr.cpp (the emulation against the float64 reference) and
// the emulated backend's table (tests/cuda_emulation/test_backend.cpp). The same passes as the
// CPU scan (cpu/scan/scan_dplr.cpp), with u_t = S_{t-1}^T b_t and z_t = G_t^T a_t:
//   forward (S):       S_t = A_t S_{t-1} + a_t u_t^T + k_t v_t^T; readouts o_t = s S_t^T q_t and
//                      u_{t+1} = S_t^T b_{t+1} (a first readout u_0 = h0^T b_0)    -> o, hT
//   F1 (S):            the forward without o                                      -> scratch U (u_t)
//   R1 (G, reverse):   G_t = A_{t+1} G_{t+1} + b_{t+1} z_{t+1}^T + s q_t do_t^T; readouts dv_t = G_t^T k_t
//                      and z_t                                                    -> dv, scratch Z, dh0
//   R2 (G^T, reverse): the same transposed, row operands z_{t+1} (Z) and do_t; readouts
//                      dk_t = G_t v_t, da_t = G_t u_t                             -> dk, da
//   F2 (S^T):          S^T_t = S^T_{t-1} A_t + u_t a_t^T + v_t k_t^T; readouts db_t = S_{t-1} z_t
//                      (before the step) and dq_t = s S_t do_t; dg by the identity of section 1f,
//                      dg_t = rowsum(h0 . dh0) - sum_{tau < t} (q.dq - a.da - k.dk)_tau - sum_{tau <= t} (b.db)_tau
//                      per key channel, in double, from the value head's own dq and dk  -> dq, db, dg
//   finish:            scalar gates' dg summed over the key channels
// The transition is not invertible, so the backward does not run the forward backwards: F1 keeps
// u_t of every token (a value tensor), which with Z is all R2 and F2 need of the other passes.
// Tiling as the delta rule's scan (cuda/scan_delta.cu): one block per ((sequence, value head) pair,
// slice of 32 state columns), lane x owning column x, warp y the rows y, y + R, ... (up to 16 a
// thread, in registers: rows and columns up to kScanMaxDim). The forward's and R1's next token needs
// this token's readout summed over every row (u_{t+1}, z_t), so the warps' partial sums go through
// shared memory once per token, double-buffered: one barrier per token, after which every warp
// holds each column's sums (warp 0 writes them). Scratch: U and Z (B x H x T x Dv floats each), for
// scalar gates dg's per-channel sums (B x H x T x Dk), with grouped heads dq and dk per value head
// (F2 reads back R2's dk of its own value head, and dg's running sums need both; sum_group_keys
// adds them last), and a packed problem's document boundaries.
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
constexpr int kSums = 2;   // readouts per token summed over the warps
static_assert(kScanMaxDim <= kRows * 16, "at most 16 warps of 16 rows");

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

enum class Pass { forward, f1, r1, r2, f2 };

struct DplrParams {
  Pass pass;
  const void *q, *k, *v, *dO;  // token inputs in the case's dtype
  const float *a, *b, *g, *s0;  // s0: h0 or dhT (row-major Dk x Dv), read transposed for S^T and G^T
  // dq, dk, dg_channels: per value head (the key parts; dq and dk themselves for group 1).
  float *o, *hT, *U, *Z, *dq, *dk, *dv, *da, *db, *dh0, *dg, *dg_channels;
  ScanShape shape;
  bool retnet, vector_gates, scalar_gates;
  float s;
};

template <class In>
__device__ __forceinline__ float at(const void* base, std::size_t i) {
  return to_float(static_cast<const In*>(base)[i]);
}

// One instance per pass (kPass), as the delta rule's scan: each keeps the loads of its own branch
// only, within the 128 registers a thread that 16 warps (rows up to kScanMaxDim) leave it.
template <class In, Pass kPass>
__global__ void __launch_bounds__(kCols * 16, 1) dplr_scan_kernel(DplrParams p) {
  extern __shared__ float sums[];  // 2 x R x kSums x kCols
  const ScanSlice slice = scan_slice(p.shape, int(blockIdx.x));
  const int Dk = p.shape.Dk, Dv = p.shape.Dv, T = slice.seq, R = int(blockDim.y);
  constexpr bool transposed = kPass == Pass::r2 || kPass == Pass::f2;  // rows: value channels
  constexpr bool reverse = kPass == Pass::r1 || kPass == Pass::r2;
  const int Dr = transposed ? Dv : Dk, Dc = transposed ? Dk : Dv;  // state rows, columns
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int j = int(blockIdx.y) * kCols + lane;
  const bool j_ok = j < Dc, writer = wy == 0;
  const std::size_t st = slice.state;
  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - slice.head)) : 1.0f;
  const float* a = p.a + slice.key_part;  // a, b, da, db: [B][H][T][Dk], the key parts' layout
  const float* b = p.b + slice.key_part;
  const float* g = p.g ? p.g + slice.gate : nullptr;

  // A_t for row i (S, G) or for this lane's column (S^T, G^T).
  auto decay = [&](int t, int i) -> float {
    if (p.scalar_gates) return expf(g[t]);
    if (p.vector_gates) return expf(g[std::size_t(t) * Dk + (transposed ? j : i)]);
    return gamma;
  };
  // Token t's channel i of a key tensor (q, k: the pair's q/k head) or of a value tensor (v, dO).
  auto key = [&](const void* x, int t, int i) { return at<In>(x, slice.key + std::size_t(t) * Dk + i); };
  auto val = [&](const void* x, int t, int i) { return at<In>(x, slice.value + std::size_t(t) * Dv + i); };
  // Where token t's channel i lives in the float value tensors (o, U, Z, dv) and the key parts
  // (dq, dk, a, b, da, db).
  auto val_at = [&](int t, int i) { return slice.value + std::size_t(t) * Dv + i; };
  auto part_at = [&](int t, int i) { return slice.key_part + std::size_t(t) * Dk + i; };

  float S[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    S[m] = (j_ok && i < Dr) ? p.s0[st + (transposed ? std::size_t(j) * Dv + i : std::size_t(i) * Dv + j)] : 0.0f;
  }
  int phase = 0;  // the reductions so far: which half of `sums` the next one writes
  // The column sums of y over every warp's rows (each thread gets its lane's). The half written
  // here is written again two reductions later, after the barrier of the one between.
  auto reduce = [&](float (&y)[kSums], float (&total)[kSums]) {
    float* buf = sums + (phase++ & 1) * R * kSums * kCols;
#pragma unroll
    for (int x = 0; x < kSums; ++x) buf[(wy * kSums + x) * kCols + lane] = y[x];
    __syncthreads();
#pragma unroll
    for (int x = 0; x < kSums; ++x) total[x] = 0.0f;
    for (int w = 0; w < R; ++w)
#pragma unroll
      for (int x = 0; x < kSums; ++x) total[x] += buf[(w * kSums + x) * kCols + lane];
  };

  float carry = 0.0f;  // forward, F1: u_t; R1: z_{t+1}
  if ((kPass == Pass::forward || kPass == Pass::f1) && T > 0) {  // u_0 = h0^T b_0
    float y[kSums] = {0.0f, 0.0f}, total[kSums];
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = wy + m * R;
      if (i < Dr) y[0] = fmaf(b[i], S[m], y[0]);
    }
    reduce(y, total);
    carry = total[0];
  }
  double dg_acc = 0.0;  // F2: dg's running sum of this lane's key channel
  if (kPass == Pass::f2 && g && j_ok && writer)
    for (int e = 0; e < Dv; ++e)
      dg_acc += double(p.dh0[st + std::size_t(j) * Dv + e]) * p.s0[st + std::size_t(j) * Dv + e];

  for (int step = 0; step < T; ++step) {
    const int t = reverse ? T - 1 - step : step;
    const bool carried = t + 1 < T;  // R1, R2: G_{t+1} exists (else the state holds dhT)
    // The step's column operands (this lane's column) and, for S^T and G^T, the column's decay.
    float c1 = 0.0f, c2 = 0.0f, colA = 1.0f;
    switch (kPass) {
      case Pass::forward:
      case Pass::f1:
        c1 = carry;  // u_t
        c2 = j_ok ? val(p.v, t, j) : 0.0f;
        break;
      case Pass::r1:
        c1 = carry;  // z_{t+1}
        c2 = j_ok ? p.s * val(p.dO, t, j) : 0.0f;
        break;
      case Pass::r2:
        c1 = j_ok && carried ? b[std::size_t(t + 1) * Dk + j] : 0.0f;
        c2 = j_ok ? p.s * key(p.q, t, j) : 0.0f;
        colA = j_ok && carried ? decay(t + 1, 0) : 1.0f;
        break;
      case Pass::f2:
        c1 = j_ok ? a[std::size_t(t) * Dk + j] : 0.0f;
        c2 = j_ok ? key(p.k, t, j) : 0.0f;
        colA = j_ok ? decay(t, 0) : 1.0f;
        break;
    }
    float y[kSums] = {0.0f, 0.0f}, total[kSums];
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = wy + m * R;
      if (i >= Dr) continue;
      float r = S[m];
      switch (kPass) {
        case Pass::forward:
        case Pass::f1: {
          const std::size_t e = std::size_t(t) * Dk + i;
          r = fmaf(key(p.k, t, i), c2, fmaf(a[e], c1, r * decay(t, i)));
          if (kPass == Pass::forward) y[0] = fmaf(key(p.q, t, i), r, y[0]);
          if (carried) y[1] = fmaf(b[e + Dk], r, y[1]);
          break;
        }
        case Pass::r1: {
          const std::size_t e = std::size_t(t) * Dk + i;
          if (carried) r = fmaf(b[e + Dk], c1, r * decay(t + 1, i));
          r = fmaf(key(p.q, t, i), c2, r);
          y[0] = fmaf(key(p.k, t, i), r, y[0]);
          y[1] = fmaf(a[e], r, y[1]);
          break;
        }
        case Pass::r2:
          if (carried) r = fmaf(p.Z[val_at(t + 1, i)], c1, r * colA);
          r = fmaf(val(p.dO, t, i), c2, r);
          y[0] = fmaf(val(p.v, t, i), r, y[0]);
          y[1] = fmaf(p.U[val_at(t, i)], r, y[1]);
          break;
        case Pass::f2:
          y[0] = fmaf(p.Z[val_at(t, i)], r, y[0]);
          r = fmaf(val(p.v, t, i), c2, fmaf(p.U[val_at(t, i)], c1, r * colA));
          y[1] = fmaf(val(p.dO, t, i), r, y[1]);
          break;
      }
      S[m] = r;
    }
    reduce(y, total);
    if (!j_ok) continue;
    switch (kPass) {
      case Pass::forward:
        carry = total[1];
        if (writer) p.o[val_at(t, j)] = p.s * total[0];
        break;
      case Pass::f1:
        if (writer) p.U[val_at(t, j)] = carry;
        carry = total[1];
        break;
      case Pass::r1:
        carry = total[1];
        if (writer) {
          p.dv[val_at(t, j)] = total[0];
          p.Z[val_at(t, j)] = total[1];
        }
        break;
      case Pass::r2:
        if (writer) {
          p.dk[part_at(t, j)] = total[0];
          p.da[part_at(t, j)] = total[1];
        }
        break;
      case Pass::f2: {
        if (!writer) break;
        const std::size_t e = part_at(t, j);
        const float db = total[0], dq = p.s * total[1];
        p.db[e] = db;
        p.dq[e] = dq;
        if (!g) break;
        dg_acc -= double(b[std::size_t(t) * Dk + j]) * db;
        if (p.vector_gates) p.dg[slice.gate + std::size_t(t) * Dk + j] = float(dg_acc);
        if (p.scalar_gates) p.dg_channels[e] = float(dg_acc);
        dg_acc -= double(key(p.q, t, j)) * dq - double(a[std::size_t(t) * Dk + j]) * p.da[e] -
                  double(key(p.k, t, j)) * p.dk[e];
        break;
      }
    }
  }

  // The forward's hT = S_{T-1}; R1's dh0 = A_0 G_0 + b_0 z_0^T (dhT itself for an empty document).
  if ((kPass != Pass::forward && kPass != Pass::r1) || !j_ok) return;
  float* out = kPass == Pass::forward ? p.hT : p.dh0;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = wy + m * R;
    if (i >= Dr) continue;
    float r = S[m];
    if (kPass == Pass::r1 && T > 0) r = fmaf(b[i], carry, r * decay(0, i));
    out[st + std::size_t(i) * Dv + j] = r;
  }
}

// Scalar gates: dg_t of each (batch x value head, token) summed over its key channels' sums.
__global__ void dplr_dg_sum_kernel(const float* dg_channels, float* dg, int Dk, long tokens) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= tokens) return;
  double sum = 0.0;
  for (int d = 0; d < Dk; ++d) sum += dg_channels[std::size_t(n) * Dk + d];
  dg[n] = float(sum);
}

void launch(const Problem& pr, const ScanShape& shape, Dtype dtype, DplrParams params, cudaStream_t stream) {
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
      dplr_scan_kernel<float, decltype(pass)::value><<<grid, block, shared, stream>>>(params);
    else
      dplr_scan_kernel<__nv_bfloat16, decltype(pass)::value><<<grid, block, shared, stream>>>(params);
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

std::size_t keys_per_value_head(const Problem& p) { return p.heads_total() * std::size_t(p.seq) * std::size_t(p.dim); }

}  // namespace

std::size_t scan_dplr_forward_workspace_bytes(const Problem& p) { return scan_shape_bytes(p); }

std::size_t scan_dplr_backward_workspace_bytes(const Problem& p) {
  return scan_shape_bytes(p) +
         (2 * p.value_elems() + (p.decay == Decay::scalar ? keys_per_value_head(p) : 0) + 2 * key_part_elems(p)) *
             sizeof(float);
}

void scan_dplr_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator,
                       cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  DplrParams f{};
  f.pass = Pass::forward;
  f.q = a.q, f.k = a.k, f.v = a.v, f.a = a.a, f.b = a.b, f.g = gated(p.decay) ? a.g : nullptr, f.s0 = a.h0;
  f.o = a.o, f.hT = a.hT;
  launch(p, shape, dtype, f, stream);
}

void scan_dplr_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                        cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  const bool grouped = p.group() > 1;
  Workspace<float> U(allocator, p.value_elems()), Z(allocator, p.value_elems());
  Workspace<float> channels(allocator, p.decay == Decay::scalar ? keys_per_value_head(p) : 0);
  // With grouped heads F2 reads back the dk that R2 wrote for the same value head, and dg needs
  // each value head's dq and dk: both go to key parts, summed at the end (cuda/scan_shapes.cuh).
  Workspace<float> dq_parts(allocator, key_part_elems(p)), dk_parts(allocator, key_part_elems(p));
  DplrParams b{};
  b.q = a.q, b.k = a.k, b.v = a.v, b.dO = a.dO, b.a = a.a, b.b = a.b, b.g = gated(p.decay) ? a.g : nullptr;
  b.U = U.data(), b.Z = Z.data(), b.dv = a.dv, b.da = a.da, b.db = a.db, b.dh0 = a.dh0;
  b.dg = gated(p.decay) ? a.dg : nullptr, b.dg_channels = channels.data();
  b.dq = grouped ? dq_parts.data() : a.dq;
  b.dk = grouped ? dk_parts.data() : a.dk;
  for (Pass pass : {Pass::f1, Pass::r1, Pass::r2, Pass::f2}) {
    b.pass = pass;
    b.s0 = pass == Pass::r1 || pass == Pass::r2 ? a.dhT : a.h0;
    launch(p, shape, dtype, b, stream);
  }
  if (p.decay == Decay::scalar) {
    const long tokens = long(p.heads_total()) * p.seq;
    const unsigned threads = 128;
    dplr_dg_sum_kernel<<<unsigned((tokens + threads - 1) / threads), threads, 0, stream>>>(channels.data(), a.dg,
                                                                                          p.dim, tokens);
    LATTN_CUDA_CHECK_LAUNCH();
  }
  if (grouped) {
    sum_group_keys(p, dq_parts.data(), a.dq, stream);
    sum_group_keys(p, dk_parts.data(), a.dk, stream);
  }
}

}  // namespace lattn::cuda

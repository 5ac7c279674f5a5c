// The recurrent (scan) form on the GPU, forward and backward, float32 or bf16 token inputs,
// float32 state and accumulation, every shape of docs/spec.md section 1c (cuda/scan_shapes.cuh).
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
// state is stored.) S and G are Dk x Dv (rows: key channels); the dq and dk passes hold S^T and G^T,
// Dv x Dk. With grouped heads dq and dk are written per value head and summed per q/k head by
// sum_group_keys (cuda/scan_shapes.cuh says why), the backward's only scratch beside a packed
// problem's document boundaries.
//
// Gated decays (docs/spec.md section 1b): decay_t is exp(g) of the step's token (forward, dq) or of the
// token after it (dv, dk: G_t = A_{t+1} G_{t+1} + s q_t do_t^T, and the first reverse step, having
// no token after it, does not decay), a scalar per token or, for vector gates, per key channel:
// the rows of S and G (forward, dv: a factor per state row), the columns of S^T and G^T (dq, dk: a
// factor per lane). The gates are float32 whatever the dtype; exp(g) of a stage's tokens is staged
// with them. dh0 = A_0 G_0. dg comes from a second kernel after the passes:
//   dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q_tau . dq_tau - k_tau . dk_tau)
// (per key channel for vector gates, summed over the channels for scalar gates; docs/kernels.md;
// dq and dk of the value head, before any group sum), one block per (sequence, value head), one
// thread per key channel, summed in double.
//
// RWKV-6's bonus form (docs/spec.md section 1g; vector gates): o_t = s (S_{t-1} + diag(u) k_t v_t^T)^T q_t.
// Every pass then reads its state before the step's write, and the write's own term with u on the
// key channels: out_t = beta (S + u r_t c_t^T)^T x_t, then S <- decay_t S + alpha r_t c_t^T (u per
// state row in the forward and dv passes, per column in the transposed dq and dk passes). So the
// forward gives o_t, dq_t = s S_{t-1} do_t + c_t (u * k_t) with c_t = s (do_t . v_t), and the
// reverse passes G_t = A_{t+1} G_{t+1} + s q_{t+1} do_{t+1}^T before token t's write: each reverse
// step decays by its own token's gate (no shift, the first step too), dv_t = G_t^T k_t + s (q_t .
// (u * k_t)) do_t, dk_t = G_t v_t + c_t (u * q_t), and the last write leaves dh0 = A_0 G_0 + s q_0
// do_0^T itself. dg's kernel takes c_t's term of section 1g's identity,
//   dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q_tau . dq_tau - k_tau . dk_tau) - q_t . dq_t + c_t (q_t . u . k_t),
// and each (sequence, value head)'s du, sum_t c_t (q_t . k_t), which a last kernel sums over the
// sequences of each head (partials, not atomics: du is deterministic).
//
// Tiling: one block per ((sequence, value head) pair, slice of 32 state columns). Lane x of every
// warp owns column x of the slice; warp y owns state rows y, y + R, y + 2R, ... (R = ceil(rows /
// 16) warps, so at most 16 rows per thread, held in registers: rows, Dk or Dv by the pass, are at
// most kScanMaxDim). Tokens are staged 8 at a time in shared memory (r, x: all row entries; c: the
// slice's 32); each thread updates its rows and keeps its partial dot product with x per token;
// the R partials of a column are summed after the stage. Two barriers per 8 tokens; the state
// never leaves registers. A packed document is one pair's tokens: its blocks start from its h0
// and stop at its end.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/scan_shapes.cuh"

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
  // The pass runs on S^T or G^T: rows are value channels, columns key channels (the vector gates'),
  // row, query and s0 are read transposed, and `out` is key-shaped (the key parts).
  bool transposed;
  float* out;
  float* final_state;
  bool final_times_gamma;
  ScanShape shape;
  bool retnet;
  bool reverse;
  float alpha, beta;
  const float* gate;  // log-gates [B][H][T] or [B][H][T][Dk] (null: no gate)
  GateScale gate_scale;
  int gate_shift;  // 0: the step's own token's gate; 1: the next token's (reverse passes)
  const float* bonus;  // the bonus form's u [H][Dk] (this file's header); null otherwise
};

// Launch bounds of 16 warps (rows up to kScanMaxDim): at most 128 registers a thread, so that the
// widest block fits a multiprocessor's 64K. Bonus: the bonus form (p.bonus set), an instance of its
// own so that the plain passes keep their registers.
template <class T, bool Bonus>
__global__ void __launch_bounds__(kCols * 16, 1) scan_kernel(ScanParams p) {
  extern __shared__ float smem[];
  const ScanSlice slice = scan_slice(p.shape, int(blockIdx.x));
  const int Dk = p.shape.Dk, Dv = p.shape.Dv, tokens = slice.seq;
  const int Dr = p.transposed ? Dv : Dk, Dc = p.transposed ? Dk : Dv;  // state rows, columns
  const int R = int(blockDim.y);
  const GateScale gs = p.gate ? p.gate_scale : GateScale::none;
  const int gw = gs == GateScale::none ? 0 : p.shape.gate_width;  // gates per token
  float* r_stage = smem;                          // kStage x Dr
  float* x_stage = r_stage + kStage * Dr;         // kStage x Dr
  float* c_stage = x_stage + kStage * Dr;         // kStage x kCols
  float* partial = c_stage + kStage * kCols;      // R x kStage x kCols
  float* a_stage = partial + R * kStage * kCols;  // kStage x gw: exp(g) (gated passes only)
  float* u_rows = a_stage + kStage * gw;          // Dr: u of the state rows (the bonus form's forward, dv)

  const float gamma = p.retnet ? float(1.0 - ldexp(1.0, -5 - slice.head)) : 1.0f;
  const int lane = int(threadIdx.x), wy = int(threadIdx.y);
  const int tid = wy * kCols + lane, nthreads = R * kCols;
  const int col0 = int(blockIdx.y) * kCols;
  const int j = col0 + lane;
  const bool j_ok = j < Dc;
  // Rows and queries are key-shaped (k, q) or, transposed, value-shaped (v, dO); columns the other.
  const std::size_t row_at = p.transposed ? slice.value : slice.key, col_at = p.transposed ? slice.key : slice.value;
  const std::size_t out_at = p.transposed ? slice.key_part : slice.value;
  const std::size_t st = slice.state;
  const T* row = static_cast<const T*>(p.row) + row_at;
  const T* colv = static_cast<const T*>(p.col) + col_at;
  const T* query = static_cast<const T*>(p.query) + row_at;
  const float* gates = p.gate ? p.gate + slice.gate : nullptr;
  // The bonus's u: per state row (staged; read after the first stage's barrier), or this lane's
  // column's in the transposed passes.
  float u_column = 0.0f;
  if (Bonus) {
    const float* u = p.bonus + std::size_t(slice.head) * Dk;
    if (p.transposed)
      u_column = j_ok ? u[j] : 0.0f;
    else
      for (int i = tid; i < Dr; i += nthreads) u_rows[i] = u[i];
  }

  float S[kRowsPerThread];
#pragma unroll
  for (int m = 0; m < kRowsPerThread; ++m) {
    const int i = wy + m * R;
    // s0 is Dk x Dv, row-major.
    S[m] = (j_ok && i < Dr) ? p.s0[st + (p.transposed ? std::size_t(j) * Dv + i : std::size_t(i) * Dv + j)] : 0.0f;
  }

  for (int u0 = 0; u0 < tokens; u0 += kStage) {
    const int nu = min(kStage, tokens - u0);
    for (int e = tid; e < nu * Dr; e += nthreads) {
      const int u = e / Dr, i = e - u * Dr;
      const int t = p.reverse ? tokens - 1 - (u0 + u) : u0 + u;
      r_stage[u * Dr + i] = to_float(row[std::size_t(t) * Dr + i]);
      x_stage[u * Dr + i] = to_float(query[std::size_t(t) * Dr + i]);
    }
    for (int e = tid; e < nu * gw; e += nthreads) {
      const int u = e / gw, i = e - u * gw;
      const int t = p.reverse ? tokens - 1 - (u0 + u) : u0 + u;
      const int tg = t + p.gate_shift;  // past the last token: the first reverse step, no decay
      a_stage[u * gw + i] = tg < tokens ? expf(gates[std::size_t(tg) * gw + i]) : 1.0f;
    }
    for (int e = tid; e < nu * kCols; e += nthreads) {
      const int u = e / kCols, jj = e - u * kCols;
      const int t = p.reverse ? tokens - 1 - (u0 + u) : u0 + u;
      c_stage[u * kCols + jj] = col0 + jj < Dc ? to_float(colv[std::size_t(t) * Dc + col0 + jj]) : 0.0f;
    }
    __syncthreads();

    for (int u = 0; u < nu; ++u) {
      const float* a = a_stage + u * gw;
      float decay = (p.reverse && u0 + u == 0) ? 1.0f : gamma;
      if (gs == GateScale::scalar) decay = a[0];
      if (gs == GateScale::columns) decay = j_ok ? a[j] : 1.0f;
      const float c = p.alpha * c_stage[u * kCols + lane];
      const float* r = r_stage + u * Dr;
      const float* x = x_stage + u * Dr;
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < kRowsPerThread; ++m) {
        const int i = wy + m * R;
        if (i < Dr) {
          if (Bonus) {  // read S before the write, with the write's u term
            const float u = p.transposed ? u_column : u_rows[i];
            acc = fmaf(fmaf(u * r[i], c, S[m]), x[i], acc);
            S[m] = fmaf(gs == GateScale::rows ? a[i] : decay, S[m], r[i] * c);
          } else {
            S[m] = fmaf(gs == GateScale::rows ? a[i] : decay, S[m], r[i] * c);
            acc = fmaf(S[m], x[i], acc);
          }
        }
      }
      partial[(wy * kStage + u) * kCols + lane] = acc;
    }
    __syncthreads();

    // The next stage's loads overwrite r, x, c and a only; `partial` is written again only after
    // the next stage's barrier, by which time every thread has finished this reduction.
    for (int e = tid; e < nu * kCols; e += nthreads) {
      const int u = e / kCols, jj = e - u * kCols;
      if (col0 + jj >= Dc) continue;
      float sum = 0.0f;
      for (int y = 0; y < R; ++y) sum += partial[(y * kStage + u) * kCols + jj];
      const int t = p.reverse ? tokens - 1 - (u0 + u) : u0 + u;
      p.out[out_at + std::size_t(t) * Dc + col0 + jj] = p.beta * sum;
    }
  }

  if (p.final_state) {  // forward and dv passes: S and G are Dk x Dv, as the states are stored
    const float scale = p.final_times_gamma ? gamma : 1.0f;
#pragma unroll
    for (int m = 0; m < kRowsPerThread; ++m) {
      const int i = wy + m * R;
      // dh0 = A_0 G_0: with gates, A_0's factor for row i.
      const float a0 = !gates || !p.final_times_gamma ? 1.0f : expf(gates[gs == GateScale::scalar ? 0 : i]);
      if (j_ok && i < Dr) p.final_state[st + std::size_t(i) * Dv + j] = scale * a0 * S[m];
    }
  }
}

struct GateGradParams {
  const void* q;
  const void* k;
  const float* dq;  // per value head (the key parts, or dq itself for group 1)
  const float* dk;
  const float* h0;
  const float* dh0;
  float* dg;
  ScanShape shape;
  bool scalar;
  // The bonus form (vector gates): u, v and dO for c_t = s (do_t . v_t), and du per (sequence,
  // value head) pair ([N][H][Dk]); u null otherwise.
  const float* u = nullptr;
  const void* v = nullptr;
  const void* dO = nullptr;
  float s = 0.0f;
  float* du_parts = nullptr;
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

// dg of one (sequence, value head) pair (this file's header): thread d owns key channel d; scalar
// gates sum the channels. The bonus form's threads cover Dv too (c_t's sum over the value channels).
template <class T>
__global__ void gate_grad_kernel(GateGradParams p) {
  extern __shared__ double sums[];
  const ScanSlice slice = scan_slice(p.shape, int(blockIdx.x));
  const int Dk = p.shape.Dk, Dv = p.shape.Dv, d = int(threadIdx.x);
  const bool on = d < Dk;
  const std::size_t st = slice.state;
  const T* q = static_cast<const T*>(p.q) + slice.key;
  const T* k = static_cast<const T*>(p.k) + slice.key;
  const float* dq = p.dq + slice.key_part;
  const float* dk = p.dk + slice.key_part;
  float* dg = p.dg + slice.gate;
  double acc = 0.0;  // rowsum(dh0 . h0), then minus each token's terms
  if (on)
    for (int j = 0; j < Dv; ++j) acc += double(p.dh0[st + std::size_t(d) * Dv + j]) * p.h0[st + std::size_t(d) * Dv + j];
  if (p.scalar) acc = block_sum(sums, acc);
  if (p.u) {  // the bonus form: vector gates
    const float* u = p.u + std::size_t(slice.head) * Dk;
    const T* v = static_cast<const T*>(p.v) + slice.value;
    const T* dO = static_cast<const T*>(p.dO) + slice.value;
    const double ud = on ? u[d] : 0.0;
    double du = 0.0;
    for (int t = 0; t < slice.seq; ++t) {
      double dot = 0.0;
      for (int j = d; j < Dv; j += int(blockDim.x))
        dot += double(to_float(v[std::size_t(t) * Dv + j])) * to_float(dO[std::size_t(t) * Dv + j]);
      const double c = p.s * block_sum(sums, dot);
      if (!on) continue;
      const std::size_t e = std::size_t(t) * Dk + d;
      const double qe = to_float(q[e]), ke = to_float(k[e]), qdq = qe * dq[e];
      dg[e] = float(acc - qdq + c * qe * ud * ke);
      acc -= qdq - ke * dk[e];
      du += c * qe * ke;
    }
    if (on) p.du_parts[std::size_t(blockIdx.x) * Dk + d] = float(du);
    return;
  }
  for (int t = 0; t < slice.seq; ++t) {
    const std::size_t e = std::size_t(t) * Dk + d;
    const double term = on ? double(to_float(q[e])) * dq[e] - double(to_float(k[e])) * dk[e] : 0.0;
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

// du[h] = sum over the sequences n of parts[n][h] (each [Dk]).
__global__ void sum_bonus_grads_kernel(const float* parts, float* du, int sequences, int heads, int Dk) {
  for (int e = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x); e < heads * Dk; e += int(gridDim.x * blockDim.x)) {
    float sum = 0.0f;
    for (int n = 0; n < sequences; ++n) sum += parts[std::size_t(n) * heads * Dk + e];
    du[e] = sum;
  }
}

// out[b][hk] = sum over the group's value heads of parts[b][hk G + m] (each [T][Dk]).
__global__ void sum_group_keys_kernel(const float* parts, float* out, std::size_t head_elems, int group, long total) {
  for (long n = long(blockIdx.x) * blockDim.x + threadIdx.x; n < total; n += long(gridDim.x) * blockDim.x) {
    const std::size_t qk_head = std::size_t(n) / head_elems, r = std::size_t(n) % head_elems;
    const float* from = parts + qk_head * group * head_elems + r;
    float sum = 0.0f;
    for (int m = 0; m < group; ++m) sum += from[std::size_t(m) * head_elems];
    out[n] = sum;
  }
}

// transposed: the pass runs on S^T or G^T, whose columns are the key channels a vector gate scales.
// bonus: the bonus form's u (Problem::bonus).
void launch(const Problem& pr, const ScanShape& shape, Dtype dtype, ScanParams params, cudaStream_t stream,
            const float* g = nullptr, int gate_shift = 0, const float* bonus = nullptr) {
  if (auto why = scan_unsupported(pr)) throw RuntimeFailure(*why);
  params.shape = shape;
  params.retnet = pr.decay == Decay::retnet;
  params.gate = gated(pr.decay) ? g : nullptr;
  params.gate_scale = pr.decay == Decay::scalar ? GateScale::scalar
                      : pr.decay == Decay::vector ? (params.transposed ? GateScale::columns : GateScale::rows)
                                                  : GateScale::none;
  params.gate_shift = pr.bonus ? 0 : gate_shift;  // the bonus form's reverse steps decay by their own gate
  params.bonus = pr.bonus ? bonus : nullptr;
  const int rows = params.transposed ? pr.value_dim() : pr.dim, cols = params.transposed ? pr.dim : pr.value_dim();
  const int R = std::max(1, (rows + kRowsPerThread - 1) / kRowsPerThread);
  const dim3 block(kCols, unsigned(R));
  const dim3 grid(unsigned(pr.slices()), unsigned((cols + kCols - 1) / kCols));
  const std::size_t shared =
      sizeof(float) * (2 * kStage * std::size_t(rows) + kStage * kCols + std::size_t(R) * kStage * kCols +
                       (params.gate ? kStage * std::size_t(pr.gate_width()) : 0) +
                       (params.bonus && !params.transposed ? std::size_t(rows) : 0));
  if (params.bonus && dtype == Dtype::f32)
    scan_kernel<float, true><<<grid, block, shared, stream>>>(params);
  else if (params.bonus)
    scan_kernel<__nv_bfloat16, true><<<grid, block, shared, stream>>>(params);
  else if (dtype == Dtype::f32)
    scan_kernel<float, false><<<grid, block, shared, stream>>>(params);
  else
    scan_kernel<__nv_bfloat16, false><<<grid, block, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::optional<std::string> scan_unsupported(const Problem& p) {
  // Either dim can be the state's rows (the transposed passes hold S^T and G^T): both are limited.
  if (std::max(p.dim, p.value_dim()) > kScanMaxDim)
    return "the CUDA scan keeps the state in registers and handles dim and dim_v <= " + std::to_string(kScanMaxDim) +
           ", not dim " + std::to_string(p.dim) + ", dim_v " + std::to_string(p.value_dim());
  return std::nullopt;
}

void sum_group_keys(const Problem& p, const float* parts, float* out, cudaStream_t stream) {
  const long total = long(p.key_elems());
  const unsigned threads = 256, blocks = unsigned(std::min<long>((total + threads - 1) / threads, 4096));
  sum_group_keys_kernel<<<blocks, threads, 0, stream>>>(parts, out, std::size_t(p.seq) * p.dim, p.group(), total);
  LATTN_CUDA_CHECK_LAUNCH();
}

std::size_t scan_additive_forward_workspace_bytes(const Problem& p) { return scan_shape_bytes(p); }

std::size_t scan_additive_backward_workspace_bytes(const Problem& p) {
  return scan_shape_bytes(p) + (gated(p.decay) ? 2 : 1) * key_part_elems(p) * sizeof(float) +
         (p.bonus ? p.slices() * std::size_t(p.dim) * sizeof(float) : 0);
}

void scan_additive_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator,
                           cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  const float s = float(attention_scale(p.dim));
  ScanParams f{};
  f.row = a.k, f.col = a.v, f.query = a.q, f.s0 = a.h0, f.transposed = false;
  f.out = a.o, f.final_state = a.hT, f.final_times_gamma = false;
  f.reverse = false, f.alpha = 1.0f, f.beta = s;
  launch(p, shape, dtype, f, stream, a.g, 0, a.u);
}

// With grouped heads, dq and dk go to key parts and are summed into dq and dk (cuda/scan_shapes.cuh):
// ungated, dq's parts are summed before the dk pass reuses them; gated, dg reads both first.
void scan_additive_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                            cudaStream_t stream) {
  Workspace<int> cu(allocator, scan_shape_bytes(p) / sizeof(int));
  const ScanShape shape = scan_shape(p, cu, stream);
  const bool grouped = p.group() > 1, gates = gated(p.decay);
  Workspace<float> dq_parts(allocator, key_part_elems(p));
  Workspace<float> dk_parts(allocator, gates ? key_part_elems(p) : 0);
  float* dq_out = grouped ? dq_parts.data() : a.dq;
  float* dk_out = grouped ? (gates ? dk_parts.data() : dq_parts.data()) : a.dk;
  const float s = float(attention_scale(p.dim));
  ScanParams dq{};  // forward recurrence of S^T: dq_t = s S_t dO_t
  dq.row = a.v, dq.col = a.k, dq.query = a.dO, dq.s0 = a.h0, dq.transposed = true;
  dq.out = dq_out, dq.final_state = nullptr, dq.reverse = false, dq.alpha = 1.0f, dq.beta = s;
  launch(p, shape, dtype, dq, stream, a.g, 0, a.u);
  if (grouped && !gates) sum_group_keys(p, dq_out, a.dq, stream);

  ScanParams dv{};  // reverse recurrence of G: dv_t = G_t^T k_t, dh0 = gamma G_1
  dv.row = a.q, dv.col = a.dO, dv.query = a.k, dv.s0 = a.dhT, dv.transposed = false;
  dv.out = a.dv, dv.final_state = a.dh0, dv.final_times_gamma = !p.bonus;  // the bonus form's last write is dh0
  dv.reverse = true, dv.alpha = s, dv.beta = 1.0f;
  launch(p, shape, dtype, dv, stream, a.g, 1, a.u);

  ScanParams dk{};  // reverse recurrence of G^T: dk_t = G_t v_t
  dk.row = a.dO, dk.col = a.q, dk.query = a.v, dk.s0 = a.dhT, dk.transposed = true;
  dk.out = dk_out, dk.final_state = nullptr, dk.reverse = true, dk.alpha = s, dk.beta = 1.0f;
  launch(p, shape, dtype, dk, stream, a.g, 1, a.u);

  Workspace<float> du_parts(allocator, p.bonus ? p.slices() * std::size_t(p.dim) : 0);
  if (gates) {
    GateGradParams gg{a.q, a.k, dq_out, dk_out, a.h0, a.dh0, a.dg, shape, p.decay == Decay::scalar};
    if (p.bonus) gg.u = a.u, gg.v = a.v, gg.dO = a.dO, gg.s = s, gg.du_parts = du_parts.data();
    unsigned threads = 32;
    while (threads < unsigned(p.bonus ? std::max(p.dim, p.value_dim()) : p.dim)) threads *= 2;
    const std::size_t shared = sizeof(double) * threads;
    if (dtype == Dtype::f32)
      gate_grad_kernel<float><<<unsigned(p.slices()), threads, shared, stream>>>(gg);
    else
      gate_grad_kernel<__nv_bfloat16><<<unsigned(p.slices()), threads, shared, stream>>>(gg);
    LATTN_CUDA_CHECK_LAUNCH();
  }
  if (p.bonus) {
    const int elems = p.heads * p.dim;
    sum_bonus_grads_kernel<<<unsigned((elems + 255) / 256), 256, 0, stream>>>(du_parts.data(), a.du, p.sequences(),
                                                                           p.heads, p.dim);
    LATTN_CUDA_CHECK_LAUNCH();
  }
  if (grouped && gates) sum_group_keys(p, dq_out, a.dq, stream);
  if (grouped) sum_group_keys(p, dk_out, a.dk, stream);
}

}  // namespace lattn::cuda

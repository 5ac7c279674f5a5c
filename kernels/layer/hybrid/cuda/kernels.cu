// The layout changes and element-wise parts of the CUDA layer (docs/spec.md section 2); the projections
// are cuBLAS products and the branches are the scan / chunked and sliding-window kernels, composed
// in cuda_backend.cpp. Every kernel here is memory-bound and simple on purpose: one thread per
// element for the layout changes, one warp per (batch, head, token) row for the norm and gate,
// and fixed-order reductions (double accumulators, no atomics) for dg and dbeta, so that a run
// gives the same bits every time.
#include <cuda_runtime.h>

#include "kernels/cuda/check.hpp"
#include "kernels/layer/hybrid/cuda/kernels.hpp"

namespace lattn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

struct Shape {
  int B, T, H, Dh, M;
};

Shape shape_of(const LayerProblem& p) {
  return {p.linear.batch, p.linear.seq, p.linear.heads, p.linear.dim, int(p.model_dim())};
}

unsigned blocks_for(long elements) {
  const long blocks = (elements + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// heads[b][h][t][j] = rows[(b*T + t) * ld + h*Dh + j]
__global__ void rows_to_heads_kernel(const float* __restrict__ rows, int ld, float* __restrict__ heads, Shape s) {
  const long total = long(s.B) * s.H * s.T * s.Dh;
  for (long e = blockIdx.x * long(blockDim.x) + threadIdx.x; e < total; e += long(gridDim.x) * blockDim.x) {
    const int j = int(e % s.Dh);
    long rest = e / s.Dh;
    const int t = int(rest % s.T);
    rest /= s.T;
    const int h = int(rest % s.H), b = int(rest / s.H);
    heads[e] = rows[(long(b) * s.T + t) * ld + long(h) * s.Dh + j];
  }
}

// rows[(b*T + t) * M + h*Dh + j] = a[b][h][t][j] + c[b][h][t][j] (c optional); walks the rows
// layout so that the writes are coalesced.
__global__ void heads_to_rows_kernel(const float* __restrict__ a, const float* __restrict__ c, float* __restrict__ rows,
                                     Shape s) {
  const long total = long(s.B) * s.T * s.M;
  for (long e = blockIdx.x * long(blockDim.x) + threadIdx.x; e < total; e += long(gridDim.x) * blockDim.x) {
    const int col = int(e % s.M);
    const long row = e / s.M;
    const int t = int(row % s.T), b = int(row / s.T), h = col / s.Dh, j = col % s.Dh;
    const long src = ((long(b) * s.H + h) * s.T + t) * s.Dh + j;
    rows[e] = c ? a[src] + c[src] : a[src];
  }
}

__device__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// The (batch, head, token) row of this thread's warp: `row` = bh * T + t indexes the per-head
// layout's rows, `out_row` is the offset of the head's slice of that token's row in [B][T][M].
struct WarpRow {
  long row, out_row;
  int lane, h;
};

// False for the warps past the last row (the whole warp alike, so its shuffles stay full).
__device__ bool warp_row(const Shape& s, WarpRow& w) {
  w.row = blockIdx.x * long(kWarpsPerBlock) + threadIdx.x / 32;
  w.lane = threadIdx.x % 32;
  if (w.row >= long(s.B) * s.H * s.T) return false;
  const int t = int(w.row % s.T), bh = int(w.row / s.T), b = bh / s.H;
  w.h = bh % s.H;
  w.out_row = (long(b) * s.T + t) * s.M + long(w.h) * s.Dh;
  return true;
}

// One warp per row (bh, t): Y = sig RMSNorm(Lin) g + (1 - sig) Swa into [B][T][M]; r kept when asked.
__global__ void norm_gate_forward_kernel(const float* __restrict__ g, const float* __restrict__ beta,
                                         const float* __restrict__ lin, const float* __restrict__ swa,
                                         float* __restrict__ y, float* __restrict__ rinv, Shape s) {
  WarpRow w;
  if (!warp_row(s, w)) return;
  const long row = w.row;
  const int lane = w.lane, h = w.h;
  const float* l = lin + row * s.Dh;
  const float* sw = swa + row * s.Dh;
  float squares = 0.0f;
  for (int j = lane; j < s.Dh; j += 32) squares += l[j] * l[j];
  squares = warp_sum(squares);
  const float r = 1.0f / sqrtf(squares / float(s.Dh) + float(kRmsNormEps));
  if (rinv && lane == 0) rinv[row] = r;
  const float sig = sigmoid(beta[h]), a = sig * r, c = 1.0f - sig;
  float* out = y + w.out_row;
  const float* gh = g + long(h) * s.Dh;
  for (int j = lane; j < s.Dh; j += 32) out[j] = a * gh[j] * l[j] + c * sw[j];
}

// One warp per row: with u = g . sig . dY_h,
//   dLin = r u - (r^3 / Dh) (u . Lin) Lin,  dSwa = (1 - sig) dY_h,
// and the row's terms of the parameter gradients: dg_terms (rows layout) = sig r dY_h . Lin, and
// gate[row] = sum_j dY_h (r g Lin - Swa) (dbeta = sig (1 - sig) times its sum over b, t).
__global__ void norm_gate_backward_kernel(const float* __restrict__ g, const float* __restrict__ beta,
                                          const float* __restrict__ lin, const float* __restrict__ swa,
                                          const float* __restrict__ rinv, const float* __restrict__ dy,
                                          float* __restrict__ dlin, float* __restrict__ dswa,
                                          float* __restrict__ dg_terms, float* __restrict__ gate, Shape s) {
  WarpRow w;
  if (!warp_row(s, w)) return;
  const long row = w.row, out_row = w.out_row;
  const int lane = w.lane, h = w.h;
  const float* l = lin + row * s.Dh;
  const float* sw = swa + row * s.Dh;
  const float* d = dy + out_row;
  const float* gh = g + long(h) * s.Dh;
  const float r = rinv[row], sig = sigmoid(beta[h]);
  float gate_sum = 0.0f, ul = 0.0f;
  for (int j = lane; j < s.Dh; j += 32) {
    gate_sum += d[j] * (r * gh[j] * l[j] - sw[j]);
    ul += gh[j] * d[j] * l[j];
  }
  gate_sum = warp_sum(gate_sum);
  ul = warp_sum(ul) * sig;
  const float c = r * r * r / float(s.Dh) * ul, sr = sig * r;
  for (int j = lane; j < s.Dh; j += 32) {
    dlin[row * s.Dh + j] = sr * gh[j] * d[j] - c * l[j];
    dswa[row * s.Dh + j] = (1.0f - sig) * d[j];
    dg_terms[out_row + j] = sr * d[j] * l[j];
  }
  if (lane == 0) gate[row] = gate_sum;
}

// out[col] = sum over rows of in[row][col]: 32 columns per block, 8 row lanes each summing every
// 8th row in double, then the lanes in a fixed order.
__global__ void column_sums_kernel(const float* __restrict__ in, long rows, int cols, float* __restrict__ out) {
  __shared__ double part[8][32];
  const int c = threadIdx.x % 32, lane = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + c;
  double sum = 0;
  if (col < cols)
    for (long r = lane; r < rows; r += 8) sum += double(in[r * cols + col]);
  part[lane][c] = sum;
  __syncthreads();
  if (lane == 0 && col < cols) {
    double total = 0;
    for (int k = 0; k < 8; ++k) total += part[k][c];
    out[col] = float(total);
  }
}

// dbeta[h] = sig (1 - sig) sum over b, t of gate[(b*H + h)*T + t]; one block per head.
__global__ void beta_grads_kernel(const float* __restrict__ beta, const float* __restrict__ gate,
                                  float* __restrict__ dbeta, Shape s) {
  __shared__ double part[kThreads];
  const int h = blockIdx.x;
  double sum = 0;
  const long per_head = long(s.B) * s.T;
  for (long i = threadIdx.x; i < per_head; i += kThreads) {
    const long b = i / s.T, t = i % s.T;
    sum += double(gate[(b * s.H + h) * s.T + t]);
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double sig = 1.0 / (1.0 + exp(-double(beta[h])));
    dbeta[h] = float(part[0] * sig * (1.0 - sig));
  }
}

unsigned row_warp_blocks(const Shape& s) {
  const long rows = long(s.B) * s.H * s.T;
  return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void layer_rows_to_heads(const LayerProblem& p, const float* rows, int ld, float* heads, cudaStream_t stream) {
  const Shape s = shape_of(p);
  const long total = long(s.B) * s.H * s.T * s.Dh;
  if (total == 0) return;
  rows_to_heads_kernel<<<blocks_for(total), kThreads, 0, stream>>>(rows, ld, heads, s);
  LATTN_CUDA_CHECK_LAUNCH();
}

void layer_heads_to_rows(const LayerProblem& p, const float* a, const float* c, float* rows, cudaStream_t stream) {
  const Shape s = shape_of(p);
  const long total = long(s.B) * s.T * s.M;
  if (total == 0) return;
  heads_to_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(a, c, rows, s);
  LATTN_CUDA_CHECK_LAUNCH();
}

void layer_norm_gate_forward(const LayerProblem& p, const float* g, const float* beta, const float* lin,
                             const float* swa, float* y, float* rinv, cudaStream_t stream) {
  const Shape s = shape_of(p);
  if (long(s.B) * s.H * s.T == 0) return;
  norm_gate_forward_kernel<<<row_warp_blocks(s), kThreads, 0, stream>>>(g, beta, lin, swa, y, rinv, s);
  LATTN_CUDA_CHECK_LAUNCH();
}

void layer_norm_gate_backward(const LayerProblem& p, const LayerGateBackward& a, cudaStream_t stream) {
  const Shape s = shape_of(p);
  const long rows = long(s.B) * s.H * s.T;
  if (rows == 0) return;
  norm_gate_backward_kernel<<<row_warp_blocks(s), kThreads, 0, stream>>>(a.g, a.beta, a.lin, a.swa, a.rinv, a.dy,
                                                                         a.dlin, a.dswa, a.dg_terms, a.gate, s);
  LATTN_CUDA_CHECK_LAUNCH();
  column_sums_kernel<<<unsigned((s.M + 31) / 32), kThreads, 0, stream>>>(a.dg_terms, long(s.B) * s.T, s.M, a.dg);
  LATTN_CUDA_CHECK_LAUNCH();
  beta_grads_kernel<<<unsigned(s.H), kThreads, 0, stream>>>(a.beta, a.gate, a.dbeta, s);
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace lattn::cuda

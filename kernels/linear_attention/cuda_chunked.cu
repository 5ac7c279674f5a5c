// The chunkwise-parallel form on the GPU, forward and backward (SPEC section 1), float32 or bf16
// token inputs, float32 state and accumulation; bf16 products run on the tensor cores (WMMA
// 16x16x16, bf16 operands, float32 accumulators), float32 products on the FMA units.
//
// Two kernels cover the four passes. With s = D^-1/2, M the causal decay mask (M[i][j] = gamma^(i-j),
// i >= j), lam_i = gamma^(i+1), gam_j = gamma^(n-1-j), for a chunk of n rows:
//
//   chunk_forward (walks chunks forward, state S' D x D):
//       out_c = s ((A B^T) . M) V' + s diag(lam) A S'         S' <- gamma^n S' + (diag(gam) B)^T V'
//     forward: A = Q, B = K, V' = V, S'0 = h0                 -> O, and hT = the last S'
//     dq:      A = dO, B = V, V' = K, S'0 = h0^T (S' = S^T)   -> dQ = s (dO V^T . M) K + s diag(lam) dO S^T
//   chunk_backward (walks chunks backward, state dS' D x D):
//       out_c = s ((A B^T) . M)^T G' + diag(gam) B dS'        dS' <- gamma^n dS' + s (diag(lam) A)^T G'
//     dv:      A = Q, B = K, G' = dO, dS'0 = dhT              -> dV, and dh0 = dS' after the first chunk
//     dk:      A = dO, B = V, G' = Q, dS'0 = dhT^T (dS'=dS^T)  -> dK = dA^T Q + diag(gam) V dS^T
// The dq and dk passes are the forward and dv passes on swapped operands (the algebra is in
// docs/cuda.md), so the chunk states entering each chunk are recomputed by the dq pass rather than
// stored: no scratch memory, at the price of one more pass over the inputs.
//
// Tiling: one block (8 warps) per (batch x head, slice of 64 state columns); the block walks the
// chunks one after another and keeps its D x 64 state slice in shared memory (float32, plus a
// bf16 copy as the tensor-core operand). Per chunk it stages the operand every output row needs
// (B in the forward kernel, A in the backward one) for the whole chunk and the slice of V' / G',
// then stages the other operand RB rows at a time (RB <= 64, chosen so two blocks fit on one
// multiprocessor where possible),
// forms the masked score tile RB x n in shared memory, and produces RB output rows; then it
// updates the state slice. Every tile is padded to multiples of 16 with zeros, so ragged last
// chunks and any D need no special paths. Warps own 16 x 16 output tiles; tiles above the causal
// diagonal are skipped. A column slice recomputes the score tile the other slices compute too:
// with D = 128 that doubles the score products but halves the state each block holds.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <map>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/linear_attention/cuda.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/warp_tiles.cuh"

namespace lattn::cuda {
namespace {

constexpr int kSlice = 64;      // state columns per block
constexpr int kScratchLd = 20;  // a warp's 16 x 16 float scratch tile, padded rows

// Where each buffer lives in dynamic shared memory (bytes), for element size `es` (4 or 2).
struct Layout {
  int Cp, Dp, RB;
  int ldD, ldJ, ldC, ldJf;  // leading dimensions (elements) of the D-wide, slice-wide, chunk-wide, state tiles
  std::size_t full, rows, slice, scores, state, state_op, scratch, powers, total;
};

__host__ __device__ inline Layout make_layout(int C, int D, int RB, int es) {
  Layout L{};
  L.Cp = round16(C);
  L.Dp = round16(D);
  L.RB = RB;
  const int pad = 16 / es;  // one 16-byte access of padding per row against bank conflicts
  L.ldD = L.Dp + pad;
  L.ldJ = kSlice + pad;
  L.ldC = L.Cp + pad;
  L.ldJf = kSlice + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at = align128(at + bytes);
    return here;
  };
  L.full = take(std::size_t(L.Cp) * L.ldD * es);
  L.rows = take(std::size_t(RB) * L.ldD * es);
  L.slice = take(std::size_t(L.Cp) * L.ldJ * es);
  L.scores = take(std::size_t(RB) * L.ldC * es);
  L.state = take(std::size_t(L.Dp) * L.ldJf * 4);
  L.state_op = es == 4 ? L.state : take(std::size_t(L.Dp) * L.ldJ * es);  // float32: the state itself
  L.scratch = take(std::size_t(kWarps) * 16 * kScratchLd * 4);
  L.powers = take(std::size_t(L.Cp + 1) * 4);
  L.total = at;
  return L;
}

struct ChunkParams {
  const void* a;  // see the header comment for the roles of a, b, x in each pass
  const void* b;
  const void* x;
  const float* s0;
  bool s0_transposed;
  float* out;
  float* final_state;
  int T, D, H, C, RB;
  bool retnet;
  float scale;
};

// Shared setup of both kernels: gamma powers and the state slice.
template <class T>
__device__ void setup(const ChunkParams& p, const Layout& L, unsigned char* smem, int col0, int jw) {
  float* pw = reinterpret_cast<float*>(smem + L.powers);
  float* Sf = reinterpret_cast<float*>(smem + L.state);
  T* St = reinterpret_cast<T*>(smem + L.state_op);
  const int head = int(blockIdx.x) % p.H;
  const double gamma = p.retnet ? double(float(1.0 - ldexp(1.0, -5 - head))) : 1.0;
  for (int k = int(threadIdx.x); k <= L.Cp; k += kThreads) pw[k] = float(pow(gamma, double(k)));
  const std::size_t st = std::size_t(blockIdx.x) * p.D * p.D;
  for (int e = int(threadIdx.x); e < L.Dp * jw; e += kThreads) {
    const int r = e / jw, c = e - r * jw, col = col0 + c;
    float v = 0.0f;
    if (r < p.D && col < p.D)
      v = p.s0_transposed ? p.s0[st + std::size_t(col) * p.D + r] : p.s0[st + std::size_t(r) * p.D + col];
    Sf[r * L.ldJf + c] = v;
    if (!std::is_same<T, float>::value) St[r * L.ldJ + c] = from_float<T>(v);
  }
}

// The state tile (ti, tj) was just stored in float32; refresh its bf16 copy (a no-op for float32).
template <class T>
__device__ void refresh_operand(const Layout& L, const float* Sf, T* St, int ti, int tj) {
  if (std::is_same<T, float>::value) return;
  __syncwarp();
  for (int e = int(threadIdx.x) & 31; e < 256; e += 32) {
    const int r = ti * 16 + (e >> 4), c = tj * 16 + (e & 15);
    St[r * L.ldJ + c] = from_float<T>(Sf[r * L.ldJf + c]);
  }
}

template <class T>
__device__ void write_final(const ChunkParams& p, const Layout& L, const float* Sf, int col0, int jw) {
  if (!p.final_state) return;
  const std::size_t st = std::size_t(blockIdx.x) * p.D * p.D;
  for (int e = int(threadIdx.x); e < p.D * jw; e += kThreads) {
    const int r = e / jw, c = e - r * jw;
    if (col0 + c < p.D) p.final_state[st + std::size_t(r) * p.D + col0 + c] = Sf[r * L.ldJf + c];
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) chunk_forward_kernel(ChunkParams p) {
  using Ops = Tiles<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(p.C, p.D, p.RB, int(sizeof(T)));
  T* Bf = reinterpret_cast<T*>(smem + L.full);     // B, the whole chunk (Cp x Dp)
  T* Ar = reinterpret_cast<T*>(smem + L.rows);     // A, RB rows at a time
  T* Xs = reinterpret_cast<T*>(smem + L.slice);    // V' slice (Cp x 64)
  T* Ps = reinterpret_cast<T*>(smem + L.scores);   // masked scores (RB x Cp)
  float* Sf = reinterpret_cast<float*>(smem + L.state);
  T* St = reinterpret_cast<T*>(smem + L.state_op);
  const float* pw = reinterpret_cast<const float*>(smem + L.powers);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kScratchLd;

  const int D = p.D;
  const int col0 = int(blockIdx.y) * kSlice, jw = min(kSlice, L.Dp - col0), ntj = jw / 16, ntd = L.Dp / 16;
  const std::size_t tok = std::size_t(blockIdx.x) * p.T * D;
  const T* A = static_cast<const T*>(p.a) + tok;
  const T* B = static_cast<const T*>(p.b) + tok;
  const T* X = static_cast<const T*>(p.x) + tok;
  float* out = p.out + tok;
  setup<T>(p, L, smem, col0, jw);
  __syncthreads();

  for (int c0 = 0; c0 < p.T; c0 += p.C) {
    const int n = min(p.C, p.T - c0), nt = (n + 15) / 16;
    stage(Bf, L.ldD, B + std::size_t(c0) * D, D, 0, n, nt * 16, L.Dp);
    stage(Xs, L.ldJ, X + std::size_t(c0) * D, D, col0, n, nt * 16, jw);
    for (int r0 = 0; r0 < nt * 16; r0 += L.RB) {
      const int rows = min(L.RB, nt * 16 - r0), nti = rows / 16, g0 = r0 / 16;
      stage(Ar, L.ldD, A + std::size_t(c0 + r0) * D, D, 0, n - r0, rows, L.Dp);
      __syncthreads();
      // Scores: Ps[i][j] = s gamma^(i-j) (a_i . b_j) for j <= i < n, else 0; tiles above the diagonal skipped.
      for (int t = warp; t < nti * (g0 + nti); t += kWarps) {
        const int ti = t / (g0 + nti), tj = t - ti * (g0 + nti);
        if (tj > g0 + ti) continue;
        typename Ops::Acc acc;
        Ops::zero(acc);
        for (int k = 0; k < ntd; ++k)
          Ops::template mma<false, true>(acc, Ar + ti * 16 * L.ldD + k * 16, L.ldD, Bf + tj * 16 * L.ldD + k * 16, L.ldD);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, i = r0 + ti * 16 + r, j = tj * 16 + c;
          const float v = (j <= i && i < n) ? scratch[r * kScratchLd + c] * pw[i - j] * p.scale : 0.0f;
          Ps[(ti * 16 + r) * L.ldC + j] = from_float<T>(v);
        }
        __syncwarp();
      }
      __syncthreads();
      // Output rows: s diag(lam) A S' + Ps X.
      for (int t = warp; t < nti * ntj; t += kWarps) {
        const int ti = t / ntj, tj = t - ti * ntj;
        typename Ops::Acc acc;
        Ops::zero(acc);
        for (int k = 0; k < ntd; ++k)
          Ops::template mma<false, false>(acc, Ar + ti * 16 * L.ldD + k * 16, L.ldD, St + k * 16 * L.ldJ + tj * 16, L.ldJ);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, i = r0 + ti * 16 + r;
          scratch[r * kScratchLd + c] *= p.scale * pw[i + 1];
        }
        __syncwarp();
        Ops::load(acc, scratch, kScratchLd);
        for (int k = 0; k <= g0 + ti; ++k)
          Ops::template mma<false, false>(acc, Ps + ti * 16 * L.ldC + k * 16, L.ldC, Xs + k * 16 * L.ldJ + tj * 16, L.ldJ);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, i = r0 + ti * 16 + r, col = col0 + tj * 16 + c;
          if (i < n && col < D) out[std::size_t(c0 + i) * D + col] = scratch[r * kScratchLd + c];
        }
        __syncwarp();
      }
      __syncthreads();
    }
    // State: S' <- gamma^n S' + (diag(gam) B)^T X.
    for (int e = int(threadIdx.x); e < n * L.Dp; e += kThreads) {
      const int j = e / L.Dp, d = e - j * L.Dp;
      Bf[j * L.ldD + d] = from_float<T>(to_float(Bf[j * L.ldD + d]) * pw[n - 1 - j]);
    }
    for (int e = int(threadIdx.x); e < L.Dp * jw; e += kThreads) {
      const int r = e / jw, c = e - r * jw;
      Sf[r * L.ldJf + c] *= pw[n];
    }
    __syncthreads();
    for (int t = warp; t < ntd * ntj; t += kWarps) {
      const int ti = t / ntj, tj = t - ti * ntj;
      typename Ops::Acc acc;
      Ops::load(acc, Sf + ti * 16 * L.ldJf + tj * 16, L.ldJf);
      for (int k = 0; k < nt; ++k)
        Ops::template mma<true, false>(acc, Bf + k * 16 * L.ldD + ti * 16, L.ldD, Xs + k * 16 * L.ldJ + tj * 16, L.ldJ);
      Ops::store(Sf + ti * 16 * L.ldJf + tj * 16, acc, L.ldJf);
      refresh_operand<T>(L, Sf, St, ti, tj);
    }
    __syncthreads();
  }
  write_final<T>(p, L, Sf, col0, jw);
}

template <class T>
__global__ void __launch_bounds__(kThreads) chunk_backward_kernel(ChunkParams p) {
  using Ops = Tiles<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(p.C, p.D, p.RB, int(sizeof(T)));
  T* Af = reinterpret_cast<T*>(smem + L.full);     // A, the whole chunk
  T* Br = reinterpret_cast<T*>(smem + L.rows);     // B, RB rows at a time (the output rows)
  T* Gs = reinterpret_cast<T*>(smem + L.slice);    // G' slice
  T* Ps = reinterpret_cast<T*>(smem + L.scores);   // transposed masked scores (RB x Cp)
  float* Sf = reinterpret_cast<float*>(smem + L.state);
  T* St = reinterpret_cast<T*>(smem + L.state_op);
  const float* pw = reinterpret_cast<const float*>(smem + L.powers);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kScratchLd;

  const int D = p.D;
  const int col0 = int(blockIdx.y) * kSlice, jw = min(kSlice, L.Dp - col0), ntj = jw / 16, ntd = L.Dp / 16;
  const std::size_t tok = std::size_t(blockIdx.x) * p.T * D;
  const T* A = static_cast<const T*>(p.a) + tok;
  const T* B = static_cast<const T*>(p.b) + tok;
  const T* X = static_cast<const T*>(p.x) + tok;
  float* out = p.out + tok;
  setup<T>(p, L, smem, col0, jw);
  __syncthreads();

  const int chunks = (p.T + p.C - 1) / p.C;
  for (int ch = chunks - 1; ch >= 0; --ch) {
    const int c0 = ch * p.C, n = min(p.C, p.T - c0), nt = (n + 15) / 16;
    stage(Af, L.ldD, A + std::size_t(c0) * D, D, 0, n, nt * 16, L.Dp);
    stage(Gs, L.ldJ, X + std::size_t(c0) * D, D, col0, n, nt * 16, jw);
    for (int r0 = 0; r0 < nt * 16; r0 += L.RB) {
      const int rows = min(L.RB, nt * 16 - r0), nti = rows / 16, g0 = r0 / 16;
      stage(Br, L.ldD, B + std::size_t(c0 + r0) * D, D, 0, n - r0, rows, L.Dp);
      __syncthreads();
      // Ps[j][i] = s gamma^(i-j) (b_j . a_i) for j <= i < n; only tiles at or right of the diagonal.
      for (int t = warp; t < nti * nt; t += kWarps) {
        const int tj = t / nt, ti = t - tj * nt;
        if (ti < g0 + tj) continue;
        typename Ops::Acc acc;
        Ops::zero(acc);
        for (int k = 0; k < ntd; ++k)
          Ops::template mma<false, true>(acc, Br + tj * 16 * L.ldD + k * 16, L.ldD, Af + ti * 16 * L.ldD + k * 16, L.ldD);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, j = r0 + tj * 16 + r, i = ti * 16 + c;
          const float v = (j <= i && i < n) ? scratch[r * kScratchLd + c] * pw[i - j] * p.scale : 0.0f;
          Ps[(tj * 16 + r) * L.ldC + i] = from_float<T>(v);
        }
        __syncwarp();
      }
      __syncthreads();
      // Output rows: diag(gam) B dS' + Ps G'.
      for (int t = warp; t < nti * ntj; t += kWarps) {
        const int tj = t / ntj, tv = t - tj * ntj;
        typename Ops::Acc acc;
        Ops::zero(acc);
        for (int k = 0; k < ntd; ++k)
          Ops::template mma<false, false>(acc, Br + tj * 16 * L.ldD + k * 16, L.ldD, St + k * 16 * L.ldJ + tv * 16, L.ldJ);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, j = r0 + tj * 16 + r;
          scratch[r * kScratchLd + c] *= j < n ? pw[n - 1 - j] : 0.0f;
        }
        __syncwarp();
        Ops::load(acc, scratch, kScratchLd);
        for (int k = g0 + tj; k < nt; ++k)
          Ops::template mma<false, false>(acc, Ps + tj * 16 * L.ldC + k * 16, L.ldC, Gs + k * 16 * L.ldJ + tv * 16, L.ldJ);
        Ops::store(scratch, acc, kScratchLd);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int r = e >> 4, c = e & 15, j = r0 + tj * 16 + r, col = col0 + tv * 16 + c;
          if (j < n && col < D) out[std::size_t(c0 + j) * D + col] = scratch[r * kScratchLd + c];
        }
        __syncwarp();
      }
      __syncthreads();
    }
    // State: dS' <- gamma^n dS' + s (diag(lam) A)^T G'.
    for (int e = int(threadIdx.x); e < n * L.Dp; e += kThreads) {
      const int i = e / L.Dp, d = e - i * L.Dp;
      Af[i * L.ldD + d] = from_float<T>(to_float(Af[i * L.ldD + d]) * p.scale * pw[i + 1]);
    }
    for (int e = int(threadIdx.x); e < L.Dp * jw; e += kThreads) {
      const int r = e / jw, c = e - r * jw;
      Sf[r * L.ldJf + c] *= pw[n];
    }
    __syncthreads();
    for (int t = warp; t < ntd * ntj; t += kWarps) {
      const int ti = t / ntj, tv = t - ti * ntj;
      typename Ops::Acc acc;
      Ops::load(acc, Sf + ti * 16 * L.ldJf + tv * 16, L.ldJf);
      for (int k = 0; k < nt; ++k)
        Ops::template mma<true, false>(acc, Af + k * 16 * L.ldD + ti * 16, L.ldD, Gs + k * 16 * L.ldJ + tv * 16, L.ldJ);
      Ops::store(Sf + ti * 16 * L.ldJf + tv * 16, acc, L.ldJf);
      refresh_operand<T>(L, Sf, St, ti, tv);
    }
    __syncthreads();
  }
  write_final<T>(p, L, Sf, col0, jw);
}

int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }

// The staging height (a multiple of 16 up to 64, at most the padded chunk): the largest with which
// two blocks share a multiprocessor (latency hiding: a block waits at its barriers), else the
// largest that fits at all; 0 if none fits.
int rows_per_block(const Problem& p, Dtype dtype, std::size_t limit) {
  const int Cp = round16(effective_chunk(p));
  const std::size_t half = limit / 2 > 1024 ? limit / 2 - 1024 : 0;  // the runtime keeps 1 KiB per block
  for (std::size_t budget : {half, limit})
    for (int rb = std::min(64, Cp); rb >= 16; rb -= 16)
      if (chunked_shared_bytes(p, dtype, rb) <= budget) return rb;
  return 0;
}

enum class Pass { forward, backward };

void launch(const Problem& pr, Dtype dtype, Pass pass, ChunkParams params, cudaStream_t stream) {
  params.T = pr.seq;
  params.D = pr.dim;
  params.H = pr.heads;
  params.C = effective_chunk(pr);
  params.retnet = pr.decay == Decay::retnet;
  const int device = current_device();
  params.RB = rows_per_block(pr, dtype, max_shared_bytes(device));
  if (params.RB == 0) throw RuntimeFailure("chunked: the tiles do not fit in shared memory");
  const std::size_t shared = chunked_shared_bytes(pr, dtype, params.RB);
  const dim3 grid(unsigned(pr.heads_total()), unsigned((round16(pr.dim) + kSlice - 1) / kSlice));
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (dtype == Dtype::f32)
    pass == Pass::forward ? go(chunk_forward_kernel<float>) : go(chunk_backward_kernel<float>);
  else
    pass == Pass::forward ? go(chunk_forward_kernel<bf16>) : go(chunk_backward_kernel<bf16>);
}

}  // namespace

std::size_t chunked_shared_bytes(const Problem& p, Dtype dtype, int rb) {
  return make_layout(effective_chunk(p), p.dim, rb, element_size(dtype)).total;
}

std::optional<std::string> chunked_unsupported(const Problem& p, Dtype dtype, std::size_t limit) {
  if (rows_per_block(p, dtype, limit) == 0)
    return "the CUDA chunked kernel's tiles for chunk " + std::to_string(effective_chunk(p)) + ", dim " +
           std::to_string(p.dim) + " need " + std::to_string(chunked_shared_bytes(p, dtype, 16)) +
           " bytes of shared memory per block; this device has " + std::to_string(limit);
  return std::nullopt;
}

void chunked_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator&, cudaStream_t stream) {
  ChunkParams f{};
  f.a = a.q, f.b = a.k, f.x = a.v, f.s0 = a.h0, f.s0_transposed = false;
  f.out = a.o, f.final_state = a.hT, f.scale = float(attention_scale(p.dim));
  launch(p, dtype, Pass::forward, f, stream);
}

void chunked_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator&, cudaStream_t stream) {
  const float s = float(attention_scale(p.dim));
  ChunkParams dq{};  // the forward pass on (dO, V, K) with the transposed state
  dq.a = a.dO, dq.b = a.v, dq.x = a.k, dq.s0 = a.h0, dq.s0_transposed = true;
  dq.out = a.dq, dq.final_state = nullptr, dq.scale = s;
  launch(p, dtype, Pass::forward, dq, stream);

  ChunkParams dv{};
  dv.a = a.q, dv.b = a.k, dv.x = a.dO, dv.s0 = a.dhT, dv.s0_transposed = false;
  dv.out = a.dv, dv.final_state = a.dh0, dv.scale = s;
  launch(p, dtype, Pass::backward, dv, stream);

  ChunkParams dk{};  // the dv pass on (dO, V, Q) with the transposed state gradient
  dk.a = a.dO, dk.b = a.v, dk.x = a.q, dk.s0 = a.dhT, dk.s0_transposed = true;
  dk.out = a.dk, dk.final_state = nullptr, dk.scale = s;
  launch(p, dtype, Pass::backward, dk, stream);
}

}  // namespace lattn::cuda

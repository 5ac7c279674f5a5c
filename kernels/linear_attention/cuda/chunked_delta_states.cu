// The delta rule's chunked form on the GPU, its sequential part (docs/kernels.md; cuda/chunked_delta.hpp
// states the recurrences): the state entering every chunk and the pending values V_new = U - W S
// (forward), or the gradient of the state leaving every chunk and the pending values' gradient
// dV_new = dV_local + (K . exp(b_{n-1} - b)) dS (reverse). Per chunk two products, each depending on
// the last: V_new needs the state entering the chunk, the state leaving it needs V_new.
//
// Tiling: one block of 4 warps per (sequence, value head, 32 state columns), grid (sequences, value
// heads, Dv / 32). The block's Dk x 32 share of the state stays in registers for the whole walk
// (warp w holds the row tiles w, w + 4, ...: up to 4 x 2 tiles at Dk 256). Per chunk: the state is
// written, in the token dtype, to its slot and to shared memory (the products' right operand); the
// chunk's rows are staged 32 at a time (W or K, Dk wide, and the block's 32 columns of U or
// dV_local), each output tile of 32 x 32 rows one warp's; then the state decays and takes its
// rank-n update from K's (reverse: Q's and W's) slabs. Nothing is double-buffered: shared memory is
// small (about 32 KiB in bf16 at Dk 128), so that several blocks share a multiprocessor and one
// computes while another waits. Gates: scalar ones per row in double (shared memory), vector ones
// per channel by the thread owning it, summed in double as the rows are walked, every factor an
// exp of a difference <= 0.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.cuh"

namespace lattn::cuda {
namespace {

constexpr int kStateThreads = 128;
constexpr int kStateWarps = 4;
constexpr int kCols = kDeltaStateCols;  // state columns per block
constexpr int kRows = 32;               // rows of a staged slab
constexpr int kMaxChannels = 256;       // Dk: two channels per thread for the vector gates' sums

struct StateLayout {
  int ldK, ldV, ldF;  // Dk-wide slabs, 32-wide tiles (elements), float 32-wide tiles
  std::size_t a, b, x, xf, sop, dsf, vop, bsum, lam, sums, scratch, total;
};

__host__ __device__ constexpr StateLayout state_layout(int Dk, int es, Gates gates, bool reverse) {
  const bool vector = gates == Gates::vector;
  StateLayout L{};
  L.ldK = padded(round16(Dk), es);
  L.ldV = padded(kCols, es);
  L.ldF = kCols + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align128(bytes);
    return here;
  };
  L.a = take(std::size_t(kRows) * L.ldK * es);                // W or K slab (reverse: K, then Q)
  L.b = take(reverse ? std::size_t(kRows) * L.ldK * es : 0);  // reverse: W slab
  L.x = take(std::size_t(kRows) * L.ldV * es);                // U slab (reverse: dO slab)
  L.xf = take(reverse ? std::size_t(kRows) * L.ldF * 4 : 0);  // reverse: dV_local slab
  L.sop = take(std::size_t(round16(Dk)) * L.ldV * es);        // the state, the products' operand
  // reverse with gates in bf16: dS in float32 too, for dg's row sums (float32's operand is dS itself)
  L.dsf = take(reverse && gates != Gates::fixed && es == 2 ? std::size_t(round16(Dk)) * L.ldF * 4 : 0);
  L.vop = take(std::size_t(kDeltaMaxChunk) * L.ldV * es);  // V_new (or -dV_new), for the update
  L.bsum = take(vector ? 0 : std::size_t(kDeltaMaxChunk) * 8);
  L.lam = take(vector ? std::size_t(kMaxChannels) * 4 : 0);
  L.sums = take(vector ? std::size_t(2) * kMaxChannels * 8 : 0);  // each channel's total and running sum
  L.scratch = take(std::size_t(kStateWarps) * 16 * kTileScratchLd * 4);
  L.total = at;
  return L;
}

struct StateParams {
  DeltaShape shape;
  DeltaStateArgs a;
  float scale;
};

// Blocks per multiprocessor the launch bounds promise: what fits at the instance's widest Dk (128
// for up to 2 x 2 state tiles per warp, 256 for 4 x 2; cuda/chunked_delta.cuh), at most 3 for vector
// gates (168 registers: at 128 ptxas spilled their per-channel factors).
template <class T, Gates kG, bool kReverse, int kMaxU>
constexpr int kStateMinBlocks = a100_blocks(state_layout(kMaxU * 64, int(sizeof(T)), kG, kReverse).total,
                                            kG == Gates::vector ? 3 : 4);

template <class T, Gates kG, bool kReverse, int kMaxU>
__global__ void __launch_bounds__(kStateThreads, kStateMinBlocks<T, kG, kReverse, kMaxU>)
    delta_state_kernel(StateParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool kVector = kG == Gates::vector;
  const DeltaShape& s = p.shape;
  const int Dk = s.Dk, Dv = s.Dv, RT = round16(Dk) / 16;
  const StateLayout L = state_layout(Dk, int(sizeof(T)), kG, kReverse);
  T* sa = reinterpret_cast<T*>(smem + L.a);
  T* sb = reinterpret_cast<T*>(smem + L.b);
  T* sx = reinterpret_cast<T*>(smem + L.x);
  float* sxf = reinterpret_cast<float*>(smem + L.xf);
  T* sop = reinterpret_cast<T*>(smem + L.sop);
  float* dsf = reinterpret_cast<float*>(smem + L.dsf);
  T* vop = reinterpret_cast<T*>(smem + L.vop);
  double* bsum = reinterpret_cast<double*>(smem + L.bsum);
  float* lam = reinterpret_cast<float*>(smem + L.lam);
  // The vector gates' sums of channel d (kept by the thread that owns it, d = tid, tid + 128): the
  // chunk's total in total[d], the rows walked so far in run[d] (shared memory, not registers).
  double* total = reinterpret_cast<double*>(smem + L.sums);
  double* run = total + kMaxChannels;
  const int tid = int(threadIdx.x), warp = tid >> 5;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;

  const int seq = int(blockIdx.x), h = int(blockIdx.y), col0 = int(blockIdx.z) * kCols;
  const int first = s.cu_chunks ? s.cu_chunks[seq] : seq * s.chunks_per_seq;
  const int count = s.cu_chunks ? s.cu_chunks[seq + 1] - first : s.chunks_per_seq;
  const std::size_t pair_state = (std::size_t(seq) * s.H + h) * Dk * Dv, dd = std::size_t(Dk) * Dv;
  const double lg = fixed_log_gate(s.retnet, h);

  // The block's Dk x 32 share of S (dS): tile (w + 4u, c) in S[u][c].
  typename Tiles<T>::Acc S[kMaxU][2];
#pragma unroll
  for (int u = 0; u < kMaxU; ++u)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      Tiles<T>::zero(S[u][c]);
      const int rt = warp + 4 * u;
      if (rt >= RT) continue;
      tile_each<true, T>(S[u][c], scratch, [&](int r, int cc, float& x) {
        const int i = rt * 16 + r, j = col0 + c * 16 + cc;
        x = i < Dk && j < Dv ? p.a.s0[pair_state + std::size_t(i) * Dv + j] : 0.0f;
      });
    }
  // The state (or its gradient) into shared memory, and into a chunk's slot when `slot` is given.
  auto publish = [&](T* slot) {
#pragma unroll
    for (int u = 0; u < kMaxU; ++u)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int rt = warp + 4 * u;
        if (rt >= RT) continue;
        tile_each<false, T>(S[u][c], scratch, [&](int r, int cc, float& x) {
          const int i = rt * 16 + r, j = c * 16 + cc;
          sop[i * L.ldV + j] = from_float<T>(x);
          if (kReverse && kG != Gates::fixed && sizeof(T) == 2) dsf[i * L.ldF + j] = x;
          if (slot && i < Dk && col0 + j < Dv) slot[std::size_t(i) * Dv + col0 + j] = from_float<T>(x);
        });
      }
  };
  T* const states = static_cast<T*>(p.a.states);
  const std::size_t slot0 = std::size_t(first) * s.H + h;  // the slot of the sequence's first chunk

  if (kReverse) publish(states + (slot0 + std::size_t(count - 1) * s.H) * dd);
  for (int step = 0; step < count; ++step) {
    const int c = kReverse ? count - 1 - step : step;
    const DeltaChunk ch = delta_chunk(s, first + c, h);
    const int n = ch.n;
    if (!kReverse) publish(states + ch.state * dd);
    // The chunk's gates: scalar b per row; vector, each channel's total over the chunk.
    const float* gv = kVector ? p.a.g + ch.tok * Dk : nullptr;
    if constexpr (!kVector) scalar_gate_sums(bsum, kG == Gates::scalar ? p.a.g + ch.tok : nullptr, lg, n);
    if constexpr (kVector) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = tid + e * kStateThreads;
        double t = 0.0;
        if (d < Dk)
          for (int i = 0; i < n; ++i) t += double(gv[std::size_t(i) * Dk + d]);
        if (d < kMaxChannels) total[d] = t, run[d] = 0.0;
        if (d < kMaxChannels) lam[d] = d < Dk ? expf(float(t)) : 0.0f;
      }
    }
    __syncthreads();  // the state's operand, the gates

    // The pending values (reverse: their gradient), 32 rows at a time.
    const T* A1 = static_cast<const T*>(kReverse ? p.a.k : p.a.w) + (kReverse ? ch.key : ch.tok * Dk);
    for (int r0 = 0; r0 < n; r0 += kRows) {
      const int rows = min(kRows, n - r0);
      stage_async<kStateThreads>(sa, L.ldK, A1 + std::size_t(r0) * Dk, std::size_t(Dk), rows, Dk, kRows, round16(Dk));
      if constexpr (kReverse)
        stage_async<kStateThreads>(sxf, L.ldF, static_cast<const float*>(p.a.values) + (ch.tok + r0) * Dv + col0,
                                   std::size_t(Dv), rows, Dv - col0, kRows, kCols);
      else
        stage_async<kStateThreads>(sx, L.ldV, static_cast<const T*>(p.a.values) + (ch.tok + r0) * Dv + col0,
                                   std::size_t(Dv), rows, Dv - col0, kRows, kCols);
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      if constexpr (kVector && kReverse) {  // K . exp(b_{n-1} - b), the thread's channels
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = tid + e * kStateThreads;
          if (d >= Dk) continue;
          double b = run[d];
          for (int i = 0; i < rows; ++i) {
            b += double(gv[std::size_t(r0 + i) * Dk + d]);
            sa[i * L.ldK + d] = from_float<T>(to_float(sa[i * L.ldK + d]) * expf(float(total[d] - b)));
          }
          run[d] = b;
        }
        __syncthreads();
      }
      {
        const int rt = warp >> 1, ct = warp & 1;  // the warp's 16 x 16 tile of the 32 x 32 output
        typename Tiles<T>::Acc acc;
        Tiles<T>::zero(acc);
        if (rt * 16 < rows) tile_mma<false, false>(acc, sa, L.ldK, sop, L.ldV, rt, ct, 0, RT);
        tile_each<false, T>(acc, scratch, [&](int r, int cc, float& x) {
          const int i = rt * 16 + r, m = r0 + i, j = ct * 16 + cc;
          float out = 0.0f;
          if (i < rows && col0 + j < Dv) {
            if constexpr (kReverse) {
              const float f = kVector ? 1.0f : exp_diff(bsum[n - 1], bsum[m]);
              out = sxf[i * L.ldF + j] + f * x;
              static_cast<float*>(p.a.values)[(ch.tok + m) * Dv + col0 + j] = out;
              out = -out;
            } else {
              out = to_float(sx[i * L.ldV + j]) - x;
              const T rounded = from_float<T>(out);
              static_cast<T*>(p.a.values)[(ch.tok + m) * Dv + col0 + j] = rounded;
              out = kVector ? to_float(rounded) : to_float(rounded) * exp_diff(bsum[n - 1], bsum[m]);
            }
          }
          vop[m * L.ldV + j] = from_float<T>(out);
        });
      }
      __syncthreads();
    }

    // The decay over the chunk.
#pragma unroll
    for (int u = 0; u < kMaxU; ++u)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int rt = warp + 4 * u;
        if (rt >= RT) continue;
        if constexpr (kVector)
          tile_each<true, T>(S[u][cc], scratch, [&](int r, int, float& x) { x *= lam[rt * 16 + r]; });
        else
          scale_tile<T>(S[u][cc], expf(float(bsum[n - 1])));
      }

    // The rank-n update: forward S += (K . exp(b_{n-1} - b))^T V_new (V_new's rows already carry the
    // scalar gates' factor); reverse dS += (Q . exp(b))^T (s dO) + W^T (-dV_new).
    const T* A2 = static_cast<const T*>(kReverse ? p.a.q : p.a.k) + ch.key;
    const T* A3 = static_cast<const T*>(p.a.w) + ch.tok * Dk;
    if constexpr (kVector && kReverse)
      for (int d = tid; d < Dk; d += kStateThreads) run[d] = 0.0;
    for (int r0 = 0; r0 < n; r0 += kRows) {
      const int rows = min(kRows, n - r0), ksteps = (rows + 15) / 16;
      stage_async<kStateThreads>(sa, L.ldK, A2 + std::size_t(r0) * Dk, std::size_t(Dk), rows, Dk, kRows, round16(Dk));
      if constexpr (kReverse) {
        stage_async<kStateThreads>(sb, L.ldK, A3 + std::size_t(r0) * Dk, std::size_t(Dk), rows, Dk, kRows, round16(Dk));
        stage_async<kStateThreads>(sx, L.ldV, static_cast<const T*>(p.a.dO) + (ch.tok + r0) * Dv + col0,
                                   std::size_t(Dv), rows, Dv - col0, kRows, kCols);
      }
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      if constexpr (kVector) {  // forward: K . exp(b_{n-1} - b); reverse: Q . exp(b)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = tid + e * kStateThreads;
          if (d >= Dk) continue;
          double b = run[d];
          for (int i = 0; i < rows; ++i) {
            b += double(gv[std::size_t(r0 + i) * Dk + d]);
            const float f = kReverse ? expf(float(b)) : expf(float(total[d] - b));
            sa[i * L.ldK + d] = from_float<T>(to_float(sa[i * L.ldK + d]) * f);
          }
          run[d] = b;
        }
      }
      if constexpr (kReverse)  // s dO, and for scalar gates times exp(b_i)
        for (int e = tid; e < rows * kCols; e += kStateThreads) {
          const int i = e / kCols, j = e - i * kCols;
          const float f = kVector ? p.scale : p.scale * expf(float(bsum[r0 + i]));
          sx[i * L.ldV + j] = from_float<T>(to_float(sx[i * L.ldV + j]) * f);
        }
      if (kVector || kReverse) __syncthreads();
#pragma unroll
      for (int u = 0; u < kMaxU; ++u)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int rt = warp + 4 * u;
          if (rt >= RT) continue;
          if constexpr (kReverse) {
            tile_mma<true, false>(S[u][cc], sa, L.ldK, sx, L.ldV, rt, cc, 0, ksteps);
            tile_mma<true, false>(S[u][cc], sb, L.ldK, vop + r0 * L.ldV, L.ldV, rt, cc, 0, ksteps);
          } else {
            tile_mma<true, false>(S[u][cc], sa, L.ldK, vop + r0 * L.ldV, L.ldV, rt, cc, 0, ksteps);
          }
        }
      __syncthreads();
    }

    if constexpr (kReverse) {
      // dS is now the gradient of the state entering chunk c: the leaving one of chunk c - 1.
      publish(c > 0 ? states + (ch.state - s.H) * dd : nullptr);
      if (p.a.row_sums) {  // row sums of dS . S over the block's columns, for dg
        __syncthreads();
        const T* S_c = static_cast<const T*>(p.a.forward_states) + ch.state * dd;
        float* out = p.a.row_sums + (std::size_t(blockIdx.z) * std::size_t(s.total_chunks) * s.H + ch.state) * Dk;
        for (int d = tid; d < Dk; d += kStateThreads) {
          float sum = 0.0f;
          for (int j = 0; j < kCols && col0 + j < Dv; ++j)
            sum = fmaf(sizeof(T) == 2 ? dsf[d * L.ldF + j] : to_float(sop[d * L.ldV + j]),
                       to_float(S_c[std::size_t(d) * Dv + col0 + j]), sum);
          out[d] = sum;
        }
      }
      __syncthreads();
    }
  }
  if (p.a.final_state)
#pragma unroll
    for (int u = 0; u < kMaxU; ++u)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int rt = warp + 4 * u;
        if (rt >= RT) continue;
        tile_each<false, T>(S[u][c], scratch, [&](int r, int cc, float& x) {
          const int i = rt * 16 + r, j = col0 + c * 16 + cc;
          if (i < Dk && j < Dv) p.a.final_state[pair_state + std::size_t(i) * Dv + j] = x;
        });
      }
}

template <class T, bool kReverse>
void launch_typed(const DeltaLaunch& l, const StateParams& params, cudaStream_t stream) {
  const Problem& p = *l.problem;
  const std::size_t shared = state_layout(p.dim, int(sizeof(T)), params.shape.gates, kReverse).total;
  const dim3 grid(unsigned(p.sequences()), unsigned(p.heads), unsigned((p.value_dim() + kCols - 1) / kCols));
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kStateThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  const Gates gates = params.shape.gates;
  const bool wide = p.dim > 128;
  if (gates == Gates::vector)
    wide ? go(delta_state_kernel<T, Gates::vector, kReverse, 4>)
         : go(delta_state_kernel<T, Gates::vector, kReverse, 2>);
  else if (gates == Gates::scalar)
    wide ? go(delta_state_kernel<T, Gates::scalar, kReverse, 4>)
         : go(delta_state_kernel<T, Gates::scalar, kReverse, 2>);
  else
    wide ? go(delta_state_kernel<T, Gates::fixed, kReverse, 4>) : go(delta_state_kernel<T, Gates::fixed, kReverse, 2>);
}

}  // namespace

std::size_t delta_state_shared(const Problem& p, Dtype dtype, bool reverse) {
  return state_layout(p.dim, element_size(dtype), gates_of(p), reverse).total;
}

ChunkedKernel delta_state_info(const Problem& p, Dtype dtype, bool reverse) {
  const std::size_t shared = delta_state_shared(p, dtype, reverse);
  const char* name = reverse ? "delta_state_kernel (reverse)" : "delta_state_kernel";
  auto info = [&](auto t, auto rev, auto wide) {
    using T = decltype(t);
    constexpr bool kR = decltype(rev)::value;
    constexpr int kU = decltype(wide)::value;
    auto one = [&](auto kernel, int bounds) { return kernel_info(name, kernel, kStateThreads, shared, bounds); };
    switch (gates_of(p)) {
      case Gates::vector:
        return one(delta_state_kernel<T, Gates::vector, kR, kU>, kStateMinBlocks<T, Gates::vector, kR, kU>);
      case Gates::scalar:
        return one(delta_state_kernel<T, Gates::scalar, kR, kU>, kStateMinBlocks<T, Gates::scalar, kR, kU>);
      default:
        return one(delta_state_kernel<T, Gates::fixed, kR, kU>, kStateMinBlocks<T, Gates::fixed, kR, kU>);
    }
  };
  using Yes = std::integral_constant<bool, true>;
  using No = std::integral_constant<bool, false>;
  using Narrow = std::integral_constant<int, 2>;
  using Wide = std::integral_constant<int, 4>;
  auto by_width = [&](auto t, auto rev) { return p.dim > 128 ? info(t, rev, Wide{}) : info(t, rev, Narrow{}); };
  if (dtype == Dtype::f32) return reverse ? by_width(float{}, Yes{}) : by_width(float{}, No{});
  return reverse ? by_width(bf16{}, Yes{}) : by_width(bf16{}, No{});
}

void delta_state_pass(const DeltaLaunch& l, const DeltaStateArgs& a, bool reverse, cudaStream_t stream) {
  const StateParams params{delta_shape(l), a, float(attention_scale(l.problem->dim))};
  if (l.dtype == Dtype::f32)
    reverse ? launch_typed<float, true>(l, params, stream) : launch_typed<float, false>(l, params, stream);
  else
    reverse ? launch_typed<bf16, true>(l, params, stream) : launch_typed<bf16, false>(l, params, stream);
}

}  // namespace lattn::cuda

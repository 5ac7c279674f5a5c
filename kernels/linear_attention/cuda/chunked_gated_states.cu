// The gated chunked form's sequential part (cuda/chunked_gated.hpp, gated_state_pass): per
// (sequence, value head), chunk after chunk, the state entering every chunk (forward) or the
// gradient of the state leaving it (reverse), and in the reverse pass dg's per-chunk term
// rowsum(dS_c . h_c) (docs/kernels.md, "Gated decays": dg_i = rowsum(dS_c . S_c) - the chunk's
// sum of q . dq - k . dk over the rows before i).
//
// One block of 8 warps per (sequence x value head, 64 state rows, 64 state columns): the 64 x 64
// tile of S stays in registers for the whole walk (warp w: rows 16 (w / 2), columns 32 (w % 2)).
// The walk goes in steps of up to 64 tokens, never across a chunk's end, staged by cp.async into
// one of two buffers while the block computes on the other; the step's log-gates into one buffer,
// refilled for the next step as soon as the rows' factors are made. Over a step's rows (b from the step's start), with e the step's sum
// of log-gates:
//   forward:  S <- diag(exp(e)) S + (K . exp(e - b))^T V          (the rows' factors: suffix sums)
//   reverse:  dS <- diag(exp(e)) dS + s (Q . exp(b))^T dO         (prefix sums; steps last first)
// which composed over a chunk's steps are its decay and its write; every factor is exp of a sum of
// log-gates over a range of rows (<= 1). Vector gates scale a state row (a key channel) each;
// scalar gates the whole tile. Entering a chunk (in walk order) the block writes its tile of S into
// the chunk's slot; the last S goes to the final state (hT, or dh0).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_gated.cuh"
#include "kernels/linear_attention/cuda/chunked_gated_gates.cuh"

namespace lattn::cuda {
namespace {

constexpr int kStep = 64;  // state rows and columns per block; tokens per staged step

struct PassLayout {
  int ld;
  std::size_t a, x, buf_step, g, sums, rows, warps, total;
};

__host__ __device__ inline PassLayout pass_layout(int es) {
  PassLayout L{};
  L.ld = padded_ld(kStep, es);
  const std::size_t tile = align128(std::size_t(kStep) * L.ld * es);
  Carve c;
  L.a = c.take(2 * tile);  // two buffers of A's rows, then two of X's
  L.x = c.take(2 * tile);
  L.buf_step = tile;
  L.g = c.take(sizeof(float) * kStep * kStep);  // the step's log-gates: 64 rows x 64 state rows
  L.sums = c.take(sizeof(float) * 6 * kStep);  // segment sums (4 x 64), factors, the decay
  L.rows = c.take(sizeof(float) * 2 * kStep);  // the reverse pass's row sums per column half
  L.warps = c.take(es == 4 ? 0 : kGatedWarps * align128(std::size_t(16) * kTileScratchLd * 4));
  L.total = c.at;
  return L;
}

struct PassParams {
  GatedShape shape;
  GatedStatePass args;
};

template <class T, int Gates, int MinBlocks>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_state_kernel(PassParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const GatedStatePass& a = p.args;
  const PassLayout L = pass_layout(int(sizeof(T)));
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, wm = warp >> 1, wn = warp & 1;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W;
  // Block x: (sequence x value head, row tile, column tile), the tiles fastest: a head's blocks run
  // side by side and read its rows through L2 once.
  const int col_tiles = (Dv + kStep - 1) / kStep, row_tiles = (Dk + kStep - 1) / kStep;
  const int col_tile = int(blockIdx.x) % col_tiles, pair = int(blockIdx.x) / col_tiles / row_tiles;
  const int row0 = int(blockIdx.x) / col_tiles % row_tiles * kStep, col0 = col_tile * kStep;
  T* const A0 = reinterpret_cast<T*>(smem + L.a);
  T* const X0 = reinterpret_cast<T*>(smem + L.x);
  const int step = int(L.buf_step / sizeof(T));
  float* const segs = reinterpret_cast<float*>(smem + L.sums);  // [4][64]
  float* const factor = segs + 4 * kStep;                         // scalar: the rows' factors
  float* const decay = factor + kStep;                            // per state row (vector), or [0]
  float* const rows = reinterpret_cast<float*>(smem + L.rows);    // [2][64]
  float* const G = reinterpret_cast<float*>(smem + L.g);            // [row][state row] (scalar: [row])
  float* scratch = reinterpret_cast<float*>(smem + L.warps) + warp * (align128(16 * kTileScratchLd * 4) / 4);

  // The block's sequence and value head: chunk k = first + c of it is the chunk-parallel kernels'.
  const int seq = pair / s.H, h = pair % s.H;
  const float lg = Fixed ? float(head_log_gate(s, h)) : 0.0f;  // fixed gates: every row's log-gate
  const ChunkRef ch0 = locate_chunk(s, s.cu ? s.first[seq] : seq * s.per_seq, h);
  const int chunks = ch0.chunks, first = ch0.first;
  const int len = s.cu ? s.cu[seq + 1] - s.cu[seq] : s.T;
  const std::size_t dd = std::size_t(Dk) * Dv;
  const T* A = static_cast<const T*>(a.a) + ch0.key;    // the sequence's first row
  const T* X = static_cast<const T*>(a.x) + ch0.value;
  const float* g = a.g + ch0.gate;
  T* states = static_cast<T*>(a.states) + std::size_t(first) * s.H * dd + std::size_t(h) * dd;
  const std::size_t slot = std::size_t(s.H) * dd;  // from one chunk's state to the next's

  // Steps in walk order: step u is step b of chunk c (rows c C + b 64 ..). The reverse walk takes
  // the chunks last first and each chunk's steps last first.
  const int per_chunk = (s.C + kStep - 1) / kStep, last_n = len - (chunks - 1) * s.C;
  const int last_steps = (last_n + kStep - 1) / kStep, steps = (chunks - 1) * per_chunk + last_steps;
  auto locate = [&](int u, int& c, int& b, int& in_chunk) {
    if (!a.reverse) {
      c = u / per_chunk, b = u - c * per_chunk;
    } else if (u < last_steps) {
      c = chunks - 1, b = last_steps - 1 - u;
    } else {
      const int r = u - last_steps;
      c = chunks - 2 - r / per_chunk, b = per_chunk - 1 - r % per_chunk;
    }
    in_chunk = c == chunks - 1 ? last_steps : per_chunk;
  };
  auto rows_of = [&](int c, int b) { return min(kStep, min(s.C, len - c * s.C) - b * kStep); };
  auto stage = [&](int u, int buf) {
    int c, b, in_chunk;
    locate(u, c, b, in_chunk);
    const std::size_t t0 = std::size_t(c) * s.C + std::size_t(b) * kStep;
    const int valid = rows_of(c, b);
    stage_async<kGatedThreads>(A0 + buf * step, L.ld, A + t0 * Dk + row0, Dk, valid, Dk - row0, kStep, kStep);
    stage_async<kGatedThreads>(X0 + buf * step, L.ld, X + t0 * Dv + col0, Dv, valid, Dv - col0, kStep, kStep);
    __pipeline_commit();
  };
  // Step u's log-gates: vector, rows x the block's 64 state rows; scalar, the rows. Zero past the
  // step's rows and the state's rows. Fixed gates stage nothing (an empty group keeps the count).
  auto stage_gates = [&](int u) {
    if constexpr (Fixed) {
      __pipeline_commit();
      return;
    }
    int c, b, in_chunk;
    locate(u, c, b, in_chunk);
    const std::size_t t0 = std::size_t(c) * s.C + std::size_t(b) * kStep;
    const int valid = rows_of(c, b);
    if constexpr (Vector)
      stage_async<kGatedThreads>(G, kStep, g + t0 * W + row0, W, valid, Dk - row0, kStep, kStep);
    else
      stage_async<kGatedThreads>(G, kStep, g + t0, kStep, 1, valid, 1, kStep);
    __pipeline_commit();
  };
  // This thread's gates: vector, state row gd of rows 16 gseg ..; scalar (warp 0), rows 2 lane, 2 lane + 1.
  const int gd = int(threadIdx.x) & 63, gseg = int(threadIdx.x) >> 6;

  WarpBlock<T, 1, 2> S;
  S.zero();
  const std::size_t st = ch0.seq_state;
  each_lane(S, scratch, [&](int t, int r, int c, float& v) {
    const int i = row0 + wm * 16 + r, j = col0 + wn * 32 + t * 16 + c;
    v = i < Dk && j < Dv ? a.s0[st + std::size_t(i) * Dv + j] : 0.0f;
  });
  auto store = [&](T* dst) {  // the block's tile of S into a chunk's slot
    each_lane(S, scratch, [&](int t, int r, int c, float& v) {
      const int i = row0 + wm * 16 + r, j = col0 + wn * 32 + t * 16 + c;
      if (i < Dk && j < Dv) dst[std::size_t(i) * Dv + j] = from_float<T>(v);
    });
  };

  // cp.async groups in order: A and X of step 0, gates of step 0; then per step u the A and X of
  // step u + 1 (at its start) and the gates of step u + 1 (once step u's have been read).
  stage(0, 0);
  stage_gates(0);
  for (int u = 0; u < steps; ++u) {
    const int buf = u & 1;
    if (u + 1 < steps) {
      stage(u + 1, buf ^ 1);  // its buffer was last read before the barrier that ended step u - 1
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    int c, b, in_chunk;
    locate(u, c, b, in_chunk);
    const bool chunk_start = a.reverse ? b == in_chunk - 1 : b == 0, chunk_end = a.reverse ? b == 0 : b == in_chunk - 1;
    if (chunk_start) store(states + std::size_t(c) * slot);

    // The rows' factors and the step's decay, from this thread's gates.
    T* Ab = A0 + buf * step;
    float gnow[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      if constexpr (Vector) gnow[r] = G[(gseg * 16 + r) * kStep + gd];
      else if constexpr (Fixed) gnow[r] = r < 2 && 2 * lane + r < rows_of(c, b) ? lg : 0.0f;
      else gnow[r] = r < 2 ? G[2 * lane + r] : 0.0f;
    }
    if constexpr (Vector) {
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < 16; ++r) sum += gnow[r];
      segs[gseg * kStep + gd] = sum;
      __syncthreads();  // every thread has read its gates: the buffer takes the next step's
      if (u + 1 < steps) stage_gates(u + 1);
      float run = 0.0f;  // the log-gates of the rows after (forward) or up to (reverse) the row
      for (int o = 0; o < 4; ++o)
        if (a.reverse ? o < gseg : o > gseg) run += segs[o * kStep + gd];
      if (gseg == 0) decay[gd] = expf(segs[gd] + segs[kStep + gd] + segs[2 * kStep + gd] + segs[3 * kStep + gd]);
      if (a.reverse) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          run += gnow[r];
          T& x = Ab[(gseg * 16 + r) * L.ld + gd];
          x = from_float<T>(to_float(x) * s.scale * expf(run));
        }
      } else {
#pragma unroll
        for (int r = 15; r >= 0; --r) {
          T& x = Ab[(gseg * 16 + r) * L.ld + gd];
          x = from_float<T>(to_float(x) * expf(run));
          run += gnow[r];
        }
      }
    } else {
      if (warp == 0) {  // rows 2 lane and 2 lane + 1: sums over the lanes before (reverse) or after
        const float pair = gnow[0] + gnow[1];
        float incl = pair;  // inclusive over lanes 0 .. lane (reverse) or lane .. 31 (forward)
        for (int o = 1; o < 32; o *= 2) {
          const float y = a.reverse ? __shfl_up_sync(0xffffffffu, incl, o) : __shfl_down_sync(0xffffffffu, incl, o);
          if (a.reverse ? lane >= o : lane + o < 32) incl += y;
        }
        // The other lanes' part, read rather than subtracted: a difference of two long sums of
        // log-gates would lose the digits a factor near 1 needs.
        const float y = a.reverse ? __shfl_up_sync(0xffffffffu, incl, 1) : __shfl_down_sync(0xffffffffu, incl, 1);
        const float others = a.reverse ? (lane > 0 ? y : 0.0f) : (lane < 31 ? y : 0.0f);
        if (a.reverse) {  // s exp(b) with b from the step's start, the row included
          factor[2 * lane] = s.scale * expf(others + gnow[0]);
          factor[2 * lane + 1] = s.scale * expf(others + pair);
        } else {  // exp of the rows after the row
          factor[2 * lane] = expf(others + gnow[1]);
          factor[2 * lane + 1] = expf(others);
        }
        const float total = __shfl_sync(0xffffffffu, incl, a.reverse ? 31 : 0);
        if (lane == 0) decay[0] = expf(total);
      }
      __syncthreads();  // warp 0 has read the gates: the buffer takes the next step's
      if (u + 1 < steps) stage_gates(u + 1);
      for (int e = int(threadIdx.x); e < kStep * kStep; e += kGatedThreads) {
        const int r = e / kStep, d = e - r * kStep;
        Ab[r * L.ld + d] = from_float<T>(to_float(Ab[r * L.ld + d]) * factor[r]);
      }
    }
    __syncthreads();
    if constexpr (Vector) {
      each_lane(S, scratch, [&](int, int r, int, float& v) { v *= decay[wm * 16 + r]; });
    } else {
      S.scale(decay[0]);
    }
    const int ksteps = (rows_of(c, b) + 15) / 16;
    warp_mma<false, 2, true>(S.acc[0], Ab + wm * 16, L.ld, X0 + buf * step + wn * 32, L.ld, ksteps);  // S += A^T X

    if (a.reverse && chunk_end && a.rowsums) {  // dS is the gradient of the state entering chunk c (dg's term)
      const T* hc = static_cast<const T*>(a.fwd_states) + std::size_t(first + c) * slot + std::size_t(h) * dd;
      float part = 0.0f;
      each_lane(S, scratch, [&](int t, int r, int cc, float& v) {
        const int i = row0 + wm * 16 + r, j = col0 + wn * 32 + t * 16 + cc;
        if (i < Dk && j < Dv) part += v * to_float(hc[std::size_t(i) * Dv + j]);
      });
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      if ((lane & 1) == 0) rows[wn * kStep + wm * 16 + (lane >> 1)] = part;
      __syncthreads();
      for (int d = int(threadIdx.x); d < kStep; d += kGatedThreads)
        if (row0 + d < Dk)
          a.rowsums[((std::size_t(first + c) * s.H + h) * col_tiles + col_tile) * Dk + row0 + d] =
              rows[d] + rows[kStep + d];
    }
    __syncthreads();
  }
  if (a.final_state) {
    each_lane(S, scratch, [&](int t, int r, int c, float& v) {
      const int i = row0 + wm * 16 + r, j = col0 + wn * 32 + t * 16 + c;
      if (i < Dk && j < Dv) a.final_state[st + std::size_t(i) * Dv + j] = v;
    });
  }
}

// Two blocks per multiprocessor where their shared memory fits (float32's on A100 does not), else one.
int pass_blocks(Dtype dtype, std::size_t limit) {
  return 2 * (pass_layout(element_size(dtype)).total + 1024) <= limit + 1024 ? 2 : 1;
}

template <class T, int Gates>
struct PassKernel {
  template <int MinBlocks>
  static void launch(const PassParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    auto kernel = gated_state_kernel<T, Gates, MinBlocks>;
    allow_shared(kernel, device, shared);
    kernel<<<grid, kGatedThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  }
  template <int MinBlocks>
  static int occupancy(std::size_t shared, int device) {
    auto kernel = gated_state_kernel<T, Gates, MinBlocks>;
    allow_shared(kernel, device, shared);
    int blocks = 0;
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
    return blocks;
  }
  static void run(int blocks, const PassParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    blocks == 2 ? launch<2>(params, grid, shared, device, stream) : launch<1>(params, grid, shared, device, stream);
  }
  static int resident(int blocks, std::size_t shared, int device) {
    return blocks == 2 ? occupancy<2>(shared, device) : occupancy<1>(shared, device);
  }
};

// Calls F<T, Gates> for the dtype and the gates.
template <template <class, int> class F, class... Args>
auto dispatch_pass(Dtype dtype, int gates, Args&&... args) {
  auto by_gates = [&](auto t) {
    using T = decltype(t);
    if (gates == kVectorGates) return F<T, kVectorGates>::run(args...);
    if (gates == kFixedGates) return F<T, kFixedGates>::run(args...);
    return F<T, kScalarGates>::run(args...);
  };
  return dtype == Dtype::f32 ? by_gates(float{}) : by_gates(bf16{});
}

template <class T, int Gates>
struct PassLaunch {
  static int run(int blocks, const PassParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    PassKernel<T, Gates>::run(blocks, params, grid, shared, device, stream);
    return 0;
  }
};
template <class T, int Gates>
struct PassResident {
  static int run(int blocks, std::size_t shared, int device) { return PassKernel<T, Gates>::resident(blocks, shared, device); }
};

}  // namespace

std::size_t gated_state_pass_shared_bytes(Dtype dtype) { return pass_layout(element_size(dtype)).total; }

int gated_state_pass_blocks(Dtype dtype) { return pass_blocks(dtype, max_shared_bytes(current_device())); }

int gated_state_pass_occupancy(Dtype dtype, int gates) {
  const std::size_t shared = gated_state_pass_shared_bytes(dtype);
  const int device = current_device(), blocks = pass_blocks(dtype, max_shared_bytes(device));
  return dispatch_pass<PassResident>(dtype, gates, blocks, shared, device);
}

void gated_state_pass(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedStatePass& args,
                      cudaStream_t stream) {
  const PassParams params{shape, args};
  const dim3 grid(unsigned(std::size_t(p.sequences()) * shape.H * ((shape.Dk + kStep - 1) / kStep) *
                           ((shape.Dv + kStep - 1) / kStep)));
  const std::size_t shared = gated_state_pass_shared_bytes(dtype);
  const int device = current_device(), blocks = pass_blocks(dtype, max_shared_bytes(device));
  dispatch_pass<PassLaunch>(dtype, shape.gates, blocks, params, grid, shared, device, stream);
}

}  // namespace lattn::cuda

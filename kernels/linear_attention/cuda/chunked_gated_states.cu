// The gated chunked form's sequential part (cuda/chunked_gated.hpp, gated_state_pass): per
// (sequence, value head), chunk after chunk, the state entering every chunk (forward) or the
// gradient of the state leaving it (reverse), and in the reverse pass dg's per-chunk term
// rowsum(dS_c . h_c) (docs/kernels.md, "Gated decays": dg_i = rowsum(dS_c . S_c) - the chunk's
// sum of q . dq - k . dk over the rows before i).
//
// The recurrence is sequential over chunks but independent over the state's elements: a state
// row (key channel) d and column (value channel) j of S' = diag(exp(e)) S + (K . exp(e - b))^T V
// need only row d of the decay and K and column j of V. So a head's Dk x Dv state is split into
// 64 x 32 slices, one block of 4 warps each, (sequence x value head, 64 state rows, 32 state
// columns), the column slice fastest (a head's blocks run side by side and read its K rows through
// L2 once): 2048 blocks at B 4, H 64, D 128 (8 a head), of 128 threads, several resident per
// multiprocessor (bf16: 6 where their shared memory fits; pass_counts), so that the machine holds
// many independent walks at once rather than a few waves of wide ones (the 64 x 64 tiles of 8
// warps this replaced: 1024 blocks, 2 resident). Each block keeps its 64 x 32 slice of S in
// registers for the whole walk (warp w: rows 16 w .. 16 w + 15, all 32 columns). The walk goes in
// steps of up to 64 tokens (bf16 with scalar or fixed gates; 32 for float32 and for vector gates,
// whose staged log-gates take a row per state row: pass_step), never across a chunk's end; a
// step's K (or Q) rows for the block's 64 state rows and V (or dO) rows for its 32 columns are
// staged by cp.async into one of two buffers while the block computes on the other, and the step's
// log-gates into a third (vector gates: tokens x the block's 64 state rows; scalar gates: one a
// token; fixed gates: none), refilled for the next step as soon as they have been read. Over a
// step's rows (b from the step's start), with e the step's sum of log-gates:
//   forward:  S <- diag(exp(e)) S + (K . exp(e - b))^T V          (the rows' factors: suffix sums)
//   reverse:  dS <- diag(exp(e)) dS + s (Q . exp(b))^T dO         (prefix sums; steps last first)
// which composed over a chunk's steps are its decay and its write; every factor is exp of a sum of
// log-gates over a range of rows (<= 1). Vector gates scale K's (Q's) element of a token and state
// row each; scalar and fixed gates a token each, applied to the block's 64 x 32 V (dO) rows, the
// smaller operand. Entering a chunk (in walk order) the block writes its slice of S into the
// chunk's slot; the last S goes to the final state (hT, or dh0). The reverse pass's row sums of
// dS . h_c are per 32-column slice (a warp holds whole rows of its slice: no shared memory).
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

constexpr int kRows = 64;          // state rows (key channels) per block
constexpr int kCols = 32;          // state columns (value channels) per block
constexpr int kPassWarps = 4;      // warp w: state rows 16 w .. 16 w + 15
constexpr int kPassThreads = kPassWarps * 32;

// Tokens per staged step: 64 for bf16 with scalar or fixed gates, 32 where the step's operands
// are wider (float32) or its log-gates take a row per state row (vector gates), so that every
// variant's buffers fit six blocks in a multiprocessor's shared memory.
__host__ __device__ constexpr int pass_step(int es, bool vector) { return es == 2 && !vector ? 64 : 32; }

struct PassLayout {
  int lda, ldx, step;
  std::size_t a, x, buf_a, buf_x, g, sums, warps, total;
};

// Vector gates stage a step's log-gates per token and state row; scalar and fixed gates one per
// token (fixed gates read none, but keep the scalar layout).
__host__ __device__ inline PassLayout pass_layout(int es, bool vector) {
  PassLayout L{};
  const int kStep = pass_step(es, vector);
  L.step = kStep;
  L.lda = padded_ld(kRows, es);
  L.ldx = padded_ld(kCols, es);
  L.buf_a = align128(std::size_t(kStep) * L.lda * es);
  L.buf_x = align128(std::size_t(kStep) * L.ldx * es);
  Carve c;
  L.a = c.take(2 * L.buf_a);  // two buffers of A's rows, then two of X's
  L.x = c.take(2 * L.buf_x);
  L.g = c.take(sizeof(float) * kStep * (vector ? kRows : 1));
  L.sums = c.take(sizeof(float) * 6 * kRows);  // segment sums (up to 4 x 64), the tokens' factors, the decay
  L.warps = c.take(es == 4 ? 0 : kPassWarps * align128(std::size_t(16) * kTileScratchLd * 4));
  L.total = c.at;
  return L;
}

struct PassParams {
  GatedShape shape;
  GatedStatePass args;
};

// sm_80 builds promise at most 3 where a launch promises 6 (at 80 to 96 registers its bf16
// instances spill 8 to 12 bytes there): an A100's 163 KiB never fits 6 blocks' shared memory,
// so it never launches them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kPassBlocksCap = 3;
#else
constexpr int kPassBlocksCap = 6;
#endif
template <int N>
constexpr int kPassBoundsBlocks = N < kPassBlocksCap ? N : kPassBlocksCap;

template <class T, int Gates, int MinBlocks>
__global__ void __launch_bounds__(kPassThreads, kPassBoundsBlocks<MinBlocks>) gated_state_kernel(PassParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int kStep = pass_step(int(sizeof(T)), Vector), Segs = kStep / 16, PerLane = kStep / 32;
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const GatedStatePass& a = p.args;
  const PassLayout L = pass_layout(int(sizeof(T)), Vector);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W;
  // Block x: (sequence x value head, row slice, column slice), the column slice fastest.
  const int col_tiles = (Dv + kCols - 1) / kCols, row_tiles = (Dk + kRows - 1) / kRows;
  const int col_tile = int(blockIdx.x) % col_tiles, pair = int(blockIdx.x) / col_tiles / row_tiles;
  const int row0 = int(blockIdx.x) / col_tiles % row_tiles * kRows, col0 = col_tile * kCols;
  T* const A0 = reinterpret_cast<T*>(smem + L.a);
  T* const X0 = reinterpret_cast<T*>(smem + L.x);
  const int step_a = int(L.buf_a / sizeof(T)), step_x = int(L.buf_x / sizeof(T));
  float* const segs = reinterpret_cast<float*>(smem + L.sums);  // [Segs][64]
  float* const factor = segs + 4 * kRows;                         // scalar: the tokens' factors
  float* const decay = factor + kStep;                            // per state row (vector), or [0]
  float* const G = reinterpret_cast<float*>(smem + L.g);          // [token][state row] (scalar: [token])
  float* scratch = reinterpret_cast<float*>(smem + L.warps) + warp * (align128(16 * kTileScratchLd * 4) / 4);

  // The block's sequence and value head: chunk k = first + c of it is the chunk-parallel kernels'.
  const int seq = pair / s.H, h = pair % s.H;
  const float lg = Fixed ? float(head_log_gate(s, h)) : 0.0f;  // fixed gates: every row's log-gate
  const ChunkRef ch0 = locate_chunk(s, s.cu ? s.first[seq] : seq * s.per_seq, h);
  const int chunks = ch0.chunks, first = ch0.first;
  const int len = s.cu ? s.cu[seq + 1] - s.cu[seq] : s.T;
  const std::size_t dd = std::size_t(Dk) * Dv;
  const T* A = static_cast<const T*>(a.a) + ch0.key;  // the sequence's first row
  const T* X = static_cast<const T*>(a.x) + ch0.value;
  const float* g = a.g + ch0.gate;
  T* states = static_cast<T*>(a.states) + std::size_t(first) * s.H * dd + std::size_t(h) * dd;
  const std::size_t slot = std::size_t(s.H) * dd;  // from one chunk's state to the next's

  // Steps in walk order: step u is step b of chunk c (rows c C + b kStep ..). The reverse walk takes
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
    stage_async<kPassThreads>(A0 + buf * step_a, L.lda, A + t0 * Dk + row0, Dk, valid, Dk - row0, kStep, kRows);
    stage_async<kPassThreads>(X0 + buf * step_x, L.ldx, X + t0 * Dv + col0, Dv, valid, Dv - col0, kStep, kCols);
    __pipeline_commit();
  };
  // Step u's log-gates: vector, tokens x the block's 64 state rows; scalar, the tokens. Zero past
  // the step's tokens and the state's rows. Fixed gates stage nothing (an empty group keeps the count).
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
      stage_async<kPassThreads>(G, kRows, g + t0 * W + row0, W, valid, Dk - row0, kStep, kRows);
    else
      stage_async<kPassThreads>(G, kStep, g + t0, kStep, 1, valid, 1, kStep);
    __pipeline_commit();
  };

  WarpBlock<T, 1, 2> S;  // rows row0 + 16 warp + r, columns col0 + 16 t + c
  S.zero();
  const std::size_t st = ch0.seq_state;
  each_lane(S, scratch, [&](int t, int r, int c, float& v) {
    const int i = row0 + warp * 16 + r, j = col0 + t * 16 + c;
    v = i < Dk && j < Dv ? a.s0[st + std::size_t(i) * Dv + j] : 0.0f;
  });
  auto store = [&](T* dst) {  // the block's slice of S into a chunk's slot
    each_lane(S, scratch, [&](int t, int r, int c, float& v) {
      const int i = row0 + warp * 16 + r, j = col0 + t * 16 + c;
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
      stage(u + 1, buf ^ 1);  // its buffers were last read before the barrier that ended step u - 1
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    int c, b, in_chunk;
    locate(u, c, b, in_chunk);
    const bool chunk_start = a.reverse ? b == in_chunk - 1 : b == 0, chunk_end = a.reverse ? b == 0 : b == in_chunk - 1;
    if (chunk_start) store(states + std::size_t(c) * slot);

    T* const Ab = A0 + buf * step_a;
    T* const Xb = X0 + buf * step_x;
    if constexpr (Vector) {
      // Per thread Segs / 2 tasks: state row gd, tokens 16 gseg .. 16 gseg + 15.
#pragma unroll 1
      for (int task = int(threadIdx.x); task < Segs * kRows; task += kPassThreads) {
        const int gd = task & (kRows - 1), gseg = task / kRows;
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < 16; ++r) sum += G[(gseg * 16 + r) * kRows + gd];
        segs[gseg * kRows + gd] = sum;
      }
      __syncthreads();
#pragma unroll 1
      for (int task = int(threadIdx.x); task < Segs * kRows; task += kPassThreads) {
        const int gd = task & (kRows - 1), gseg = task / kRows;
        float run = 0.0f, total = 0.0f;  // run: the log-gates of the tokens after (forward) or up to (reverse) the token
#pragma unroll
        for (int o = 0; o < Segs; ++o) {
          if (a.reverse ? o < gseg : o > gseg) run += segs[o * kRows + gd];
          total += segs[o * kRows + gd];
        }
        if (gseg == 0) decay[gd] = expf(total);
        if (a.reverse) {
#pragma unroll 1
          for (int r = 0; r < 16; ++r) {
            run += G[(gseg * 16 + r) * kRows + gd];
            T& x = Ab[(gseg * 16 + r) * L.lda + gd];
            x = from_float<T>(to_float(x) * s.scale * expf(run));
          }
        } else {
#pragma unroll 1
          for (int r = 15; r >= 0; --r) {
            T& x = Ab[(gseg * 16 + r) * L.lda + gd];
            x = from_float<T>(to_float(x) * expf(run));
            run += G[(gseg * 16 + r) * kRows + gd];
          }
        }
      }
      __syncthreads();  // the gates are read: the buffer takes the next step's
      if (u + 1 < steps) stage_gates(u + 1);
    } else {
      if (warp == 0) {  // tokens PerLane lane ..: sums over the lanes before (reverse) or after
        float gnow[PerLane], mine = 0.0f;
#pragma unroll
        for (int r = 0; r < PerLane; ++r) {
          if constexpr (Fixed) gnow[r] = PerLane * lane + r < rows_of(c, b) ? lg : 0.0f;
          else gnow[r] = G[PerLane * lane + r];
          mine += gnow[r];
        }
        float incl = mine;  // inclusive over lanes 0 .. lane (reverse) or lane .. 31 (forward)
        for (int o = 1; o < 32; o *= 2) {
          const float y = a.reverse ? __shfl_up_sync(0xffffffffu, incl, o) : __shfl_down_sync(0xffffffffu, incl, o);
          if (a.reverse ? lane >= o : lane + o < 32) incl += y;
        }
        // The other lanes' part, read rather than subtracted: a difference of two long sums of
        // log-gates would lose the digits a factor near 1 needs.
        const float y = a.reverse ? __shfl_up_sync(0xffffffffu, incl, 1) : __shfl_down_sync(0xffffffffu, incl, 1);
        const float others = a.reverse ? (lane > 0 ? y : 0.0f) : (lane < 31 ? y : 0.0f);
        float run = others;
        if (a.reverse) {  // s exp(b) with b from the step's start, the token included
#pragma unroll
          for (int r = 0; r < PerLane; ++r) {
            run += gnow[r];
            factor[PerLane * lane + r] = s.scale * expf(run);
          }
        } else {  // exp of the tokens after the token
#pragma unroll
          for (int r = PerLane - 1; r >= 0; --r) {
            factor[PerLane * lane + r] = expf(run);
            run += gnow[r];
          }
        }
        const float total = __shfl_sync(0xffffffffu, incl, a.reverse ? 31 : 0);
        if (lane == 0) decay[0] = expf(total);
      }
      __syncthreads();  // warp 0 has read the gates: the buffer takes the next step's
      if (u + 1 < steps) stage_gates(u + 1);
      // A token's factor scales its row of the product A^T X: on X, the block's 32 columns.
#pragma unroll 1
      for (int e = int(threadIdx.x); e < kStep * kCols; e += kPassThreads) {
        const int r = e / kCols, d = e - r * kCols;
        Xb[r * L.ldx + d] = from_float<T>(to_float(Xb[r * L.ldx + d]) * factor[r]);
      }
      __syncthreads();
    }
    if constexpr (Vector) {
      each_lane(S, scratch, [&](int, int r, int, float& v) { v *= decay[warp * 16 + r]; });
    } else {
      S.scale(decay[0]);
    }
    const int ksteps = (rows_of(c, b) + 15) / 16;
    warp_mma<false, 2, true>(S.acc[0], Ab + warp * 16, L.lda, Xb, L.ldx, ksteps);  // S += A^T X

    if (a.reverse && chunk_end && a.rowsums) {  // dS is the gradient of the state entering chunk c (dg's term)
      const T* hc = static_cast<const T*>(a.fwd_states) + std::size_t(first + c) * slot + std::size_t(h) * dd;
      float part = 0.0f;
      each_lane(S, scratch, [&](int t, int r, int cc, float& v) {
        const int i = row0 + warp * 16 + r, j = col0 + t * 16 + cc;
        if (i < Dk && j < Dv) part += v * to_float(hc[std::size_t(i) * Dv + j]);
      });
      part += __shfl_xor_sync(0xffffffffu, part, 1);  // the row's other 16 columns
      const int i = row0 + warp * 16 + (lane >> 1);
      if ((lane & 1) == 0 && i < Dk)
        a.rowsums[((std::size_t(first + c) * s.H + h) * col_tiles + col_tile) * Dk + i] = part;
    }
    __syncthreads();  // every warp is done with this step's buffers
  }
  if (a.final_state) {
    each_lane(S, scratch, [&](int t, int r, int c, float& v) {
      const int i = row0 + warp * 16 + r, j = col0 + t * 16 + c;
      if (i < Dk && j < Dv) a.final_state[st + std::size_t(i) * Dv + j] = v;
    });
  }
}

// The blocks per multiprocessor a variant's launch bounds may promise, most first: each count
// one that ptxas fits without a spill at sm_80 and sm_90a (bf16: 80 registers a thread at 6 blocks
// of 128 threads, 168 at 3; float32: 128 at 4 with fixed gates, whose step reads no gates, else
// 255 at 2), and 1 as the last resort.
__host__ __device__ constexpr int pass_counts(int es, int gates, int i) {
  return es == 2 ? (i == 0 ? 6 : i == 1 ? 3 : 1) : gates == kFixedGates ? (i == 0 ? 4 : i == 1 ? 2 : 1) : (i == 0 ? 2 : 1);
}

// The most of those counts whose blocks' shared memory (with the 1 KiB the runtime keeps per
// block) fits a multiprocessor under the device's opt-in limit.
int pass_blocks(Dtype dtype, int gates, std::size_t limit) {
  const int es = element_size(dtype);
  const std::size_t need = pass_layout(es, gates == kVectorGates).total + 1024;
  for (int i = 0;; ++i) {
    const int n = pass_counts(es, gates, i);
    if (n == 1 || std::size_t(n) * need <= limit + 1024) return n;
  }
}

template <class T, int Gates>
struct PassKernel {
  template <int MinBlocks>
  static void launch(const PassParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    auto kernel = gated_state_kernel<T, Gates, MinBlocks>;
    allow_shared(kernel, device, shared);
    kernel<<<grid, kPassThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  }
  template <int MinBlocks>
  static int occupancy(std::size_t shared, int device) {
    auto kernel = gated_state_kernel<T, Gates, MinBlocks>;
    allow_shared(kernel, device, shared);
    int blocks = 0;
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kPassThreads, shared));
    return blocks;
  }
  // Only the counts pass_counts lists are instantiated.
  static constexpr int kEs = int(sizeof(T)), kFirst = pass_counts(kEs, Gates, 0), kSecond = pass_counts(kEs, Gates, 1);
  static void run(int blocks, const PassParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    if (blocks == kFirst) return launch<kFirst>(params, grid, shared, device, stream);
    if constexpr (kSecond > 1)
      if (blocks == kSecond) return launch<kSecond>(params, grid, shared, device, stream);
    launch<1>(params, grid, shared, device, stream);
  }
  static int resident(int blocks, std::size_t shared, int device) {
    if (blocks == kFirst) return occupancy<kFirst>(shared, device);
    if constexpr (kSecond > 1)
      if (blocks == kSecond) return occupancy<kSecond>(shared, device);
    return occupancy<1>(shared, device);
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

std::size_t gated_state_pass_shared_bytes(Dtype dtype, int gates) {
  return pass_layout(element_size(dtype), gates == kVectorGates).total;
}

int gated_state_pass_blocks(Dtype dtype, int gates) { return pass_blocks(dtype, gates, max_shared_bytes(current_device())); }

int gated_state_pass_threads() { return kPassThreads; }

std::size_t gated_state_pass_grid(const Problem& p) {
  return std::size_t(p.sequences()) * p.heads * ((p.dim + kRows - 1) / kRows) * ((p.value_dim() + kCols - 1) / kCols);
}

int gated_state_pass_occupancy(Dtype dtype, int gates) {
  const std::size_t shared = gated_state_pass_shared_bytes(dtype, gates);
  const int device = current_device(), blocks = pass_blocks(dtype, gates, max_shared_bytes(device));
  return dispatch_pass<PassResident>(dtype, gates, blocks, shared, device);
}

void gated_state_pass(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedStatePass& args,
                      cudaStream_t stream) {
  const PassParams params{shape, args};
  const dim3 grid(unsigned(gated_state_pass_grid(p)));
  const std::size_t shared = gated_state_pass_shared_bytes(dtype, shape.gates);
  const int device = current_device(), blocks = pass_blocks(dtype, shape.gates, max_shared_bytes(device));
  dispatch_pass<PassLaunch>(dtype, shape.gates, blocks, params, grid, shared, device, stream);
}

}  // namespace lattn::cuda

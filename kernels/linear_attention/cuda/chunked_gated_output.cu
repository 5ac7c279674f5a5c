// The gated chunked form's output kernel (cuda/chunked_gated.hpp; docs/cuda.md, "Gated decays,
// chunked"): for a chunk of n rows with cumulative log-gates b (from the chunk's start) and the
// state h_c entering it,
//   O_i = s ( (q_i . exp(b_i))^T h_c + sum_{j <= i} A_ij v_j ),  A_ij = sum_d q_id k_jd exp(b_id - b_jd)
// (scalar gates: A = (Q K^T) . exp(b_i - b_j), a mask). One block of 8 warps per (chunk, value head,
// RB query rows, 128 value columns); the output tile RB x 128 stays in registers (warp w: query
// tile w % (RB/16), columns of group w / (RB/16)). The block walks the key blocks the causal mask
// lets it see from its own down to the chunk's first, one score tile of RB x RB at a time in
// shared memory, then adds the state term.
//
// Vector gates (the factors per key channel cannot be a mask) in 16-row tiles, each factor <= 1
// (cuda/chunked_gated_gates.cuh): with EQ_i = exp(b_i - b at the row before i's tile), EK_j = exp(b at
// the end of j's tile (or walked block) - b_j) and f = exp(the sum of the whole tiles or blocks
// between), exp(b_i - b_j) = EQ_i f EK_j; Q . EQ and K . EK are scaled once in shared memory and f
// per warp on the way to the tensor cores (mma_scaled_a). Within a diagonal 16 x 16 tile the scores
// are made element-wise on the FMA units, with exp(b_i - b_j) a running product of exp(g)
// (diagonal_scores). The state term's factor exp(b_i) = EQ_i exp(the sum of the tiles and blocks
// before i's tile) scales Q in place once the walk is done.
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

constexpr int kOutCols = 128;  // value columns per block

// Dynamic shared memory (bytes): own queries Q (RB x Dk), keys K (RB x Dk: the diagonal block's,
// then each walked block's), then one region that holds in turn the vector gates of the own rows
// (float), V's columns with the score tile S, and a 64-row piece of the state; the gates' sums
// (double); the warps' areas.
struct OutputLayout {
  int Dp, ldK, ldN, ldS, ldG;
  std::size_t q, k, x, v, s, diag, sums, warps, warp_bytes, total;
};

__host__ __device__ inline OutputLayout output_layout(int Dk, int RB, int es, bool vector) {
  OutputLayout L{};
  L.Dp = round16(Dk);
  L.ldK = padded_ld(Dk, es);
  L.ldN = padded_ld(kOutCols, es);
  L.ldS = padded_ld(RB, es);
  L.ldG = padded_ld(Dk, 4);
  Carve c;
  L.q = c.take(std::size_t(RB) * L.ldK * es);
  L.k = c.take(std::size_t(RB) * L.ldK * es);
  const std::size_t v = align128(std::size_t(RB) * L.ldN * es), vs = v + align128(std::size_t(RB) * L.ldS * es);
  const std::size_t piece = std::size_t(64) * L.ldN * es, gates = vector ? std::size_t(RB) * L.ldG * 4 : 0;
  L.x = c.take(std::max(vs, std::max(piece, gates)));
  L.v = L.x;
  L.s = L.x + v;
  L.diag = c.take(vector ? sizeof(float) * RB * 16 : 0);  // the diagonal tiles' scores (vector gates)
  L.sums = c.take(sizeof(double) * (vector ? std::size_t(RB / 16 + 2) * L.Dp : std::size_t(2 * RB + 2)));
  L.warp_bytes = warp_area_bytes(vector ? L.Dp : 0);
  L.warps = c.take(kGatedWarps * L.warp_bytes);
  L.total = c.at;
  return L;
}

template <class T, int Gates, int RB, int MinBlocks>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_output_kernel(GatedParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int RT = RB / 16, CG = kGatedWarps / RT, TN = kOutCols / 16 / CG, SJ = (RT + CG - 1) / CG;
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const OutputLayout L = output_layout(s.Dk, RB, int(sizeof(T)), Vector);
  const BlockAt at = block_at(p);
  const ChunkRef& ch = at.ch;
  const int r0 = at.rb * RB;
  if (r0 >= ch.n) return;  // a row block past a short chunk's end: the whole block, before any barrier
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, ti = warp % RT, cg = warp / RT;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W, Dp = L.Dp, valid = min(RB, ch.n - r0);
  const double lg = Fixed ? head_log_gate(s, at.h) : 0.0;  // fixed gates: every row's log-gate
  const int col0 = at.ct * kOutCols;
  T* Q = reinterpret_cast<T*>(smem + L.q);
  T* K = reinterpret_cast<T*>(smem + L.k);
  float* G = reinterpret_cast<float*>(smem + L.x);
  T* V = reinterpret_cast<T*>(smem + L.v);
  T* S = reinterpret_cast<T*>(smem + L.s);
  T* Hs = reinterpret_cast<T*>(smem + L.x);
  // Vector gates: tiles[t][d] (the own tiles' sums), between[d] (the walked blocks' so far), blk[d]
  // (the walked block's). Scalar: own[r] (prefix sums of the own rows), walk[r] (the walked
  // block's suffix sums), between[0], blk[0].
  float* const diag = reinterpret_cast<float*>(smem + L.diag);  // [tile][query row][key]
  double* const sums = reinterpret_cast<double*>(smem + L.sums);
  double* const tiles = sums;
  double* const own = sums;
  double* const walk = sums + RB;
  double* const between = sums + (Vector ? RT * Dp : 2 * RB);
  double* const blk = between + (Vector ? Dp : 1);
  unsigned char* area = smem + L.warps + warp * L.warp_bytes;
  float* scratch = reinterpret_cast<float*>(area);
  T* piece = reinterpret_cast<T*>(area);
  float* f = reinterpret_cast<float*>(area + warp_area_bytes(0));

  const T* q = static_cast<const T*>(p.args.q) + ch.key;
  const T* k = static_cast<const T*>(p.args.k) + ch.key;
  const T* v = static_cast<const T*>(p.args.v) + ch.value;
  const float* g = p.args.g + ch.gate;

  // ---- the diagonal block: the own rows' queries and keys ----
  stage_async<kGatedThreads>(Q, L.ldK, q + std::size_t(r0) * Dk, Dk, valid, Dk, RB, Dp);
  stage_async<kGatedThreads>(K, L.ldK, k + std::size_t(r0) * Dk, Dk, valid, Dk, RB, Dp);
  if constexpr (Vector)
    stage_async<kGatedThreads>(G, L.ldG, g + std::size_t(r0) * W, W, valid, Dk, RB, Dp);
  else
    stage_async<kGatedThreads>(V, L.ldN, v + std::size_t(r0) * Dv + col0, Dv, valid, Dv - col0, RB, kOutCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  WarpBlock<T, 1, SJ> sc;  // the warp's score tiles: query tile ti, key tiles cg SJ ..
  sc.zero();
  float d1[16];  // vector gates: this warp's part of the diagonal tile's scores, row lane % 16 of tile ti
  if constexpr (Vector) {
    tile_sums_and_exp(G, L.ldG, RB, Dp, tiles);
    for (int d = int(threadIdx.x); d < Dp; d += kGatedThreads) between[d] = 0.0;
    __syncthreads();
    // The CG warps of tile ti each take a share of the channels, two parts per warp.
    diagonal_scores(d1, Q, K, L.ldK, G, L.ldG, ti, Dp, cg * 2 + (lane >> 4), CG * 2);  // 8-channel groups
#pragma unroll
    for (int j = 0; j < 16; ++j) d1[j] += __shfl_xor_sync(0xffffffffu, d1[j], 16);
    if (cg > 0 && lane < 16) {
#pragma unroll
      for (int j = 0; j < 16; ++j) scratch[lane * kTileScratchLd + j] = d1[j];
    }
    __syncthreads();
    if (cg == 0 && lane < 16) {  // the parts' sum, kept in shared memory until the score tile is written
      for (int o = 1; o < CG; ++o) {
        const float* other = reinterpret_cast<const float*>(smem + L.warps + (ti + o * RT) * L.warp_bytes);
#pragma unroll
        for (int j = 0; j < 16; ++j) d1[j] += other[lane * kTileScratchLd + j];
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) diag[(ti * 16 + lane) * 16 + j] = d1[j];
    }
    __syncthreads();
    tile_factors<true>(Q, L.ldK, G, L.ldG, RB, Dp);   // Q . EQ
    tile_factors<false>(K, L.ldK, G, L.ldG, RB, Dp);  // K . EK
    __syncthreads();
    // V's columns over the gates (done with), while the tiles below the diagonal are made.
    stage_async<kGatedThreads>(V, L.ldN, v + std::size_t(r0) * Dv + col0, Dv, valid, Dv - col0, RB, kOutCols);
    __pipeline_commit();
#pragma unroll
    for (int u = 0; u < SJ; ++u) {
      const int J = cg * SJ + u;
      if (J >= ti) continue;
      warp_factors(f, Dk, Dp, [&](int d) {
        double x = 0;
        for (int t = J + 1; t < ti; ++t) x += tiles[t * Dp + d];
        return x;
      });
      mma_scaled_a<true, 1>(&sc.acc[0][u], Q + ti * 16 * L.ldK, L.ldK, f, K + J * 16 * L.ldK, L.ldK, Dp / 16, piece);
    }
  } else {
    if (threadIdx.x == 0) {
      row_sums<true, Fixed>(g + r0, lg, valid, RB, own);
      between[0] = 0.0;
    }
#pragma unroll
    for (int u = 0; u < SJ; ++u) {
      const int J = cg * SJ + u;
      if (J < RT && J <= ti) warp_mma<true, 1>(&sc.acc[0][u], Q + ti * 16 * L.ldK, L.ldK, K + J * 16 * L.ldK, L.ldK, Dp / 16);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
    const int J = cg * SJ + u, i = ti * 16 + r, j = J * 16 + c;
    if (J >= RT) return;
    if constexpr (Vector) {
      if (J != ti) S[i * L.ldS + j] = from_float<T>(J < ti ? x : 0.0f);
    } else {
      S[i * L.ldS + j] = from_float<T>(j <= i && i < valid ? x * expf(float(own[i] - own[j])) : 0.0f);
    }
  });
  if constexpr (Vector) {
    if (cg == 0 && lane < 16) {
      for (int j = 0; j < 16; ++j)
        S[(ti * 16 + lane) * L.ldS + ti * 16 + j] = from_float<T>(j <= lane ? diag[(ti * 16 + lane) * 16 + j] : 0.0f);
    }
  }
  __syncthreads();
  WarpBlock<T, 1, TN> acc;
  acc.zero();
  warp_mma<false, TN>(acc.acc[0], S + ti * 16 * L.ldS, L.ldS, V + cg * TN * 16, L.ldN, RT);
  __syncthreads();

  // ---- the key blocks before the own rows, nearest first ----
  for (int jb = at.rb - 1; jb >= 0; --jb) {
    const std::size_t j0 = std::size_t(jb) * RB;  // a whole block: only the chunk's last can be short
    stage_async<kGatedThreads>(K, L.ldK, k + j0 * Dk, Dk, RB, Dk, RB, Dp);
    stage_async<kGatedThreads>(V, L.ldN, v + j0 * Dv + col0, Dv, RB, Dv - col0, RB, kOutCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector) walked_factors<false>(K, L.ldK, g + j0 * W, W, RB, Dk, blk);  // K . EK (block end)
    else if (threadIdx.x == 0) blk[0] = row_sums<false, Fixed>(g + j0, lg, RB, RB, walk);
    __syncthreads();
    sc.zero();
    if (cg * SJ < RT) {
      if constexpr (Vector) {
        warp_factors(f, Dk, Dp, [&](int d) {  // the own tiles before ti and the blocks between
          double x = between[d];
          for (int t = 0; t < ti; ++t) x += tiles[t * Dp + d];
          return x;
        });
        mma_scaled_a<true, SJ>(sc.acc[0], Q + ti * 16 * L.ldK, L.ldK, f, K + cg * SJ * 16 * L.ldK, L.ldK, Dp / 16,
                               piece);
      } else {
        warp_mma<true, SJ>(sc.acc[0], Q + ti * 16 * L.ldK, L.ldK, K + cg * SJ * 16 * L.ldK, L.ldK, Dp / 16);
      }
    }
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int J = cg * SJ + u, i = ti * 16 + r, j = J * 16 + c;
      if (J >= RT) return;
      if constexpr (Vector) S[i * L.ldS + j] = from_float<T>(x);
      else S[i * L.ldS + j] = from_float<T>(i < valid ? x * expf(float(own[i] + between[0] + walk[j])) : 0.0f);
    });
    __syncthreads();
    warp_mma<false, TN>(acc.acc[0], S + ti * 16 * L.ldS, L.ldS, V + cg * TN * 16, L.ldN, RT);
    if constexpr (Vector) {
      for (int d = int(threadIdx.x); d < Dk; d += kGatedThreads) between[d] += blk[d];
    } else if (threadIdx.x == 0) {
      between[0] += blk[0];
    }
    __syncthreads();
  }

  // ---- the state term: Q . exp(b) times h_c, in 64-channel pieces ----
  if constexpr (Vector) {
    for (int e = int(threadIdx.x); e < RT * Dk; e += kGatedThreads) {
      const int t = e / Dk, d = e - t * Dk;
      double x = between[d];
      for (int u = 0; u < t; ++u) x += tiles[u * Dp + d];
      const float fq = expf(float(x));
      for (int r = t * 16; r < t * 16 + 16; ++r) Q[r * L.ldK + d] = from_float<T>(to_float(Q[r * L.ldK + d]) * fq);
    }
  } else {
    for (int r = warp; r < RB; r += kGatedWarps) {
      const float fq = expf(float(own[r] + between[0]));
      for (int d = lane; d < Dp; d += 32) Q[r * L.ldK + d] = from_float<T>(to_float(Q[r * L.ldK + d]) * fq);
    }
  }
  __syncthreads();
  const T* state = static_cast<const T*>(p.args.states) + ch.state;
  for (int pc = 0; pc < Dp; pc += 64) {
    stage_async<kGatedThreads>(Hs, L.ldN, state + std::size_t(pc) * Dv + col0, Dv, Dk - pc, Dv - col0, 64, kOutCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    warp_mma<false, TN>(acc.acc[0], Q + ti * 16 * L.ldK + pc, L.ldK, Hs + cg * TN * 16, L.ldN, min(64, Dp - pc) / 16);
    __syncthreads();
  }

  float* o = p.args.out + ch.value;
  each_lane(acc, scratch, [&](int t, int r, int c, float& x) {
    const int i = r0 + ti * 16 + r, col = col0 + cg * TN * 16 + t * 16 + c;
    if (i < ch.n && col < Dv) o[std::size_t(i) * Dv + col] = x * s.scale;
  });
}

template <class T, int Gates, int RB, int MinBlocks>
void launch_as(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
  auto kernel = gated_output_kernel<T, Gates, RB, MinBlocks>;
  allow_shared(kernel, device, shared);
  kernel<<<grid, kGatedThreads, shared, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

template <class T, int Gates, int RB, int MinBlocks>
int occupancy_as(std::size_t shared, int device) {
  auto kernel = gated_output_kernel<T, Gates, RB, MinBlocks>;
  allow_shared(kernel, device, shared);
  int blocks = 0;
  LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
  return blocks;
}

template <class T, int Gates, int RB, int MinBlocks>
struct Launch {
  static int run(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    launch_as<T, Gates, RB, MinBlocks>(params, grid, shared, device, stream);
    return 0;
  }
};

template <class T, int Gates, int RB, int MinBlocks>
struct Occupancy {
  static int run(std::size_t shared, int device) { return occupancy_as<T, Gates, RB, MinBlocks>(shared, device); }
};

}  // namespace

std::size_t gated_output_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block) {
  return output_layout(p.dim, rows_per_block, element_size(dtype), p.decay == Decay::vector).total;
}

int gated_output_occupancy(const Problem& p, Dtype dtype, GatedTiles tiles) {
  return dispatch_tiles<Occupancy>(dtype, gate_kind(p), tiles,
                             gated_output_shared_bytes(p, dtype, tiles.rows_per_block), current_device());
}

void gated_output(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedArgs& args, cudaStream_t stream) {
  const int device = current_device();
  const GatedTiles tiles = gated_tiles("output", p, dtype, max_shared_bytes(device));
  if (tiles.rows_per_block == 0) throw RuntimeFailure("chunked_gated: the output kernel's tiles do not fit");
  const GatedParams params{shape, args, (shape.C + tiles.rows_per_block - 1) / tiles.rows_per_block,
                           (shape.Dv + kOutCols - 1) / kOutCols};
  const dim3 grid(unsigned(std::size_t(shape.chunks) * shape.H * params.row_blocks * params.col_tiles));
  dispatch_tiles<Launch>(dtype, shape.gates, tiles, params, grid, gated_output_shared_bytes(p, dtype, tiles.rows_per_block),
                   device, stream);
}

}  // namespace lattn::cuda

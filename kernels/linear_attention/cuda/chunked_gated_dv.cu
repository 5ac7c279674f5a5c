// The gated chunked form's dV kernel (cuda/chunked_gated.hpp; docs/cuda.md, "Gated decays,
// chunked"): for a chunk with cumulative log-gates b, A_ij = sum_d q_id k_jd exp(b_id - b_jd)
// (i >= j) and dh_c the gradient of the state leaving it,
//   dV_j = s sum_{i >= j} A_ij do_i + (k_j . exp(b_last - b_j))^T dh_c
// The output kernel's structure transposed (cuda/chunked_gated_output.cu): one block of 8 warps
// per (chunk, value head, RB key rows, 128 value columns), the output tile in registers (warp w:
// key tile w % (RB/16)); the block walks the query blocks that see its keys, from its own to the
// chunk's last, one transposed score tile A^T (RB x RB) at a time, then adds the state term. Vector
// gates: exp(b_i - b_j) = EQ_i f EK_j as there, with f the sum of the tiles or blocks between; the
// diagonal 16 x 16 tiles element-wise (diagonal_scores); the state term's factor
// exp(b_last - b_j) = EK_j exp(the sum of the tiles and blocks after j's tile) scales K in place.
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

constexpr int kDvCols = 128;  // value columns per block

// Dynamic shared memory (bytes): own keys K (RB x Dk), queries Q (RB x Dk: the diagonal block's,
// then each walked block's), one region for in turn the own rows' vector gates (float), dO's
// columns with the transposed score tile, and a 64-row piece of dh_c; the gates' sums; the warps'.
struct DvLayout {
  int Dp, ldK, ldN, ldS, ldG;
  std::size_t k, q, x, d, s, diag, sums, warps, warp_bytes, total;
};

__host__ __device__ inline DvLayout dv_layout(int Dk, int RB, int es, bool vector) {
  DvLayout L{};
  L.Dp = round16(Dk);
  L.ldK = padded_ld(Dk, es);
  L.ldN = padded_ld(kDvCols, es);
  L.ldS = padded_ld(RB, es);
  L.ldG = padded_ld(Dk, 4);
  Carve c;
  L.k = c.take(std::size_t(RB) * L.ldK * es);
  L.q = c.take(std::size_t(RB) * L.ldK * es);
  const std::size_t d = align128(std::size_t(RB) * L.ldN * es), ds = d + align128(std::size_t(RB) * L.ldS * es);
  const std::size_t piece = std::size_t(64) * L.ldN * es, gates = vector ? std::size_t(RB) * L.ldG * 4 : 0;
  L.x = c.take(std::max(ds, std::max(piece, gates)));
  L.d = L.x;
  L.s = L.x + d;
  L.diag = c.take(vector ? sizeof(float) * RB * 16 : 0);  // the diagonal tiles' scores (vector gates)
  L.sums = c.take(sizeof(double) * (vector ? std::size_t(RB / 16 + 2) * L.Dp : std::size_t(2 * RB + 3)));
  L.warp_bytes = warp_area_bytes(vector ? L.Dp : 0);
  L.warps = c.take(kGatedWarps * L.warp_bytes);
  L.total = c.at;
  return L;
}

template <class T, int Gates, int RB, int MinBlocks>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_dv_kernel(GatedParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int RT = RB / 16, CG = kGatedWarps / RT, TN = kDvCols / 16 / CG, SI = (RT + CG - 1) / CG;
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const DvLayout L = dv_layout(s.Dk, RB, int(sizeof(T)), Vector);
  const BlockAt at = block_at(p);
  const ChunkRef& ch = at.ch;
  const int j0 = at.rb * RB;
  if (j0 >= ch.n) return;  // past a short chunk's end: the whole block, before any barrier
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, tj = warp % RT, cg = warp / RT;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W, Dp = L.Dp, valid = min(RB, ch.n - j0), blocks = (ch.n + RB - 1) / RB;
  const double lg = Fixed ? head_log_gate(s, at.h) : 0.0;  // fixed gates: every row's log-gate
  const int col0 = at.ct * kDvCols;
  T* K = reinterpret_cast<T*>(smem + L.k);
  T* Q = reinterpret_cast<T*>(smem + L.q);
  float* G = reinterpret_cast<float*>(smem + L.x);
  T* D = reinterpret_cast<T*>(smem + L.d);
  T* S = reinterpret_cast<T*>(smem + L.s);  // S[j][i] = s A_ij: rows are keys
  T* Hs = reinterpret_cast<T*>(smem + L.x);
  // Vector gates: tiles[t][d], between[d] (the walked blocks' so far), blk[d]. Scalar: own[r]
  // (prefix sums of the own rows), walk[r] (the walked block's prefix sums), between, blk, total.
  float* const diag = reinterpret_cast<float*>(smem + L.diag);  // [tile][query row][key]
  double* const sums = reinterpret_cast<double*>(smem + L.sums);
  double* const tiles = sums;
  double* const own = sums;
  double* const walk = sums + RB;
  double* const between = sums + (Vector ? RT * Dp : 2 * RB);
  double* const blk = between + (Vector ? Dp : 1);
  double* const own_total = blk + 1;  // scalar
  unsigned char* area = smem + L.warps + warp * L.warp_bytes;
  float* scratch = reinterpret_cast<float*>(area);
  T* piece = reinterpret_cast<T*>(area);
  float* f = reinterpret_cast<float*>(area + warp_area_bytes(0));

  const T* q = static_cast<const T*>(p.args.q) + ch.key;
  const T* k = static_cast<const T*>(p.args.k) + ch.key;
  const T* dO = static_cast<const T*>(p.args.dO) + ch.value;
  const float* g = p.args.g + ch.gate;
  const float scale = s.scale;

  // ---- the diagonal block: the own rows as keys and as queries ----
  stage_async<kGatedThreads>(K, L.ldK, k + std::size_t(j0) * Dk, Dk, valid, Dk, RB, Dp);
  stage_async<kGatedThreads>(Q, L.ldK, q + std::size_t(j0) * Dk, Dk, valid, Dk, RB, Dp);
  if constexpr (Vector)
    stage_async<kGatedThreads>(G, L.ldG, g + std::size_t(j0) * W, W, valid, Dk, RB, Dp);
  else
    stage_async<kGatedThreads>(D, L.ldN, dO + std::size_t(j0) * Dv + col0, Dv, valid, Dv - col0, RB, kDvCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  WarpBlock<T, 1, SI> sc;  // the warp's transposed score tiles: key tile tj, query tiles cg SI ..
  sc.zero();
  float d1[16];  // vector gates: this warp's part of the diagonal tile's scores, query row lane % 16
  if constexpr (Vector) {
    tile_sums_and_exp(G, L.ldG, RB, Dp, tiles);
    for (int d = int(threadIdx.x); d < Dp; d += kGatedThreads) between[d] = 0.0;
    __syncthreads();
    diagonal_scores(d1, Q, K, L.ldK, G, L.ldG, tj, Dp, cg * 2 + (lane >> 4), CG * 2);  // 8-channel groups
#pragma unroll
    for (int j = 0; j < 16; ++j) d1[j] += __shfl_xor_sync(0xffffffffu, d1[j], 16);
    if (cg > 0 && lane < 16) {
#pragma unroll
      for (int j = 0; j < 16; ++j) scratch[lane * kTileScratchLd + j] = d1[j];
    }
    __syncthreads();
    if (cg == 0 && lane < 16) {  // the parts' sum, kept in shared memory until the score tile is written
      for (int o = 1; o < CG; ++o) {
        const float* other = reinterpret_cast<const float*>(smem + L.warps + (tj + o * RT) * L.warp_bytes);
#pragma unroll
        for (int j = 0; j < 16; ++j) d1[j] += other[lane * kTileScratchLd + j];
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) diag[(tj * 16 + lane) * 16 + j] = d1[j];
    }
    __syncthreads();
    tile_factors<true>(Q, L.ldK, G, L.ldG, RB, Dp);   // Q . EQ
    tile_factors<false>(K, L.ldK, G, L.ldG, RB, Dp);  // K . EK
    __syncthreads();
    stage_async<kGatedThreads>(D, L.ldN, dO + std::size_t(j0) * Dv + col0, Dv, valid, Dv - col0, RB, kDvCols);
    __pipeline_commit();
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I <= tj || I >= RT) continue;
      warp_factors(f, Dk, Dp, [&](int d) {
        double x = 0;
        for (int t = tj + 1; t < I; ++t) x += tiles[t * Dp + d];
        return x;
      });
      mma_scaled_a<true, 1>(&sc.acc[0][u], K + tj * 16 * L.ldK, L.ldK, f, Q + I * 16 * L.ldK, L.ldK, Dp / 16, piece);
    }
  } else {
    if (threadIdx.x == 0) {
      own_total[0] = row_sums<true, Fixed>(g + j0, lg, valid, RB, own);
      between[0] = 0.0;
    }
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I < RT && I >= tj) warp_mma<true, 1>(&sc.acc[0][u], K + tj * 16 * L.ldK, L.ldK, Q + I * 16 * L.ldK, L.ldK, Dp / 16);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
    const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
    if (I >= RT) return;
    if constexpr (Vector) {
      if (I != tj) S[j * L.ldS + i] = from_float<T>(I > tj ? scale * x : 0.0f);
    } else {
      S[j * L.ldS + i] = from_float<T>(j <= i && i < valid ? scale * x * expf(float(own[i] - own[j])) : 0.0f);
    }
  });
  if constexpr (Vector) {
    if (cg == 0 && lane < 16) {  // query row lane's scores against the tile's keys jj <= lane
      for (int jj = 0; jj < 16; ++jj)
        S[(tj * 16 + jj) * L.ldS + tj * 16 + lane] =
            from_float<T>(jj <= lane ? scale * diag[(tj * 16 + lane) * 16 + jj] : 0.0f);
    }
  }
  __syncthreads();
  WarpBlock<T, 1, TN> acc;
  acc.zero();
  warp_mma<false, TN>(acc.acc[0], S + tj * 16 * L.ldS, L.ldS, D + cg * TN * 16, L.ldN, RT);
  __syncthreads();

  // ---- the query blocks after the own rows, nearest first ----
  for (int ib = at.rb + 1; ib < blocks; ++ib) {
    const std::size_t i0 = std::size_t(ib) * RB;
    const int rows = min(RB, ch.n - int(i0));
    stage_async<kGatedThreads>(Q, L.ldK, q + i0 * Dk, Dk, rows, Dk, RB, Dp);
    stage_async<kGatedThreads>(D, L.ldN, dO + i0 * Dv + col0, Dv, rows, Dv - col0, RB, kDvCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector) walked_factors<true>(Q, L.ldK, g + i0 * W, W, rows, Dk, blk);  // Q . EQ (block start)
    else if (threadIdx.x == 0) blk[0] = row_sums<true, Fixed>(g + i0, lg, rows, RB, walk);
    __syncthreads();
    sc.zero();
    if (cg * SI < RT) {
      if constexpr (Vector) {
        warp_factors(f, Dk, Dp, [&](int d) {  // the own tiles after tj and the blocks between
          double x = between[d];
          for (int t = tj + 1; t < RT; ++t) x += tiles[t * Dp + d];
          return x;
        });
        mma_scaled_a<true, SI>(sc.acc[0], K + tj * 16 * L.ldK, L.ldK, f, Q + cg * SI * 16 * L.ldK, L.ldK, Dp / 16,
                               piece);
      } else {
        warp_mma<true, SI>(sc.acc[0], K + tj * 16 * L.ldK, L.ldK, Q + cg * SI * 16 * L.ldK, L.ldK, Dp / 16);
      }
    }
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
      if (I >= RT) return;
      if constexpr (Vector) {
        S[j * L.ldS + i] = from_float<T>(scale * x);
      } else {
        const double after_j = own_total[0] - own[j];
        S[j * L.ldS + i] = from_float<T>(i < rows ? scale * x * expf(float(after_j + between[0] + walk[i])) : 0.0f);
      }
    });
    __syncthreads();
    warp_mma<false, TN>(acc.acc[0], S + tj * 16 * L.ldS, L.ldS, D + cg * TN * 16, L.ldN, RT);
    if constexpr (Vector) {
      for (int d = int(threadIdx.x); d < Dk; d += kGatedThreads) between[d] += blk[d];
    } else if (threadIdx.x == 0) {
      between[0] += blk[0];
    }
    __syncthreads();
  }

  // ---- the state term: K . exp(b_last - b) times dh_c, in 64-channel pieces ----
  if constexpr (Vector) {
    for (int e = int(threadIdx.x); e < RT * Dk; e += kGatedThreads) {
      const int t = e / Dk, d = e - t * Dk;
      double x = between[d];
      for (int u = t + 1; u < RT; ++u) x += tiles[u * Dp + d];
      const float fk = expf(float(x));
      for (int r = t * 16; r < t * 16 + 16; ++r) K[r * L.ldK + d] = from_float<T>(to_float(K[r * L.ldK + d]) * fk);
    }
  } else {
    for (int r = warp; r < RB; r += kGatedWarps) {
      const float fk = expf(float(own_total[0] - own[r] + between[0]));
      for (int d = lane; d < Dp; d += 32) K[r * L.ldK + d] = from_float<T>(to_float(K[r * L.ldK + d]) * fk);
    }
  }
  __syncthreads();
  const T* dstate = static_cast<const T*>(p.args.states) + ch.state;
  for (int pc = 0; pc < Dp; pc += 64) {
    stage_async<kGatedThreads>(Hs, L.ldN, dstate + std::size_t(pc) * Dv + col0, Dv, Dk - pc, Dv - col0, 64, kDvCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    warp_mma<false, TN>(acc.acc[0], K + tj * 16 * L.ldK + pc, L.ldK, Hs + cg * TN * 16, L.ldN, min(64, Dp - pc) / 16);
    __syncthreads();
  }

  float* dv = p.args.out + ch.value;
  each_lane(acc, scratch, [&](int t, int r, int c, float& x) {
    const int j = j0 + tj * 16 + r, col = col0 + cg * TN * 16 + t * 16 + c;
    if (j < ch.n && col < Dv) dv[std::size_t(j) * Dv + col] = x;
  });
}

template <class T, int Gates, int RB, int MinBlocks>
struct Launch {
  static int run(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    auto kernel = gated_dv_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    kernel<<<grid, kGatedThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
    return 0;
  }
};

template <class T, int Gates, int RB, int MinBlocks>
struct Occupancy {
  static int run(std::size_t shared, int device) {
    auto kernel = gated_dv_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    int blocks = 0;
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
    return blocks;
  }
};

}  // namespace

std::size_t gated_dv_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block) {
  return dv_layout(p.dim, rows_per_block, element_size(dtype), p.decay == Decay::vector).total;
}

int gated_dv_occupancy(const Problem& p, Dtype dtype, GatedTiles tiles) {
  return dispatch_tiles<Occupancy>(dtype, gate_kind(p), tiles,
                                   gated_dv_shared_bytes(p, dtype, tiles.rows_per_block), current_device());
}

void gated_dv(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedArgs& args, cudaStream_t stream) {
  const int device = current_device();
  const GatedTiles tiles = gated_tiles("dv", p, dtype, max_shared_bytes(device));
  if (tiles.rows_per_block == 0) throw RuntimeFailure("chunked_gated: the dV kernel's tiles do not fit");
  const GatedParams params{shape, args, (shape.C + tiles.rows_per_block - 1) / tiles.rows_per_block,
                           (shape.Dv + kDvCols - 1) / kDvCols};
  const dim3 grid(unsigned(std::size_t(shape.chunks) * shape.H * params.row_blocks * params.col_tiles));
  dispatch_tiles<Launch>(dtype, shape.gates, tiles, params, grid, gated_dv_shared_bytes(p, dtype, tiles.rows_per_block),
                         device, stream);
}

}  // namespace lattn::cuda

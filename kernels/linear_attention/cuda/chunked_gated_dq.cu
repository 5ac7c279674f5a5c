// The gated chunked form's dQ kernel (cuda/chunked_gated.hpp; docs/cuda.md, "Gated decays,
// chunked"): for a chunk with cumulative log-gates b, dA_ij = s do_i . v_j (i >= j) and h_c the
// state entering it,
//   dQ_id = s exp(b_id) (dO_i h_c^T)_d + sum_{j <= i} dA_ij k_jd exp(b_id - b_jd)
// (scalar gates: the factor of dA_ij is a mask, and the state term's a factor per row). It owns RB
// query rows and walks the key blocks from its own down to the chunk's first (dK, which walks the
// other way, is computed with dV: cuda/chunked_gated_dkv.cu). One block of 8 warps per (chunk,
// value head, RB own rows, 64 key channels), the output tile in registers (warp w: own tile
// w % (RB/16), channels of group w / (RB/16)); per walked block one dA tile (RB x RB, from dO and
// V, gate-free) in shared memory.
//
// Vector gates: the gates sit on the output's channels, so the factors split as
// exp(b_i - b_j) = EQ_i f EK_j with EQ the output's common factor, applied once at the end; the
// keys are scaled once in shared memory (K . EK), and f (the sum of the tiles or blocks between,
// per channel) per warp on the way to the tensor cores (mma_scaled_b), as is the state term's
// channel factor (s exp(b before the own tile)). The diagonal 16 x 16 tiles are made element-wise
// on the FMA units (diagonal_dq: running products of exp(g)) and added after the common factor.
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

constexpr int kDqCols = 64;  // key channels per block

// Dynamic shared memory (bytes): the own rows of the dA product (dO), the walked rows (V; 64 rows
// of h_c for the state term), the walked rows' channels (K), the own rows' gates on the block's
// channels (float), the dA tile (rows: own), the gates' sums, the warps' areas.
struct DqLayout {
  int Dvp, ldV, ldC, ldG, ldS;
  std::size_t own, wb, ws, g, da, sums, warps, warp_bytes, total;
};

__host__ __device__ inline DqLayout dq_layout(int Dv, int RB, int es, bool vector) {
  DqLayout L{};
  L.Dvp = round16(Dv);
  L.ldV = padded_ld(Dv, es);
  L.ldC = padded_ld(kDqCols, es);
  L.ldG = padded_ld(kDqCols, 4);
  L.ldS = padded_ld(RB, es);
  Carve c;
  L.own = c.take(std::size_t(RB) * L.ldV * es);
  L.wb = c.take(std::size_t(RB > kDqCols ? RB : kDqCols) * L.ldV * es);
  L.ws = c.take(std::size_t(RB) * L.ldC * es);
  L.g = c.take(vector ? std::size_t(RB) * L.ldG * 4 : 0);
  L.da = c.take(std::size_t(RB) * L.ldS * es);
  L.sums = c.take(sizeof(double) * (vector ? std::size_t(RB / 16 + 2) * kDqCols : std::size_t(2 * RB + 3)));
  L.warp_bytes = warp_area_bytes(vector ? kDqCols : 0);
  L.warps = c.take(kGatedWarps * L.warp_bytes);
  L.total = c.at;
  return L;
}

template <class T, int Gates, int RB, int MinBlocks>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_dq_kernel(GatedParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int RT = RB / 16, CG = kGatedWarps / RT, TN = kDqCols / 16 / CG, SX = (RT + CG - 1) / CG;
  constexpr int NW = 16 * TN;  // the warp's channels
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const DqLayout L = dq_layout(s.Dv, RB, int(sizeof(T)), Vector);
  const BlockAt at = block_at(p);
  const ChunkRef& ch = at.ch;
  const int o0 = at.rb * RB;  // the own rows: queries
  if (o0 >= ch.n) return;  // past a short chunk's end: the whole block, before any barrier
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, to = warp % RT, cg = warp / RT;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W, Dvp = L.Dvp, valid = min(RB, ch.n - o0);
  const double lg = Fixed ? head_log_gate(s, at.h) : 0.0;  // fixed gates: every row's log-gate
  const int c0 = at.ct * kDqCols, cols = min(kDqCols, Dk - c0), wc = cg * NW;  // wc: the warp's first
  T* Own = reinterpret_cast<T*>(smem + L.own);
  T* Wb = reinterpret_cast<T*>(smem + L.wb);
  T* Ws = reinterpret_cast<T*>(smem + L.ws);
  float* G = reinterpret_cast<float*>(smem + L.g);
  T* dA = reinterpret_cast<T*>(smem + L.da);
  // Vector gates: tiles[t][col], between[col], blk[col]. Scalar: own[r] (prefix sums of the own
  // rows), walk[r] (the walked block's suffix sums), between, blk, own_total.
  double* const sums = reinterpret_cast<double*>(smem + L.sums);
  double* const tiles = sums;
  double* const own = sums;
  double* const walk = sums + RB;
  double* const between = sums + (Vector ? RT * kDqCols : 2 * RB);
  double* const blk = between + (Vector ? kDqCols : 1);
  double* const own_total = blk + 1;
  unsigned char* area = smem + L.warps + warp * L.warp_bytes;
  float* scratch = reinterpret_cast<float*>(area);
  T* piece = reinterpret_cast<T*>(area);
  float* f = reinterpret_cast<float*>(area + warp_area_bytes(0));

  // Own rows of the dA product, walked rows, walked channels: dO; V, K.
  const T* own_src = static_cast<const T*>(p.args.dO) + ch.value;
  const T* wb_src = static_cast<const T*>(p.args.v) + ch.value;
  const T* ws_src = static_cast<const T*>(p.args.k) + ch.key + c0;
  const float* g = p.args.g + ch.gate;
  const float scale = s.scale;
  // Gates between two tiles of the own block (exclusive), per channel of the block.
  auto tiles_between = [&](int lo, int hi, int col) {
    double x = 0;
    for (int t = lo + 1; t < hi; ++t) x += tiles[t * kDqCols + col];
    return x;
  };
  // The own block's gates from its start to the row before tile `to`.
  auto own_outside = [&](int col) { return tiles_between(-1, to, col); };

  // ---- the own rows and their gates ----
  stage_async<kGatedThreads>(Own, L.ldV, own_src + std::size_t(o0) * Dv, Dv, valid, Dv, RB, Dvp);
  if constexpr (Vector)
    stage_async<kGatedThreads>(G, L.ldG, g + std::size_t(o0) * W + c0, W, valid, cols, RB, kDqCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  if constexpr (Vector) {
    tile_sums_and_exp(G, L.ldG, RB, kDqCols, tiles);
    for (int d = int(threadIdx.x); d < kDqCols; d += kGatedThreads) between[d] = 0.0;
  } else if (threadIdx.x == 0) {
    own_total[0] = row_sums<true, Fixed>(g + o0, lg, valid, RB, own);
    between[0] = 0.0;
  }
  __syncthreads();

  WarpBlock<T, 1, SX> sc;  // the warp's dA tiles: own tile `to`, other tiles cg SX ..
  // dA into shared memory, each element times weight(own row, other row) (0: masked).
  auto write_da = [&](auto&& weight) {
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int X = cg * SX + u;
      if (X < RT) dA[(to * 16 + r) * L.ldS + X * 16 + c] = from_float<T>(x * weight(to * 16 + r, X * 16 + c));
    });
  };
  WarpBlock<T, 1, TN> acc;
  acc.zero();

  // ---- the walked blocks: the key blocks before, nearest first ----
  for (int wbk = at.rb - 1; wbk >= 0; --wbk) {
    const std::size_t w0 = std::size_t(wbk) * RB;
    const int rows = min(RB, ch.n - int(w0));
    stage_async<kGatedThreads>(Wb, L.ldV, wb_src + w0 * Dv, Dv, rows, Dv, RB, Dvp);
    stage_async<kGatedThreads>(Ws, L.ldC, ws_src + w0 * Dk, Dk, rows, cols, RB, kDqCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector) walked_factors<false>(Ws, L.ldC, g + w0 * W + c0, W, rows, cols, blk);
    else if (threadIdx.x == 0) blk[0] = row_sums<false, Fixed>(g + w0, lg, rows, RB, walk);
    sc.zero();
    if (cg * SX < RT) warp_mma<true, SX>(sc.acc[0], Own + to * 16 * L.ldV, L.ldV, Wb + cg * SX * 16 * L.ldV, L.ldV, Dvp / 16);
    __syncthreads();  // blk and walk are written
    write_da([&](int o, int w) {
      if constexpr (Vector) return scale;
      // Scalar gates, b_i - b_j: the own rows up to the query, the blocks between, the walked
      // rows after the key.
      return scale * expf(float(own[o] + between[0] + walk[w]));
    });
    __syncthreads();
    if constexpr (Vector) {
      warp_factors(f, NW, NW, [&](int n) { return own_outside(wc + n) + between[wc + n]; });
      mma_scaled_b<false, TN>(acc.acc[0], dA + to * 16 * L.ldS, L.ldS, Ws + wc, L.ldC, f, RT, piece);
    } else {
      warp_mma<false, TN>(acc.acc[0], dA + to * 16 * L.ldS, L.ldS, Ws + wc, L.ldC, RT);
    }
    __syncthreads();
    if constexpr (Vector) {
      for (int d = int(threadIdx.x); d < cols; d += kGatedThreads) between[d] += blk[d];
    } else if (threadIdx.x == 0) {
      between[0] += blk[0];
    }
    __syncthreads();
  }

  // ---- the diagonal block, after the walked ones: its 16 x 16 tiles' share (vector gates) is
  // added after the common factor, and so lives in registers only from here on ----
  stage_async<kGatedThreads>(Wb, L.ldV, wb_src + std::size_t(o0) * Dv, Dv, valid, Dv, RB, Dvp);
  stage_async<kGatedThreads>(Ws, L.ldC, ws_src + std::size_t(o0) * Dk, Dk, valid, cols, RB, kDqCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  sc.zero();
#pragma unroll
  for (int u = 0; u < SX; ++u) {
    const int X = cg * SX + u;
    if (X < RT && X <= to)
      warp_mma<true, 1>(&sc.acc[0][u], Own + to * 16 * L.ldV, L.ldV, Wb + X * 16 * L.ldV, L.ldV, Dvp / 16);
  }
  write_da([&](int i, int j) {  // the query row at or after the key row; scalar gates: exp(b_i - b_j)
    if (i < j) return 0.0f;
    return Vector ? scale : scale * expf(float(own[i] - own[j]));
  });
  __syncthreads();

  float diag[8 * TN];  // vector gates: the diagonal tile's share, added after the common factor
  if constexpr (Vector) {
    diagonal_dq<TN>(diag, dA, L.ldS, Ws, L.ldC, G, L.ldG, to, wc);
    __syncthreads();
    tile_factors<false>(Ws, L.ldC, G, L.ldG, RB, kDqCols);  // K . EK
    tile_products<true>(G, L.ldG, RB, kDqCols);            // the output's factor EQ
    __syncthreads();
    for (int X = 0; X < to; ++X) {  // the other tiles of the block on the causal side
      warp_factors(f, NW, NW, [&](int n) { return tiles_between(min(X, to), max(X, to), wc + n); });
      mma_scaled_b<false, TN>(acc.acc[0], dA + to * 16 * L.ldS + X * 16, L.ldS, Ws + X * 16 * L.ldC + wc, L.ldC, f, 1,
                              piece);
    }
  } else {
    warp_mma<false, TN>(acc.acc[0], dA + to * 16 * L.ldS, L.ldS, Ws + wc, L.ldC, RT);
  }
  __syncthreads();  // the diagonal block's reads of Wb are done

  // ---- the state term: dO h_c^T, times s exp(b) ----
  const T* state = static_cast<const T*>(p.args.states) + ch.state + std::size_t(c0) * Dv;
  stage_async<kGatedThreads>(Wb, L.ldV, state, Dv, cols, Dv, kDqCols, Dvp);  // its rows: the block's channels
  __pipeline_commit();
  if constexpr (!Vector) {
    for (int r = warp; r < RB; r += kGatedWarps) {
      const float fr = scale * expf(float(own[r] + between[0]));
      for (int d = lane; d < Dvp; d += 32) Own[r * L.ldV + d] = from_float<T>(to_float(Own[r * L.ldV + d]) * fr);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  if constexpr (Vector) {
    warp_factors(f, NW, NW, [&](int n) { return own_outside(wc + n) + between[wc + n]; });
    for (int n = lane; n < NW; n += 32) f[n] *= scale;  // s exp(b before the own tile)
    __syncwarp();
    mma_scaled_b<true, TN>(acc.acc[0], Own + to * 16 * L.ldV, L.ldV, Wb + wc * L.ldV, L.ldV, f, Dvp / 16, piece);
  } else {
    warp_mma<true, TN>(acc.acc[0], Own + to * 16 * L.ldV, L.ldV, Wb + wc * L.ldV, L.ldV, Dvp / 16);
  }

  float* out = p.args.out + ch.key_part + c0;
  each_lane(acc, scratch, [&](int t, int r, int c, float& x) {
    const int row = to * 16 + r, col = wc + t * 16 + c;
    float v = x;
    if constexpr (Vector) v = x * G[row * L.ldG + col] + diag[t * 8 + (c & 7)];
    if (o0 + row < ch.n && col < cols) out[std::size_t(o0 + row) * Dk + col] = v;
  });
}

template <class T, int Gates, int RB, int MinBlocks>
struct Launch {
  static int run(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    auto kernel = gated_dq_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    kernel<<<grid, kGatedThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
    return 0;
  }
};

template <class T, int Gates, int RB, int MinBlocks>
struct Occupancy {
  static int run(std::size_t shared, int device) {
    auto kernel = gated_dq_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    int blocks = 0;
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
    return blocks;
  }
};

}  // namespace

std::size_t gated_dq_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block) {
  return dq_layout(p.value_dim(), rows_per_block, element_size(dtype), p.decay == Decay::vector).total;
}

int gated_dq_occupancy(const Problem& p, Dtype dtype, GatedTiles tiles) {
  return dispatch_tiles<Occupancy>(dtype, gate_kind(p), tiles, gated_dq_shared_bytes(p, dtype, tiles.rows_per_block),
                                   current_device());
}

void gated_dq(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedArgs& args, cudaStream_t stream) {
  const int device = current_device();
  const GatedTiles tiles = gated_tiles("dq", p, dtype, max_shared_bytes(device));
  if (tiles.rows_per_block == 0) throw RuntimeFailure("chunked_gated: the dQ kernel's tiles do not fit");
  const GatedParams params{shape, args, (shape.C + tiles.rows_per_block - 1) / tiles.rows_per_block,
                           (shape.Dk + kDqCols - 1) / kDqCols};
  const dim3 grid(unsigned(std::size_t(shape.chunks) * shape.H * params.row_blocks * params.col_tiles));
  dispatch_tiles<Launch>(dtype, shape.gates, tiles, params, grid, gated_dq_shared_bytes(p, dtype, tiles.rows_per_block),
                         device, stream);
}

}  // namespace lattn::cuda

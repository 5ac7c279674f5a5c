// The gated chunked form's dQ and dK kernel (cuda/chunked_gated.hpp; docs/cuda.md, "Gated
// decays, chunked"): for a chunk with cumulative log-gates b, dA_ij = s do_i . v_j (i >= j), h_c the
// state entering it and dh_c the gradient of the state leaving it,
//   dQ_id = s exp(b_id) (dO_i h_c^T)_d + sum_{j <= i} dA_ij k_jd exp(b_id - b_jd)
//   dK_jd = exp(b_last,d - b_jd) (V_j dh_c^T)_d + sum_{i >= j} dA_ij q_id exp(b_id - b_jd)
// (scalar gates: the factor of dA_ij is a mask, and the state terms' a factor per row). One
// template, two launches: dQ (DK false) owns RB query rows and walks the key blocks from its own
// down to the chunk's first; dK owns RB key rows and walks the query blocks from its own to the
// chunk's last. One block of 8 warps per (chunk, value head, RB own rows, 64 key channels), the
// output tile in registers (warp w: own tile w % (RB/16), channels of group w / (RB/16)); per
// walked block one dA tile (RB x RB, from dO and V, gate-free) in shared memory.
//
// Vector gates: the gates sit on the output's channels, so the factors split as
// exp(b_i - b_j) = EQ_i f EK_j with EQ (dQ) or EK (dK) the output's common factor, applied once
// at the end; the other side's rows are scaled once in shared memory (K . EK, Q . EQ), and f (the
// sum of the tiles or blocks between, per channel) per warp on the way to the tensor cores
// (mma_scaled_b), as is the state term's channel factor (s exp(b before the own tile), or
// exp(b_last - b at its end)). The diagonal 16 x 16 tiles are made element-wise on the FMA units
// (diagonal_dq, diagonal_dk: running products of exp(g)) and added after the common factor.
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

constexpr int kDqkCols = 64;  // key channels per block

// Dynamic shared memory (bytes): the own rows of the dA product (dQ: dO; dK: V), the walked rows
// (dQ: V; dK: dO; 64 rows of h_c or dh_c for the state term), the walked rows' channels (dQ: K;
// dK: Q), the own rows' gates on the block's channels (float), the dA tile (rows: own), the gates'
// sums, the warps' areas.
struct DqkLayout {
  int Dvp, ldV, ldC, ldG, ldS;
  std::size_t own, wb, ws, g, da, sums, warps, warp_bytes, total;
};

__host__ __device__ inline DqkLayout dqk_layout(int Dv, int RB, int es, bool vector) {
  DqkLayout L{};
  L.Dvp = round16(Dv);
  L.ldV = padded_ld(Dv, es);
  L.ldC = padded_ld(kDqkCols, es);
  L.ldG = padded_ld(kDqkCols, 4);
  L.ldS = padded_ld(RB, es);
  Carve c;
  L.own = c.take(std::size_t(RB) * L.ldV * es);
  L.wb = c.take(std::size_t(RB > kDqkCols ? RB : kDqkCols) * L.ldV * es);
  L.ws = c.take(std::size_t(RB) * L.ldC * es);
  L.g = c.take(vector ? std::size_t(RB) * L.ldG * 4 : 0);
  L.da = c.take(std::size_t(RB) * L.ldS * es);
  L.sums = c.take(sizeof(double) * (vector ? std::size_t(RB / 16 + 2) * kDqkCols : std::size_t(2 * RB + 3)));
  L.warp_bytes = warp_area_bytes(vector ? kDqkCols : 0);
  L.warps = c.take(kGatedWarps * L.warp_bytes);
  L.total = c.at;
  return L;
}

template <class T, int Gates, int RB, int MinBlocks, bool DK>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_dqk_kernel(GatedParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int RT = RB / 16, CG = kGatedWarps / RT, TN = kDqkCols / 16 / CG, SX = (RT + CG - 1) / CG;
  constexpr int NW = 16 * TN;  // the warp's channels
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const DqkLayout L = dqk_layout(s.Dv, RB, int(sizeof(T)), Vector);
  const BlockAt at = block_at(p);
  const ChunkRef& ch = at.ch;
  const int o0 = at.rb * RB;  // the own rows: queries (dQ) or keys (dK)
  if (o0 >= ch.n) return;  // past a short chunk's end: the whole block, before any barrier
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, to = warp % RT, cg = warp / RT;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W, Dvp = L.Dvp, valid = min(RB, ch.n - o0), blocks = (ch.n + RB - 1) / RB;
  const double lg = Fixed ? head_log_gate(s, at.h) : 0.0;  // fixed gates: every row's log-gate
  const int c0 = at.ct * kDqkCols, cols = min(kDqkCols, Dk - c0), wc = cg * NW;  // wc: the warp's first
  T* Own = reinterpret_cast<T*>(smem + L.own);
  T* Wb = reinterpret_cast<T*>(smem + L.wb);
  T* Ws = reinterpret_cast<T*>(smem + L.ws);
  float* G = reinterpret_cast<float*>(smem + L.g);
  T* dA = reinterpret_cast<T*>(smem + L.da);
  // Vector gates: tiles[t][col], between[col], blk[col]. Scalar: own[r] (prefix sums of the own
  // rows), walk[r] (the walked block's: suffix sums for dQ's keys, prefix for dK's queries),
  // between, blk, own_total.
  double* const sums = reinterpret_cast<double*>(smem + L.sums);
  double* const tiles = sums;
  double* const own = sums;
  double* const walk = sums + RB;
  double* const between = sums + (Vector ? RT * kDqkCols : 2 * RB);
  double* const blk = between + (Vector ? kDqkCols : 1);
  double* const own_total = blk + 1;
  unsigned char* area = smem + L.warps + warp * L.warp_bytes;
  float* scratch = reinterpret_cast<float*>(area);
  T* piece = reinterpret_cast<T*>(area);
  float* f = reinterpret_cast<float*>(area + warp_area_bytes(0));

  // Own rows of the dA product, walked rows, walked channels: dQ: dO; V, K. dK: V; dO, Q.
  const T* own_src = static_cast<const T*>(DK ? p.args.v : p.args.dO) + ch.value;
  const T* wb_src = static_cast<const T*>(DK ? p.args.dO : p.args.v) + ch.value;
  const T* ws_src = static_cast<const T*>(DK ? p.args.q : p.args.k) + ch.key + c0;
  const float* g = p.args.g + ch.gate;
  const float scale = s.scale;
  // Gates between two tiles of the own block (exclusive), per channel of the block.
  auto tiles_between = [&](int lo, int hi, int col) {
    double x = 0;
    for (int t = lo + 1; t < hi; ++t) x += tiles[t * kDqkCols + col];
    return x;
  };
  // The own block's gates from its start to the row before tile `to` (dQ), or after tile `to`'s
  // end to its end (dK).
  auto own_outside = [&](int col) { return DK ? tiles_between(to, RT, col) : tiles_between(-1, to, col); };

  // ---- the own rows and their gates ----
  stage_async<kGatedThreads>(Own, L.ldV, own_src + std::size_t(o0) * Dv, Dv, valid, Dv, RB, Dvp);
  if constexpr (Vector)
    stage_async<kGatedThreads>(G, L.ldG, g + std::size_t(o0) * W + c0, W, valid, cols, RB, kDqkCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  if constexpr (Vector) {
    tile_sums_and_exp(G, L.ldG, RB, kDqkCols, tiles);
    for (int d = int(threadIdx.x); d < kDqkCols; d += kGatedThreads) between[d] = 0.0;
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

  // ---- the walked blocks: dQ the key blocks before, dK the query blocks after, nearest first ----
  for (int wbk = DK ? at.rb + 1 : at.rb - 1; DK ? wbk < blocks : wbk >= 0; wbk += DK ? 1 : -1) {
    const std::size_t w0 = std::size_t(wbk) * RB;
    const int rows = min(RB, ch.n - int(w0));
    stage_async<kGatedThreads>(Wb, L.ldV, wb_src + w0 * Dv, Dv, rows, Dv, RB, Dvp);
    stage_async<kGatedThreads>(Ws, L.ldC, ws_src + w0 * Dk, Dk, rows, cols, RB, kDqkCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector) walked_factors<DK>(Ws, L.ldC, g + w0 * W + c0, W, rows, cols, blk);
    else if (threadIdx.x == 0) blk[0] = row_sums<DK, Fixed>(g + w0, lg, rows, RB, walk);
    sc.zero();
    if (cg * SX < RT) warp_mma<true, SX>(sc.acc[0], Own + to * 16 * L.ldV, L.ldV, Wb + cg * SX * 16 * L.ldV, L.ldV, Dvp / 16);
    __syncthreads();  // blk and walk are written
    write_da([&](int o, int w) {
      if constexpr (Vector) return scale;
      // Scalar gates, b_i - b_j: the own rows up to the query (dQ) or after the key (dK), the
      // blocks between, the walked rows after the key (dQ) or up to the query (dK).
      const double own_part = DK ? own_total[0] - own[o] : own[o];
      return scale * expf(float(own_part + between[0] + walk[w]));
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
  stage_async<kGatedThreads>(Ws, L.ldC, ws_src + std::size_t(o0) * Dk, Dk, valid, cols, RB, kDqkCols);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  sc.zero();
#pragma unroll
  for (int u = 0; u < SX; ++u) {
    const int X = cg * SX + u;
    if (X < RT && (DK ? X >= to : X <= to))
      warp_mma<true, 1>(&sc.acc[0][u], Own + to * 16 * L.ldV, L.ldV, Wb + X * 16 * L.ldV, L.ldV, Dvp / 16);
  }
  write_da([&](int o, int w) {  // the query row at or after the key row; scalar gates: exp(b_i - b_j)
    const int i = DK ? w : o, j = DK ? o : w;
    if (i < j) return 0.0f;
    return Vector ? scale : scale * expf(float(own[i] - own[j]));
  });
  __syncthreads();

  float diag[8 * TN];  // vector gates: the diagonal tile's share, added after the common factor
  if constexpr (Vector) {
    if (DK)
      diagonal_dk<TN>(diag, dA, L.ldS, Ws, L.ldC, G, L.ldG, to, wc);
    else
      diagonal_dq<TN>(diag, dA, L.ldS, Ws, L.ldC, G, L.ldG, to, wc);
    __syncthreads();
    tile_factors<DK>(Ws, L.ldC, G, L.ldG, RB, kDqkCols);  // dQ: K . EK; dK: Q . EQ
    tile_products<!DK>(G, L.ldG, RB, kDqkCols);          // the output's factor: dQ EQ, dK EK
    __syncthreads();
    for (int X = 0; X < RT; ++X) {  // the other tiles of the block on the causal side
      if (DK ? X <= to : X >= to) continue;
      warp_factors(f, NW, NW, [&](int n) { return tiles_between(min(X, to), max(X, to), wc + n); });
      mma_scaled_b<false, TN>(acc.acc[0], dA + to * 16 * L.ldS + X * 16, L.ldS, Ws + X * 16 * L.ldC + wc, L.ldC, f, 1,
                              piece);
    }
  } else {
    warp_mma<false, TN>(acc.acc[0], dA + to * 16 * L.ldS, L.ldS, Ws + wc, L.ldC, RT);
  }
  __syncthreads();  // the diagonal block's reads of Wb are done

  // ---- the state term: dO h_c^T (dQ, times s exp(b)) or V dh_c^T (dK, times exp(b_last - b)) ----
  const T* state = static_cast<const T*>(p.args.states) + ch.state + std::size_t(c0) * Dv;
  stage_async<kGatedThreads>(Wb, L.ldV, state, Dv, cols, Dv, kDqkCols, Dvp);  // its rows: the block's channels
  __pipeline_commit();
  if constexpr (!Vector) {
    for (int r = warp; r < RB; r += kGatedWarps) {
      const float fr = DK ? expf(float(own_total[0] - own[r] + between[0])) : scale * expf(float(own[r] + between[0]));
      for (int d = lane; d < Dvp; d += 32) Own[r * L.ldV + d] = from_float<T>(to_float(Own[r * L.ldV + d]) * fr);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  if constexpr (Vector) {
    warp_factors(f, NW, NW, [&](int n) { return own_outside(wc + n) + between[wc + n]; });
    if (!DK) {  // s exp(b before the own tile)
      for (int n = lane; n < NW; n += 32) f[n] *= scale;
      __syncwarp();
    }
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

template <bool DK>
struct Pass {
  template <class T, int Gates, int RB, int MinBlocks>
  struct Launch {
    static int run(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
      auto kernel = gated_dqk_kernel<T, Gates, RB, MinBlocks, DK>;
      allow_shared(kernel, device, shared);
      kernel<<<grid, kGatedThreads, shared, stream>>>(params);
      LATTN_CUDA_CHECK_LAUNCH();
      return 0;
    }
  };
  template <class T, int Gates, int RB, int MinBlocks>
  struct Occupancy {
    static int run(std::size_t shared, int device) {
      auto kernel = gated_dqk_kernel<T, Gates, RB, MinBlocks, DK>;
      allow_shared(kernel, device, shared);
      int blocks = 0;
      LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
      return blocks;
    }
  };
};

}  // namespace

std::size_t gated_dqk_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block, bool) {
  return dqk_layout(p.value_dim(), rows_per_block, element_size(dtype), p.decay == Decay::vector).total;
}

int gated_dqk_occupancy(const Problem& p, Dtype dtype, GatedTiles tiles, bool dk_pass) {
  const std::size_t shared = gated_dqk_shared_bytes(p, dtype, tiles.rows_per_block, dk_pass);
  const int gates = gate_kind(p);
  return dk_pass ? dispatch_tiles<Pass<true>::Occupancy>(dtype, gates, tiles, shared, current_device())
                 : dispatch_tiles<Pass<false>::Occupancy>(dtype, gates, tiles, shared, current_device());
}

void gated_dqk(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedArgs& args, bool dk_pass,
               cudaStream_t stream) {
  const int device = current_device();
  const GatedTiles tiles = gated_tiles(dk_pass ? "dk" : "dq", p, dtype, max_shared_bytes(device));
  if (tiles.rows_per_block == 0) throw RuntimeFailure("chunked_gated: the dQ/dK kernel's tiles do not fit");
  const GatedParams params{shape, args, (shape.C + tiles.rows_per_block - 1) / tiles.rows_per_block,
                           (shape.Dk + kDqkCols - 1) / kDqkCols};
  const dim3 grid(unsigned(std::size_t(shape.chunks) * shape.H * params.row_blocks * params.col_tiles));
  const std::size_t shared = gated_dqk_shared_bytes(p, dtype, tiles.rows_per_block, dk_pass);
  if (dk_pass)
    dispatch_tiles<Pass<true>::Launch>(dtype, shape.gates, tiles, params, grid, shared, device, stream);
  else
    dispatch_tiles<Pass<false>::Launch>(dtype, shape.gates, tiles, params, grid, shared, device, stream);
}

}  // namespace lattn::cuda

// The gated chunked form's dV and dK kernel (cuda/chunked_gated.hpp; docs/cuda.md, "Gated
// decays, chunked"): for a chunk with cumulative log-gates b, A_ij = sum_d q_id k_jd exp(b_id - b_jd)
// and dA_ij = s do_i . v_j (i >= j), and dh_c the gradient of the state leaving it,
//   dV_j  = s sum_{i >= j} A_ij do_i + (k_j . exp(b_last - b_j))^T dh_c
//   dK_jd = exp(b_last,d - b_jd) (V_j dh_c^T)_d + sum_{i >= j} dA_ij q_id exp(b_id - b_jd)
// (scalar gates: the factors are a mask and a factor per row). Both own key rows and walk the same
// query blocks, so one launch computes both: one block of 8 warps per (chunk, value head, RB key
// rows, 64 columns), which are dV's value columns 64 ct .. and dK's key channels 64 ct .. (a
// block past Dv or Dk computes only the other). The block stages its own K and V rows once, and
// per query block (from its own to the chunk's last) its Q and dO rows once, full width: both
// RB x RB tiles, the transposed scores s A^T (from K and Q) and dA^T (from V and dO), go through
// shared memory, and each warp adds its own key tile's dV (S^T dO's columns) and dK (dA^T Q's
// channels) in registers (warp w: key tile w % (RB/16), columns of group w / (RB/16)). Then the
// state terms, dh_c in 64-row pieces (dV: K . exp(b_last - b) times dh_c's columns; dK: V times
// dh_c's rows of the block's channels).
//
// Vector gates: the scores' factor exp(b_i - b_j) = EQ_i f EK_j with f the sum of the tiles or
// blocks between (per channel, as in the output kernel), Q . EQ and K . EK made once in shared
// memory; the same per-warp f scales the reduction index of A^T (mma_scaled_a, every channel) and
// the output channels of dK (mma_scaled_b, the block's channels of the same f), whose common
// factor EK is applied at the end. The diagonal 16 x 16 tiles are element-wise on the FMA units:
// dV's (diagonal_scores, over 32-channel pieces of the own rows' gates) first, kept in shared
// memory until the score tile is written; dK's (diagonal_dk) after the walk and the state terms:
// the own rows' Q and dO are staged again there (an L2 read), and the own gates on the block's
// channels.
//
// Registers: the launch bounds for 2 blocks of 256 threads cap a thread at 128 registers, and
// every instance must fit them without a spill or a stack frame (the build fails otherwise).
// Where the score and accumulator tiles are few (RB 32: one dV and one dK tile a warp), what
// decides the peak is the values that live through the whole kernel, so these are kept small:
//  - the chunk's offsets (q/k, v/dO, g, dh_c, dK's rows; 64-bit each) are written to shared memory
//    by one thread before the first barrier and read where a stage or a store needs them, not
//    held in registers through the walk; the fixed gates' log-gate is computed where one thread
//    uses it; the stores' row bounds use the row block's count of rows, not the chunk's;
//  - dV's diagonal scores go in groups of 4 channels (diagonal_scores<4>: 4 query, factor, key
//    and gate values a lane per key row instead of 8), and each 32-channel piece's part is added
//    to the warp's scratch in shared memory, so no partial sums live across the gates' staging;
//  - dK's diagonal share (8 TN floats a lane) goes to shared memory (K and V's place, free by
//    then) as soon as it is computed instead of living through the own block's remaining query
//    tiles, and is added back in the epilogue.
// A smaller row block was no way out: the vector gates spilled at RB 32, the smallest row block
// the 8-warp tiling allows (at RB 16 a warp would own no whole 16-column tile of the 64).
//
// Why dQ is not in this kernel: dQ owns query rows and walks the key blocks below them, the
// opposite direction; only where a row block is the whole chunk would one block have all of dQ's
// rows, and a third RB x 64 float accumulator (dQ's) beside dV's and dK's, with h_c staged too,
// goes past the 128 registers a thread that two resident blocks of 256 threads allow (the dV and
// dK accumulators and the score tiles already take 48 floats a lane at RB 64), or needs a
// second 16 KiB+ of shared memory that drops the bf16 vector-gated headline case to one block per
// multiprocessor. dQ stays its own launch (cuda/chunked_gated_dq.cu).
//
// Shared memory at the headline shape (bf16, Dk = Dv = 128, RB 64; as the emulation computes it):
// K, V, Q, dO 17 KiB each, the score tile with dV's diagonal tiles (or a 32-channel piece of the
// gates), the gates' sums, the chunk's offsets and the warps' areas: 104576 bytes with vector
// gates, 92416 without; two blocks per multiprocessor, as the dV and dK kernels it replaces.
// Over 500 lines: dV's and dK's walks share the chunk's staged tiles, gates and offsets, which is
// the point of the one launch; split across files they would share them only through a header.
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

constexpr int kDkvCols = 64;   // dV's value columns and dK's key channels per block
constexpr int kGatePiece = 32;  // vector gates: the own rows' gates staged 32 channels at a time
// The chunk's offsets in the tensors (q/k, v/dO, g, dh_c, dK's rows): in shared memory after the
// first barrier (one thread writes them), read where used rather than kept in registers through
// the walk.
constexpr int kOffKey = 0, kOffValue = 1, kOffGate = 2, kOffState = 3, kOffKeyPart = 4, kOffsets = 5;

__host__ __device__ constexpr int round64(int x) { return (x + 63) / 64 * 64; }

// Dynamic shared memory (bytes): own keys K and values V; the walked query block's Q and dO (full
// width, each padded to whole 64-column tiles so that a block's columns are always inside), which
// the state terms' pieces of dh_c (in turn dK's: the block's 64 rows x Dv; dV's: 64 rows x the
// block's 64 columns) and, at the end, the own rows' gates on the block's channels (vector) reuse;
// one region for in turn the own rows' gates in 32-channel pieces (vector) and the score tile
// (rows: keys; s A^T, then dA^T), with dV's diagonal tiles' scores beside it (vector); the gates'
// sums; the chunk's offsets; the warps' areas. (The largest dims must fit A100's 163 KiB: float32
// with vector gates at dim 256 takes 166528 bytes.)
struct DkvLayout {
  int Dkp, Dvp, Kw, Vw, ldK, ldV, ldS, ldG, ldH, ldP, ldD;
  std::size_t k, v, dd, q, o, h, g, x, s, diag, sums, offs, warps, warp_bytes, total;
};

__host__ __device__ inline DkvLayout dkv_layout(int Dk, int Dv, int RB, int es, bool vector) {
  DkvLayout L{};
  L.Dkp = round16(Dk);
  L.Dvp = round16(Dv);
  L.Kw = round64(Dk);
  L.Vw = round64(Dv);
  L.ldK = padded_ld(L.Kw, es);
  L.ldV = padded_ld(L.Vw, es);
  L.ldS = padded_ld(RB, es);
  L.ldG = padded_ld(kDkvCols, 4);
  L.ldH = padded_ld(kDkvCols, es);
  L.ldP = padded_ld(kGatePiece, 4);
  L.ldD = padded_ld(kDkvCols, 4);
  Carve c;
  L.k = c.take(std::size_t(RB) * L.ldK * es);
  L.v = c.take(std::size_t(RB) * L.ldV * es);
  // Vector gates: K and V's place takes dK's diagonal share at the end (RB x 64 floats).
  const std::size_t dd = vector ? std::size_t(RB) * L.ldD * 4 : 0;
  if (c.at - L.k < dd) c.take(dd - (c.at - L.k));
  L.dd = L.k;
  const std::size_t q = align128(std::size_t(RB) * L.ldK * es);
  const std::size_t o = std::max(std::size_t(RB) * L.ldV * es, vector ? std::size_t(RB) * L.ldG * 4 : 0);
  const std::size_t hv = std::size_t(64) * L.ldH * es, hk = std::size_t(64) * L.ldV * es;
  L.q = c.take(std::max(q + o, std::max(hv, hk)));
  L.o = L.q + q;
  L.g = L.o;  // the own gates on the block's channels, after the walk (vector)
  L.h = L.q;
  const std::size_t s = align128(std::size_t(RB) * L.ldS * es), diag = vector ? sizeof(float) * RB * 16 : 0;
  L.x = c.take(std::max(s + diag, vector ? std::size_t(RB) * L.ldP * 4 : 0));
  L.s = L.x;
  L.diag = L.x + s;
  L.sums = c.take(sizeof(double) * (vector ? std::size_t(RB / 16 + 1) * L.Dkp : std::size_t(2 * RB + 3)));
  L.offs = c.take(sizeof(std::size_t) * kOffsets);
  L.warp_bytes = warp_area_bytes(vector ? L.Kw : 0);
  L.warps = c.take(kGatedWarps * L.warp_bytes);
  L.total = c.at;
  return L;
}

template <class T, int Gates, int RB, int MinBlocks>
__global__ void __launch_bounds__(kGatedThreads, MinBlocks) gated_dkv_kernel(GatedParams p) {
  constexpr bool Vector = Gates == kVectorGates, Fixed = Gates == kFixedGates;
  constexpr int RT = RB / 16, CG = kGatedWarps / RT, TN = kDkvCols / 16 / CG, SI = (RT + CG - 1) / CG;
  constexpr int NW = 16 * TN;  // the warp's columns
  extern __shared__ __align__(128) unsigned char smem[];
  const GatedShape& s = p.shape;
  const DkvLayout L = dkv_layout(s.Dk, s.Dv, RB, int(sizeof(T)), Vector);
  const BlockAt at = block_at(p);
  const ChunkRef& ch = at.ch;
  const int j0 = at.rb * RB;
  if (j0 >= ch.n) return;  // past a short chunk's end: the whole block, before any barrier
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, tj = warp % RT, cg = warp / RT;
  const int Dk = s.Dk, Dv = s.Dv, W = s.W, Dkp = L.Dkp, Dvp = L.Dvp, Kw = L.Kw, Vw = L.Vw;
  const int valid = min(RB, ch.n - j0), blocks = (ch.n + RB - 1) / RB;
  const int c0 = at.ct * kDkvCols, wc = cg * NW;              // the block's first column, the warp's
  const bool has_v = c0 < Dv, has_k = c0 < Dk;                // block-uniform
  const int kcols = min(kDkvCols, Dk - c0);                   // dK's channels (when has_k)
  T* K = reinterpret_cast<T*>(smem + L.k);
  T* V = reinterpret_cast<T*>(smem + L.v);
  T* Q = reinterpret_cast<T*>(smem + L.q);
  T* O = reinterpret_cast<T*>(smem + L.o);
  T* H = reinterpret_cast<T*>(smem + L.h);
  float* G = reinterpret_cast<float*>(smem + L.x);   // the own gates' 32-channel pieces (vector, start)
  float* Gk = reinterpret_cast<float*>(smem + L.g);  // the own gates on the block's channels (vector, end)
  float* DD = reinterpret_cast<float*>(smem + L.dd);  // dK's diagonal tiles' share (vector, end)
  T* S = reinterpret_cast<T*>(smem + L.s);  // S[j][i] = s A_ij, then dA[j][i] = s dA_ij (times the gates)
  T* dA = S;
  // Vector gates: tiles[t][d], between[d] (the walked blocks' so far), d < Dkp. Scalar: own[r]
  // (prefix sums of the own rows), walk[r] (the walked block's prefix sums), between, blk,
  // own_total.
  float* const diag = reinterpret_cast<float*>(smem + L.diag);  // [tile][query row][key]
  double* const sums = reinterpret_cast<double*>(smem + L.sums);
  double* const tiles = sums;
  double* const own = sums;
  double* const walk = sums + RB;
  double* const between = sums + (Vector ? RT * Dkp : 2 * RB);
  double* const blk = between + 1;        // scalar
  double* const own_total = between + 2;  // scalar
  std::size_t* const offs = reinterpret_cast<std::size_t*>(smem + L.offs);
  unsigned char* area = smem + L.warps + warp * L.warp_bytes;
  float* scratch = reinterpret_cast<float*>(area);
  T* piece = reinterpret_cast<T*>(area);
  float* f = reinterpret_cast<float*>(area + warp_area_bytes(0));  // vector: Kw channels

  const T* q = static_cast<const T*>(p.args.q) + ch.key;
  const T* k = static_cast<const T*>(p.args.k) + ch.key;
  const T* v = static_cast<const T*>(p.args.v) + ch.value;
  const T* dO = static_cast<const T*>(p.args.dO) + ch.value;
  const float* g = p.args.g + ch.gate;
  // After the first barrier: the chunk's rows from the offsets in shared memory.
  auto queries = [&] { return static_cast<const T*>(p.args.q) + offs[kOffKey]; };
  auto grads = [&] { return static_cast<const T*>(p.args.dO) + offs[kOffValue]; };
  auto gates = [&] { return p.args.g + offs[kOffGate]; };
  const float scale = s.scale;
  // Fixed gates: every row's log-gate, computed where one thread uses it (not live through the kernel).
  auto log_gate = [&] { return Fixed ? head_log_gate(s, at.h) : 0.0; };
  // Vector gates: the sum of the own tiles strictly between lo and hi, per channel d.
  auto tiles_between = [&](int lo, int hi, int d) {
    double x = 0;
    for (int t = lo + 1; t < hi; ++t) x += tiles[t * Dkp + d];
    return x;
  };
  // The score tiles' weights for scalar and fixed gates: exp(b_i - b_j) for key row j of the own
  // block and query row i of a walked block: the own rows after j, the blocks between, the walked
  // rows up to i.
  auto walked_weight = [&](int j, int i) { return expf(float(own_total[0] - own[j] + between[0] + walk[i])); };

  // ---- the own rows: K, V, and as queries Q, dO ----
  stage_async<kGatedThreads>(K, L.ldK, k + std::size_t(j0) * Dk, Dk, valid, Dk, RB, Kw);
  stage_async<kGatedThreads>(V, L.ldV, v + std::size_t(j0) * Dv, Dv, valid, Dv, RB, Vw);
  stage_async<kGatedThreads>(Q, L.ldK, q + std::size_t(j0) * Dk, Dk, valid, Dk, RB, Kw);
  stage_async<kGatedThreads>(O, L.ldV, dO + std::size_t(j0) * Dv, Dv, valid, Dv, RB, Vw);
  __pipeline_commit();
  if (threadIdx.x == 0) {
    offs[kOffKey] = ch.key;
    offs[kOffValue] = ch.value;
    offs[kOffGate] = ch.gate;
    offs[kOffState] = ch.state;
    offs[kOffKeyPart] = ch.key_part;
  }
  if constexpr (!Vector) {
    if (threadIdx.x == 0) {
      own_total[0] = row_sums<true, Fixed>(g + j0, log_gate(), valid, RB, own);
      between[0] = 0.0;
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();

  WarpBlock<T, 1, SI> sc;  // the warp's transposed score (or dA) tiles: key tile tj, query tiles cg SI ..
  WarpBlock<T, 1, TN> dv, dk;  // zeroed where they are first used (not live through the gates' start)
  if constexpr (Vector) {
    // The own gates in 32-channel pieces: the tiles' sums, dV's diagonal tiles (raw Q and K),
    // then Q . EQ and K . EK.
    for (int d = int(threadIdx.x); d < Dkp; d += kGatedThreads) between[d] = 0.0;
    for (int pc = 0; pc < Dkp; pc += kGatePiece) {
      const int pw = min(kGatePiece, Dkp - pc);
      stage_async<kGatedThreads>(G, L.ldP, gates() + std::size_t(j0) * W + pc, W, valid, Dk - pc, RB, kGatePiece);
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      tile_sums_and_exp(G, L.ldP, RB, pw, tiles + pc, Dkp);
      __syncthreads();
      {  // this warp's part of the piece's diagonal scores (query row lane % 16), added to its scratch
        float d1[16];
        diagonal_scores<4>(d1, Q + pc, K + pc, L.ldK, G, L.ldP, tj, pw, cg * 2 + (lane >> 4), CG * 2);
#pragma unroll
        for (int j = 0; j < 16; ++j) d1[j] += __shfl_xor_sync(0xffffffffu, d1[j], 16);
        if (lane < 16) {
#pragma unroll
          for (int j = 0; j < 16; ++j)
            scratch[lane * kTileScratchLd + j] = (pc == 0 ? 0.0f : scratch[lane * kTileScratchLd + j]) + d1[j];
        }
      }
      __syncthreads();
      tile_factors<true>(Q + pc, L.ldK, G, L.ldP, RB, pw);   // Q . EQ
      tile_factors<false>(K + pc, L.ldK, G, L.ldP, RB, pw);  // K . EK
      __syncthreads();
    }
    if (cg == 0 && lane < 16) {  // the parts' sum, kept in shared memory until the score tile is written
      for (int j = 0; j < 16; ++j) {
        float x = 0.0f;
        for (int o = 0; o < CG; ++o)
          x += reinterpret_cast<const float*>(smem + L.warps + (tj + o * RT) * L.warp_bytes)[lane * kTileScratchLd + j];
        diag[(tj * 16 + lane) * 16 + j] = x;
      }
    }
    __syncthreads();
    // dV's own block: the tiles below the diagonal with f = the tiles between.
    sc.zero();
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I <= tj || I >= RT) continue;
      warp_factors(f, Dk, Dkp, [&](int d) { return tiles_between(tj, I, d); });
      mma_scaled_a<true, 1>(&sc.acc[0][u], K + tj * 16 * L.ldK, L.ldK, f, Q + I * 16 * L.ldK, L.ldK, Dkp / 16, piece);
    }
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
      if (I < RT && I != tj) S[j * L.ldS + i] = from_float<T>(I > tj ? scale * x : 0.0f);
    });
    if (cg == 0 && lane < 16) {  // query row lane's scores against the tile's keys jj <= lane
      for (int jj = 0; jj < 16; ++jj)
        S[(tj * 16 + jj) * L.ldS + tj * 16 + lane] =
            from_float<T>(jj <= lane ? scale * diag[(tj * 16 + lane) * 16 + jj] : 0.0f);
    }
    __syncthreads();
    dv.zero();
    dk.zero();
    if (has_v) warp_mma<false, TN>(dv.acc[0], S + tj * 16 * L.ldS, L.ldS, O + c0 + wc, L.ldV, RT);
  } else {
    dv.zero();
    dk.zero();
    // The own block for both: s A^T and dA^T masked (i >= j) with exp(b_i - b_j).
    sc.zero();
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I < RT && I >= tj) warp_mma<true, 1>(&sc.acc[0][u], K + tj * 16 * L.ldK, L.ldK, Q + I * 16 * L.ldK, L.ldK, Dkp / 16);
    }
    auto own_weight = [&](int j, int i) {
      return j <= i && i < valid ? scale * expf(float(own[i] - own[j])) : 0.0f;
    };
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
      if (I < RT) S[j * L.ldS + i] = from_float<T>(x * own_weight(j, i));
    });
    __syncthreads();
    if (has_v) warp_mma<false, TN>(dv.acc[0], S + tj * 16 * L.ldS, L.ldS, O + c0 + wc, L.ldV, RT);
    sc.zero();
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I < RT && I >= tj) warp_mma<true, 1>(&sc.acc[0][u], V + tj * 16 * L.ldV, L.ldV, O + I * 16 * L.ldV, L.ldV, Dvp / 16);
    }
    __syncthreads();  // S is read: its place takes dA
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
      if (I < RT) dA[j * L.ldS + i] = from_float<T>(x * own_weight(j, i));
    });
    __syncthreads();
    if (has_k) warp_mma<false, TN>(dk.acc[0], dA + tj * 16 * L.ldS, L.ldS, Q + c0 + wc, L.ldK, RT);
  }
  __syncthreads();  // the own block's Q and dO are read

  // ---- the query blocks after the own rows, nearest first ----
  for (int ib = at.rb + 1; ib < blocks; ++ib) {
    const std::size_t i0 = std::size_t(ib) * RB;
    const int rows = min(RB, ch.n - int(i0));
    stage_async<kGatedThreads>(Q, L.ldK, queries() + i0 * Dk, Dk, rows, Dk, RB, Kw);
    stage_async<kGatedThreads>(O, L.ldV, grads() + i0 * Dv, Dv, rows, Dv, RB, Vw);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector) {
      // f: the own tiles after tj and the blocks between, every channel; then Q . EQ (from the
      // block's start), its sums added to between.
      warp_factors(f, Dk, Kw, [&](int d) { return between[d] + tiles_between(tj, RT, d); });
      __syncthreads();
      walked_factors<true>(Q, L.ldK, gates() + i0 * W, W, rows, Dk, between, true);
    } else if (threadIdx.x == 0) {
      blk[0] = row_sums<true, Fixed>(gates() + i0, log_gate(), rows, RB, walk);
    }
    __syncthreads();
    // The score tiles one 16 x 16 tile at a time (the dV and dK accumulators are live here).
    WarpBlock<T, 1, 1> one;
#pragma unroll 1
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I >= RT) break;
      one.zero();
      if constexpr (Vector)
        mma_scaled_a<true, 1>(one.acc[0], K + tj * 16 * L.ldK, L.ldK, f, Q + I * 16 * L.ldK, L.ldK, Dkp / 16, piece);
      else
        warp_mma<true, 1>(one.acc[0], K + tj * 16 * L.ldK, L.ldK, Q + I * 16 * L.ldK, L.ldK, Dkp / 16);
      each_lane(one, scratch, [&](int, int r, int c, float& x) {
        const int j = tj * 16 + r, i = I * 16 + c;
        if constexpr (Vector) S[j * L.ldS + i] = from_float<T>(scale * x);
        else S[j * L.ldS + i] = from_float<T>(i < rows ? scale * x * walked_weight(j, i) : 0.0f);
      });
    }
    __syncthreads();
    if (has_v) warp_mma<false, TN>(dv.acc[0], S + tj * 16 * L.ldS, L.ldS, O + c0 + wc, L.ldV, RT);
    __syncthreads();  // S is read: its place takes dA
#pragma unroll 1
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I >= RT) break;
      one.zero();
      warp_mma<true, 1>(one.acc[0], V + tj * 16 * L.ldV, L.ldV, O + I * 16 * L.ldV, L.ldV, Dvp / 16);
      each_lane(one, scratch, [&](int, int r, int c, float& x) {
        const int j = tj * 16 + r, i = I * 16 + c;
        if constexpr (Vector) dA[j * L.ldS + i] = from_float<T>(scale * x);
        else dA[j * L.ldS + i] = from_float<T>(i < rows ? scale * x * walked_weight(j, i) : 0.0f);
      });
    }
    __syncthreads();
    if (has_k) {
      if constexpr (Vector)
        mma_scaled_b<false, TN>(dk.acc[0], dA + tj * 16 * L.ldS, L.ldS, Q + c0 + wc, L.ldK, f + c0 + wc, RT, piece);
      else
        warp_mma<false, TN>(dk.acc[0], dA + tj * 16 * L.ldS, L.ldS, Q + c0 + wc, L.ldK, RT);
    }
    if constexpr (!Vector)
      if (threadIdx.x == 0) between[0] += blk[0];
    __syncthreads();
  }

  // ---- the state terms: dV += (K . exp(b_last - b)) dh_c's columns, dK += V dh_c's rows^T
  // (times exp(b_last - b) on the channels) ----
  if constexpr (Vector) {
    for (int e = int(threadIdx.x); e < RT * Dk; e += kGatedThreads) {
      const int t = e / Dk, d = e - t * Dk;
      const float fk = expf(float(between[d] + tiles_between(t, RT, d)));
      for (int r = t * 16; r < t * 16 + 16; ++r) K[r * L.ldK + d] = from_float<T>(to_float(K[r * L.ldK + d]) * fk);
    }
    warp_factors(f, Dk, Kw, [&](int d) { return between[d] + tiles_between(tj, RT, d); });
  } else {
    for (int r = warp; r < RB; r += kGatedWarps) {
      const float fr = expf(float(own_total[0] - own[r] + between[0]));
      for (int d = lane; d < Dkp; d += 32) K[r * L.ldK + d] = from_float<T>(to_float(K[r * L.ldK + d]) * fr);
      for (int d = lane; d < Dvp; d += 32) V[r * L.ldV + d] = from_float<T>(to_float(V[r * L.ldV + d]) * fr);
    }
  }
  const T* dstate = static_cast<const T*>(p.args.states) + offs[kOffState];
  if (has_k) {  // dh_c's rows of the block's channels, B's columns
    stage_async<kGatedThreads>(H, L.ldV, dstate + std::size_t(c0) * Dv, Dv, kcols, Dv, 64, Dvp);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if constexpr (Vector)
      mma_scaled_b<true, TN>(dk.acc[0], V + tj * 16 * L.ldV, L.ldV, H + wc * L.ldV, L.ldV, f + c0 + wc, Dvp / 16, piece);
    else
      warp_mma<true, TN>(dk.acc[0], V + tj * 16 * L.ldV, L.ldV, H + wc * L.ldV, L.ldV, Dvp / 16);
    __syncthreads();
  }
  if (has_v) {
    for (int pc = 0; pc < Dkp; pc += 64) {  // 64 rows of dh_c, the block's columns
      stage_async<kGatedThreads>(H, L.ldH, dstate + std::size_t(pc) * Dv + c0, Dv, Dk - pc, Dv - c0, 64, kDkvCols);
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      warp_mma<false, TN>(dv.acc[0], K + tj * 16 * L.ldK + pc, L.ldK, H + wc, L.ldH, min(64, Dkp - pc) / 16);
      __syncthreads();
    }
  }
  if (has_v) {
    float* out = p.args.out + offs[kOffValue] + c0;
    each_lane(dv, scratch, [&](int t, int r, int c, float& x) {
      const int j = tj * 16 + r, col = wc + t * 16 + c;
      if (j < valid && c0 + col < Dv) out[std::size_t(j0 + j) * Dv + col] = x;
    });
  }
  if (!has_k) return;  // block-uniform, after the last barrier of the dV part

  if constexpr (Vector) {
    // ---- dK's own block: its rows as queries again (raw), dA^T, the gates on the block's channels ----
    stage_async<kGatedThreads>(Q, L.ldK, queries() + std::size_t(j0) * Dk, Dk, valid, Dk, RB, Kw);
    stage_async<kGatedThreads>(O, L.ldV, grads() + std::size_t(j0) * Dv, Dv, valid, Dv, RB, Vw);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    sc.zero();
#pragma unroll
    for (int u = 0; u < SI; ++u) {
      const int I = cg * SI + u;
      if (I < RT && I >= tj) warp_mma<true, 1>(&sc.acc[0][u], V + tj * 16 * L.ldV, L.ldV, O + I * 16 * L.ldV, L.ldV, Dvp / 16);
    }
    each_lane(sc, scratch, [&](int u, int r, int c, float& x) {
      const int I = cg * SI + u, j = tj * 16 + r, i = I * 16 + c;
      if (I < RT) dA[j * L.ldS + i] = from_float<T>(i >= j ? scale * x : 0.0f);
    });
    __syncthreads();  // dO is read: its place takes the gates
    stage_async<kGatedThreads>(Gk, L.ldG, gates() + std::size_t(j0) * W + c0, W, valid, kcols, RB, kDkvCols);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int e = int(threadIdx.x); e < RB * kDkvCols; e += kGatedThreads) {
      const int r = e / kDkvCols, d = e - r * kDkvCols;
      Gk[r * L.ldG + d] = expf(Gk[r * L.ldG + d]);
    }
    __syncthreads();
    {  // dK's diagonal share, in the lane's own elements of K and V's place until the end
      float dd[8 * TN];
      diagonal_dk<TN>(dd, dA, L.ldS, Q + c0, L.ldK, Gk, L.ldG, tj, wc);
#pragma unroll
      for (int t = 0; t < TN; ++t)
        store8(DD + (tj * 16 + (lane >> 1)) * L.ldD + wc + t * 16 + (lane & 1) * 8, *reinterpret_cast<float(*)[8]>(dd + t * 8));
    }
    __syncthreads();
    tile_factors<true>(Q + c0, L.ldK, Gk, L.ldG, RB, kDkvCols);  // Q . EQ on the block's channels
    tile_products<false>(Gk, L.ldG, RB, kDkvCols);             // dK's common factor EK
    __syncthreads();
    const int wcols = max(0, min(NW, kcols - wc));
    for (int X = tj + 1; X < RT; ++X) {  // the own block's query tiles after the key tile
      warp_factors(f, wcols, NW, [&](int n) { return tiles_between(tj, X, c0 + wc + n); });
      mma_scaled_b<false, TN>(dk.acc[0], dA + tj * 16 * L.ldS + X * 16, L.ldS, Q + X * 16 * L.ldK + c0 + wc, L.ldK, f,
                              1, piece);
    }
  }
  float* out = p.args.dk + offs[kOffKeyPart] + c0;
  each_lane(dk, scratch, [&](int t, int r, int c, float& x) {
    const int row = tj * 16 + r, col = wc + t * 16 + c;
    float y = x;
    if constexpr (Vector) y = x * Gk[row * L.ldG + col] + DD[row * L.ldD + col];
    if (row < valid && col < kcols) out[std::size_t(j0 + row) * Dk + col] = y;
  });
}

template <class T, int Gates, int RB, int MinBlocks>
struct Launch {
  static int run(const GatedParams& params, dim3 grid, std::size_t shared, int device, cudaStream_t stream) {
    auto kernel = gated_dkv_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    kernel<<<grid, kGatedThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
    return 0;
  }
};

template <class T, int Gates, int RB, int MinBlocks>
struct Occupancy {
  static int run(std::size_t shared, int device) {
    auto kernel = gated_dkv_kernel<T, Gates, RB, MinBlocks>;
    allow_shared(kernel, device, shared);
    int blocks = 0;
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGatedThreads, shared));
    return blocks;
  }
};

}  // namespace

std::size_t gated_dkv_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block) {
  return dkv_layout(p.dim, p.value_dim(), rows_per_block, element_size(dtype), p.decay == Decay::vector).total;
}

int gated_dkv_occupancy(const Problem& p, Dtype dtype, GatedTiles tiles) {
  return dispatch_tiles<Occupancy>(dtype, gate_kind(p), tiles,
                                   gated_dkv_shared_bytes(p, dtype, tiles.rows_per_block), current_device());
}

void gated_dkv(const Problem& p, Dtype dtype, const GatedShape& shape, const GatedArgs& args, cudaStream_t stream) {
  const int device = current_device();
  const GatedTiles tiles = gated_tiles("dkv", p, dtype, max_shared_bytes(device));
  if (tiles.rows_per_block == 0) throw RuntimeFailure("chunked_gated: the dV/dK kernel's tiles do not fit");
  const GatedParams params{shape, args, (shape.C + tiles.rows_per_block - 1) / tiles.rows_per_block,
                           (std::max(shape.Dk, shape.Dv) + kDkvCols - 1) / kDkvCols};
  const dim3 grid(unsigned(std::size_t(shape.chunks) * shape.H * params.row_blocks * params.col_tiles));
  dispatch_tiles<Launch>(dtype, shape.gates, tiles, params, grid, gated_dkv_shared_bytes(p, dtype, tiles.rows_per_block),
                         device, stream);
}

}  // namespace lattn::cuda

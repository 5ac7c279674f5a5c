// The delta rule's chunked backward on the GPU, the part of dq and dk that the pending values
// V_new and the state S entering a chunk give (docs/kernels.md): with dS' the gradient of the state
// leaving the chunk, dV_new the pending values' (cuda/chunked_delta_states.cu, reverse) and
// dP = s (dO V_new^T) . mask (lower with its diagonal),
//     dq      = s exp(b) . (dO S^T) + dP * K                  (final: q enters nothing else)
//     dk      = exp(b_{n-1} - b) . (V_new dS'^T) + dP^T * Q   (k's write part through S' and A_qk)
//     dW      = -dV_new S^T                                    (W's gradient, for the WY backward)
// (* the gated product: exp(b_i - b_m) per channel for vector gates, in dP for the others). The WY
// backward (cuda/chunked_delta_wy.cu) adds dk's other parts and turns dW into dk, dv and dbeta.
//
// Tiling: one block of 8 warps per (chunk, value head, 64 key channels), grid (chunks over every
// sequence, value heads, Dk / 64). The three CP x 64 outputs stay in registers (two 16 x 16 tiles
// of each per warp) with dP's lower tiles (at most two per warp) while the value dim is walked in
// slabs (dO, V_new, dV_new and the 64 rows of S and dS'); dP then goes to shared memory as the left
// operand of its two products with K's and Q's 64 columns. dq and dk are written for the value head
// (with grouped heads into its key parts, summed per q/k head at the end).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_delta.cuh"

namespace lattn::cuda {
namespace {

constexpr int kDqkThreads = 256;
constexpr int kDqkWarps = 8;
constexpr int kDqkCols = 64;                                       // key channels per block
constexpr int kDqkTiles = kMaxSubs * (kDqkCols / 16) / kDqkWarps;  // tiles of each output per warp

struct DqkLayout {
  int ldS, ldX, ldF, ldT, ldB;
  std::size_t dos, vns, dvns, ss, dss, sf, dp, bsum, bt, ref, rhs, scratch, total;
};

__host__ __device__ constexpr DqkLayout dqk_layout(int CP, int es, Gates gates) {
  const int W = kSlabBytes / es, NB = CP / kSub;
  const bool vector = gates == Gates::vector;
  DqkLayout L{};
  L.ldS = padded(W, es);
  L.ldX = padded(kDqkCols, es);
  L.ldF = CP + 4;
  L.ldT = padded(CP, es);
  L.ldB = kDqkCols + 4;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align128(bytes);
    return here;
  };
  const std::size_t slab = std::size_t(CP) * L.ldS * es, wide = std::size_t(CP) * L.ldX * es;
  L.dos = take(slab > wide ? slab : wide);  // dO's slab, then K's 64 columns
  L.vns = take(slab > wide ? slab : wide);  // V_new's slab, then Q's 64 columns
  // dV_new's slab and S's rows, then dP in float32; dS's rows, then dP as an operand (the slabs are
  // dead once the value dim is walked).
  const std::size_t rows = std::size_t(kDqkCols) * L.ldS * es, scores = std::size_t(CP) * L.ldF * 4;
  const std::size_t pair = align128(slab) + align128(rows), operand = std::size_t(CP) * L.ldT * es;
  L.dvns = take(pair > scores ? pair : scores);
  L.ss = L.dvns + align128(slab);
  L.sf = L.dvns;
  L.dss = take(rows > operand ? rows : operand);
  L.dp = L.dss;
  L.bsum = take(vector ? 0 : std::size_t(kDeltaMaxChunk) * 8);
  L.bt = take(vector ? std::size_t(CP) * L.ldB * 4 : 0);
  L.ref = take(vector ? std::size_t(NB + 1) * kDqkCols * 8 : 0);
  L.rhs = take(vector ? std::size_t(kDqkWarps) * 16 * padded(16, es) * es : 0);
  L.scratch = take(std::size_t(kDqkWarps) * 16 * kTileScratchLd * 4);
  L.total = at;
  return L;
}

struct DqkParams {
  DeltaShape shape;
  const void *q, *k, *dO, *v_new, *states, *dstates;
  const float *g, *dv_new;
  float *dq, *dk, *dw;
  bool parts;  // grouped heads: dq and dk into the value head's key parts ([B][H][T][Dk])
  float scale;
};

// Blocks per multiprocessor the launch bounds promise: two (128 registers a thread) for bf16 without
// vector gates; the float32 tiles and the vector gates' factors spill at 128, so one for those.
template <class T, Gates kG>
constexpr int kDqkMinBlocks = a100_blocks(dqk_layout(kDeltaMaxChunk, int(sizeof(T)), kG).total,
                                          sizeof(T) == 2 && kG != Gates::vector ? 2 : 1);

template <class T, Gates kG>
__global__ void __launch_bounds__(kDqkThreads, kDqkMinBlocks<T, kG>) delta_dqk_kernel(DqkParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int W = slab_cols<T>();
  constexpr bool kVector = kG == Gates::vector;
  const DeltaShape& s = p.shape;
  const DeltaChunk ch = delta_chunk(s, int(blockIdx.x), int(blockIdx.y));
  const int n = ch.n, CP = round16(s.C), NB = CP / kSub, Dk = s.Dk, Dv = s.Dv, d0 = int(blockIdx.z) * kDqkCols;
  const DqkLayout L = dqk_layout(CP, int(sizeof(T)), kG);
  T* dos = reinterpret_cast<T*>(smem + L.dos);
  T* vns = reinterpret_cast<T*>(smem + L.vns);
  T* dvns = reinterpret_cast<T*>(smem + L.dvns);
  T* ss = reinterpret_cast<T*>(smem + L.ss);
  T* dss = reinterpret_cast<T*>(smem + L.dss);
  float* sf = reinterpret_cast<float*>(smem + L.sf);
  T* dp = reinterpret_cast<T*>(smem + L.dp);
  double* bsum = reinterpret_cast<double*>(smem + L.bsum);
  const int warp = int(threadIdx.x) >> 5;
  float* scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;
  T* rhs = reinterpret_cast<T*>(smem + L.rhs) + warp * 16 * rhs_ld<T>();
  const VectorGates vg{reinterpret_cast<float*>(smem + L.bt), reinterpret_cast<double*>(smem + L.ref), L.ldB, kDqkCols,
                       NB};
  const std::size_t dd = std::size_t(Dk) * Dv, rows = ch.tok * Dv;
  const T* S = static_cast<const T*>(p.states) + ch.state * dd + std::size_t(d0) * Dv;
  const T* dS = static_cast<const T*>(p.dstates) + ch.state * dd + std::size_t(d0) * Dv;
  const int cols = min(kDqkCols, Dk - d0), col_tiles = (cols + 15) / 16, tiles = NB * col_tiles;

  if constexpr (!kVector)
    scalar_gate_sums(bsum, kG == Gates::scalar ? p.g + ch.tok : nullptr, fixed_log_gate(s.retnet, ch.head), n);

  typename Tiles<T>::Acc dq[kDqkTiles], dk[kDqkTiles], dw[kDqkTiles];
#pragma unroll
  for (int u = 0; u < kDqkTiles; ++u) Tiles<T>::zero(dq[u]), Tiles<T>::zero(dk[u]), Tiles<T>::zero(dw[u]);
  ScoreTiles<T, 2> scores(NB, kDqkWarps);
  for (int c0 = 0; c0 < Dv; c0 += W) {
    const int valid = min(W, Dv - c0), ksteps = (valid + 15) / 16;
    stage_async<kDqkThreads>(dos, L.ldS, static_cast<const T*>(p.dO) + rows + c0, std::size_t(Dv), n, valid, CP, W);
    stage_async<kDqkThreads>(vns, L.ldS, static_cast<const T*>(p.v_new) + rows + c0, std::size_t(Dv), n, valid, CP, W);
    stage_async<kDqkThreads>(ss, L.ldS, S + c0, std::size_t(Dv), cols, valid, kDqkCols, W);
    stage_async<kDqkThreads>(dss, L.ldS, dS + c0, std::size_t(Dv), cols, valid, kDqkCols, W);
    __pipeline_commit();
    for (int e = int(threadIdx.x); e < CP * W; e += kDqkThreads) {  // dV_new, float32, as an operand
      const int i = e / W, j = e - i * W;
      dvns[i * L.ldS + j] = from_float<T>(i < n && j < valid ? p.dv_new[rows + std::size_t(i) * Dv + c0 + j] : 0.0f);
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    scores.add_plain(dos, vns, L.ldS, ksteps);
#pragma unroll
    for (int u = 0; u < kDqkTiles; ++u) {
      const int t = warp + u * kDqkWarps;
      if (t >= tiles) break;
      const int I = t / col_tiles, J = t % col_tiles;
      tile_mma<false, true>(dq[u], dos, L.ldS, ss, L.ldS, I, J, 0, ksteps);
      tile_mma<false, true>(dk[u], vns, L.ldS, dss, L.ldS, I, J, 0, ksteps);
      tile_mma<false, true>(dw[u], dvns, L.ldS, ss, L.ldS, I, J, 0, ksteps);
    }
    __syncthreads();
  }
  scores.store(sf, L.ldF, false);
  // K's and Q's 64 columns, into the slabs' buffers; the vector gates of those channels.
  T* ks = dos;
  T* qs = vns;
  stage_async<kDqkThreads>(ks, L.ldX, static_cast<const T*>(p.k) + ch.key + d0, std::size_t(Dk), n, cols, CP, kDqkCols);
  stage_async<kDqkThreads>(qs, L.ldX, static_cast<const T*>(p.q) + ch.key + d0, std::size_t(Dk), n, cols, CP, kDqkCols);
  __pipeline_commit();
  if constexpr (kVector)
    vector_gate_slab(reinterpret_cast<float*>(smem + L.bt), L.ldB, reinterpret_cast<double*>(smem + L.ref),
                     p.g + ch.tok * Dk, Dk, d0, kDqkCols, n, CP);
  // dW = -dV_new S^T, written as it is.
  float* dw_out = p.dw + ch.tok * Dk + d0;
#pragma unroll
  for (int u = 0; u < kDqkTiles; ++u) {
    const int t = warp + u * kDqkWarps;
    if (t >= tiles) break;
    const int I = t / col_tiles, J = t % col_tiles;
    tile_each<false, T>(dw[u], scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r, j = J * 16 + c;
      if (i < n && j < cols) dw_out[std::size_t(i) * Dk + j] = -x;
    });
  }
  __syncthreads();
  // dP = s (dO V_new^T), lower with its diagonal (scalar gates: times exp(b_i - b_m)), as an operand.
  for (int e = int(threadIdx.x); e < CP * CP; e += kDqkThreads) {
    const int i = e / CP, m = e - i * CP;
    float a = 0.0f;
    if (m <= i && i < n) {
      a = p.scale * sf[i * L.ldF + m];
      if constexpr (!kVector) a *= exp_diff(bsum[i], bsum[m]);
    }
    dp[i * L.ldT + m] = from_float<T>(a);
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  const std::size_t key_rows = p.parts ? ch.tok * Dk : ch.key;
  float* dq_out = p.dq + key_rows + d0;
  float* dk_out = p.dk + key_rows + d0;
#pragma unroll
  for (int u = 0; u < kDqkTiles; ++u) {
    const int t = warp + u * kDqkWarps;
    if (t >= tiles) break;
    const int I = t / col_tiles, J = t % col_tiles;
    // The state terms' factors: s exp(b_i) for dq, exp(b_{n-1} - b_m) for dk.
    tile_each<true, T>(dq[u], scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r;
      x *= p.scale * (kVector ? vg.total(i, J * 16 + c) : expf(float(bsum[i])));
    });
    tile_each<true, T>(dk[u], scratch, [&](int r, int c, float& x) {
      const int m = I * 16 + r;
      x *= kVector ? vg.decay_to_end(m, J * 16 + c) : exp_diff(bsum[n - 1], bsum[m]);
    });
    if constexpr (kVector) {
      gated_star_tile<false>(dq[u], dp, L.ldT, ks, L.ldX, I, J, NB, rhs, scratch, vg);
      gated_star_tile<true>(dk[u], dp, L.ldT, qs, L.ldX, I, J, NB, rhs, scratch, vg);
    } else {
      tile_mma<false, false>(dq[u], dp, L.ldT, ks, L.ldX, I, J, 0, I + 1);
      tile_mma<true, false>(dk[u], dp, L.ldT, qs, L.ldX, I, J, I, NB);
    }
    tile_each<false, T>(dq[u], scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r, j = J * 16 + c;
      if (i < n && j < cols) dq_out[std::size_t(i) * Dk + j] = x;
    });
    tile_each<false, T>(dk[u], scratch, [&](int r, int c, float& x) {
      const int i = I * 16 + r, j = J * 16 + c;
      if (i < n && j < cols) dk_out[std::size_t(i) * Dk + j] = x;
    });
  }
}

template <class T>
void launch_typed(const DeltaLaunch& l, const DqkParams& params, cudaStream_t stream) {
  const Problem& p = *l.problem;
  const Gates gates = params.shape.gates;
  const std::size_t shared = dqk_layout(round16(l.chunk), int(sizeof(T)), gates).total;
  const dim3 grid(unsigned(l.total_chunks), unsigned(p.heads), unsigned((p.dim + kDqkCols - 1) / kDqkCols));
  const int device = current_device();
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kDqkThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (gates == Gates::vector)
    go(delta_dqk_kernel<T, Gates::vector>);
  else if (gates == Gates::scalar)
    go(delta_dqk_kernel<T, Gates::scalar>);
  else
    go(delta_dqk_kernel<T, Gates::fixed>);
}

}  // namespace

std::size_t delta_dqk_shared(const Problem& p, Dtype dtype) {
  return dqk_layout(round16(std::min(p.chunk, kDeltaMaxChunk)), element_size(dtype), gates_of(p)).total;
}

ChunkedKernel delta_dqk_info(const Problem& p, Dtype dtype) {
  const std::size_t shared = delta_dqk_shared(p, dtype);
  auto info = [&](auto t) {
    using T = decltype(t);
    auto one = [&](auto kernel, int bounds) {
      return kernel_info("delta_dqk_kernel", kernel, kDqkThreads, shared, bounds);
    };
    switch (gates_of(p)) {
      case Gates::vector:
        return one(delta_dqk_kernel<T, Gates::vector>, kDqkMinBlocks<T, Gates::vector>);
      case Gates::scalar:
        return one(delta_dqk_kernel<T, Gates::scalar>, kDqkMinBlocks<T, Gates::scalar>);
      default:
        return one(delta_dqk_kernel<T, Gates::fixed>, kDqkMinBlocks<T, Gates::fixed>);
    }
  };
  return dtype == Dtype::f32 ? info(float{}) : info(bf16{});
}

void delta_dqk(const DeltaLaunch& l, const DeltaDqkArgs& a, cudaStream_t stream) {
  const DqkParams params{delta_shape(l),
                         a.q,
                         a.k,
                         a.dO,
                         a.v_new,
                         a.states,
                         a.dstates,
                         a.g,
                         a.dv_new,
                         a.dq,
                         a.dk,
                         a.dw,
                         a.parts,
                         float(attention_scale(l.problem->dim))};
  if (l.dtype == Dtype::f32)
    launch_typed<float>(l, params, stream);
  else
    launch_typed<bf16>(l, params, stream);
}

}  // namespace lattn::cuda

// The chunkwise-parallel form on the GPU, forward and backward (docs/spec.md section 1), split as the fast
// implementations split it (flash-linear-attention's chunk kernels; the GLA paper's chunkwise
// form): a light sequential pass makes the state entering each chunk (cuda/chunk_states.cu), then
// every chunk's outputs are computed independently of the others. float32 or bf16 token inputs,
// float32 accumulation; bf16 products on the tensor cores (WMMA 16x16x16), float32 ones on the FMA
// units.
//
// With s = D^-1/2, M the causal decay mask (M[i][j] = gamma^(i-j), i >= j), lam_i = gamma^(i+1),
// gam_j = gamma^(n-1-j), for a chunk of n rows, h_c the state entering it and dh_c the gradient of
// the state leaving it:
//   rows kernel:  out = s ((A B^T) . M) X + s diag(lam) A S       per block of RB output rows
//     O:   A = Q,  B = K, X = V, S = h_c
//     dQ:  A = dO, B = V, X = K, S = h_c^T
//   cols kernel:  out = s ((A B^T) . M)^T G + diag(gam) B S       per block of RB output rows
//     dV:  A = Q,  B = K, G = dO, S = dh_c
//     dK:  A = dO, B = V, G = Q,  S = dh_c^T
// (dq, dk, dv of docs/spec.md section 1 with dA = s (dO V^T) . M.) The forward is the state pass (h_c)
// then the rows kernel; the backward the state pass again unless the forward's states were kept,
// the reverse state pass (dh_c, and dh0), the rows kernel for dQ and the cols kernel for dV and dK.
// The states are scratch from the case's allocator (chunked_*_workspace_bytes).
//
// Tiling: a block of 4 warps per (batch x head, chunk, RB output rows, 64 output columns): the
// output tile RB x 64 stays in registers (each warp an RB/2 x 32 share, register-blocked). The
// block stages its own RB rows and its slice of the state, then walks the other side's blocks of
// RB rows that the causal mask lets it see (rows kernel: key blocks 0..r; cols kernel: query
// blocks j..last), each staged by cp.async into one of two buffers while the block computes on
// the other: per block the RB x RB score tile (each warp an RB/2 x RB/2 share; the warp whose share
// lies wholly above the diagonal skips the product), masked and scaled into shared memory, then
// one RB x RB x 64 product into the output tile. The element-wise steps (mask, row scales, the
// bounds-checked store) stay in registers for float32 and go through a float scratch tile per
// warp for bf16 (WMMA leaves the lanes' share of a tile unspecified). Shared memory depends on D
// and RB, not on the chunk: any chunk size runs. RB is 64 (32 for chunks of at most 32 rows), else 32: the larger
// with which two blocks share a multiprocessor, else the larger that fits; the kernels' launch
// bounds state the blocks per multiprocessor the choice was made for. Tiles are padded to
// multiples of 16 with zeros, so ragged chunks and any D need no special path.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/warp_tiles.cuh"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/chunked.hpp"

namespace lattn::cuda {
namespace {

constexpr int kBlockThreads = 128;  // 4 warps, 2 x 2 over every tile of the block
constexpr int kSlice = 64;          // output columns per block

// Where each buffer lives in dynamic shared memory (bytes), for element size `es` (4 or 2).
struct Layout {
  int Dp, ldD, ldJ, ldP;  // leading dimensions (elements): D-wide, slice-wide and score tiles
  std::size_t own, state, buf[2], slice[2], scores, scratch, total;
};

__host__ __device__ inline Layout make_layout(int D, int RB, int es) {
  Layout L{};
  const int pad = 16 / es;  // one 16-byte access of padding per row against bank conflicts
  L.Dp = round16(D);
  L.ldD = L.Dp + pad;
  L.ldJ = kSlice + pad;
  L.ldP = RB + pad;
  const std::size_t rows = align128(std::size_t(RB) * L.ldD * es), slice = align128(std::size_t(RB) * L.ldJ * es);
  const std::size_t state = std::size_t(L.Dp) * L.ldJ > std::size_t(kSlice) * L.ldD ? std::size_t(L.Dp) * L.ldJ
                                                                                     : std::size_t(kSlice) * L.ldD;
  L.own = 0;
  L.state = rows;
  L.buf[0] = L.state + align128(state * es);
  L.buf[1] = L.buf[0] + rows;
  L.slice[0] = L.buf[1] + rows;
  L.slice[1] = L.slice[0] + slice;
  L.scores = L.slice[1] + slice;
  L.scratch = L.scores + align128(std::size_t(RB) * L.ldP * es);
  // bf16's element-wise epilogues go through a float scratch tile per warp; float32's stay in registers.
  L.total = L.scratch + (es == 4 ? 0 : align128(std::size_t(4) * 16 * kTileScratchLd * 4));
  return L;
}

struct ChunkParams {
  const void* own;    // the output rows' operand: A (rows kernel), B (cols kernel)
  const void* other;  // the walked blocks' operand: B (rows kernel), A (cols kernel)
  const void* slice;  // X (rows kernel), G (cols kernel): 64 columns of it per block
  const void* states;  // [bh][chunk][D][D] in the token dtype
  float* out;
  int T, D, H, C, chunks, row_blocks;  // C: the chunk (at most T); row_blocks: blocks of RB rows per chunk
  bool retnet;
  float scale;
};

// The pointers and indices every block of both kernels starts from.
template <class T>
struct BlockSetup {
  T *own, *state, *scores;
  T *buf0, *slice0;  // the two buffers of each walked operand, one after the other (no pointer
  std::size_t buf_step, slice_step;  // arrays: a run-time index into one would put it on the stack)
  float* scratch;
  int warp, wm, wn, bh, chunk, rb, n, col0;
  float log2g;  // gamma^k = 2^(k log2 gamma)
  std::size_t tok;  // the chunk's first row of the (batch x head)'s token tensors

  __device__ BlockSetup(const ChunkParams& p, const Layout& L, unsigned char* smem) {
    own = reinterpret_cast<T*>(smem + L.own);
    state = reinterpret_cast<T*>(smem + L.state);
    buf0 = reinterpret_cast<T*>(smem + L.buf[0]);
    slice0 = reinterpret_cast<T*>(smem + L.slice[0]);
    buf_step = (L.buf[1] - L.buf[0]) / sizeof(T);
    slice_step = (L.slice[1] - L.slice[0]) / sizeof(T);
    scores = reinterpret_cast<T*>(smem + L.scores);
    warp = int(threadIdx.x) >> 5, wm = warp >> 1, wn = warp & 1;
    scratch = reinterpret_cast<float*>(smem + L.scratch) + warp * 16 * kTileScratchLd;
    rb = int(blockIdx.x % unsigned(p.row_blocks));
    const int cb = int(blockIdx.x / unsigned(p.row_blocks));
    chunk = cb % p.chunks, bh = cb / p.chunks;
    n = min(p.C, p.T - chunk * p.C);
    col0 = int(blockIdx.y) * kSlice;
    log2g = p.retnet ? float(log2(1.0 - ldexp(1.0, -5 - bh % p.H))) : 0.0f;
    tok = (std::size_t(bh) * p.T + std::size_t(chunk) * p.C) * p.D;
  }
  __device__ T* buf(int i) const { return buf0 + i * buf_step; }
  __device__ T* slice(int i) const { return slice0 + i * slice_step; }
};

// Group 0 of a block: its own RB rows (from row r0 of the chunk) and the state slice (S, or S^T
// read as the column-major operand: rows col0.. of S), then committed.
template <bool StateT, int RB, class T>
__device__ void stage_own(const ChunkParams& p, const Layout& L, const BlockSetup<T>& b, int r0) {
  const int D = p.D;
  stage_async<kBlockThreads>(b.own, L.ldD, static_cast<const T*>(p.own) + b.tok + std::size_t(r0) * D, D, b.n - r0, D,
                             RB, L.Dp);
  const T* S = static_cast<const T*>(p.states) + (std::size_t(b.bh) * p.chunks + b.chunk) * D * D;
  if (StateT)
    stage_async<kBlockThreads>(b.state, L.ldD, S + std::size_t(b.col0) * D, D, D - b.col0, D, kSlice, L.Dp);
  else
    stage_async<kBlockThreads>(b.state, L.ldJ, S + b.col0, D, D, D - b.col0, L.Dp, kSlice);
  __pipeline_commit();
}

// A walked block: rows r0.. of the other operand and of the slice operand into buffer `buf`, committed.
template <int RB, class T>
__device__ void stage_walked(const ChunkParams& p, const Layout& L, const BlockSetup<T>& b, int r0, int buf) {
  const int D = p.D;
  const std::size_t at = b.tok + std::size_t(r0) * D;
  stage_async<kBlockThreads>(b.buf(buf), L.ldD, static_cast<const T*>(p.other) + at, D, b.n - r0, D, RB, L.Dp);
  stage_async<kBlockThreads>(b.slice(buf), L.ldJ, static_cast<const T*>(p.slice) + at + b.col0, D, b.n - r0,
                             D - b.col0, RB, kSlice);
  __pipeline_commit();
}

// acc = own rows x state slice, each output row then times factor(row of the chunk).
template <bool StateT, class Out, class T, class F>
__device__ void state_term(Out& acc, const Layout& L, const BlockSetup<T>& b, int r0, int RB, F factor) {
  acc.zero();
  acc.template mma<false, StateT>(b.own + b.wm * (RB / 2) * L.ldD, L.ldD,
                                  StateT ? b.state + b.wn * 32 * L.ldD : b.state + b.wn * 32, StateT ? L.ldD : L.ldJ,
                                  L.Dp / 16);
  const int row0 = r0 + b.wm * (RB / 2);
  acc.template each_element<true>(b.scratch, [&](int i, int, int r, int, float& v) { v *= factor(row0 + i * 16 + r); });
}

// The score tile of the own rows (from chunk row r0) against the walked block in `buf` (from
// chunk row w0), masked and scaled into the shared score tile: the rows kernel's P[i][j] =
// s gamma^(i-j) a_i.b_j (j <= i < n), or with Transposed (the cols kernel: own rows are keys),
// P[j][i] for the same pairs. The warp whose share lies wholly on the masked side skips the product.
template <bool Transposed, int RB, class T>
__device__ void score_tile(const ChunkParams& p, const Layout& L, const BlockSetup<T>& b, int r0, int w0, int buf) {
  constexpr int H2 = RB / 2;
  using Score = WarpBlock<T, RB / 32, RB / 32>;
  const int m0 = r0 + b.wm * H2, k0 = w0 + b.wn * H2;  // first own row and first walked row of the warp's share
  Score sc;
  sc.zero();
  const bool live = Transposed ? k0 + H2 - 1 >= m0 : k0 <= m0 + H2 - 1;
  if (live) sc.template mma<false, true>(b.own + b.wm * H2 * L.ldD, L.ldD, b.buf(buf) + b.wn * H2 * L.ldD, L.ldD, L.Dp / 16);
  sc.template each_element<false>(b.scratch, [&](int i, int j, int r, int c, float& v) {
    const int m = m0 + i * 16 + r, k = k0 + j * 16 + c;
    const int query = Transposed ? k : m, key = Transposed ? m : k;
    const float w = key <= query && query < b.n ? v * p.scale * exp2f(b.log2g * float(query - key)) : 0.0f;
    b.scores[(b.wm * H2 + i * 16 + r) * L.ldP + b.wn * H2 + j * 16 + c] = from_float<T>(w);
  });
}

// Steps of 16 over a walked block from chunk row w0 that hold rows of the chunk (the rest, past a
// short or ragged chunk's end, are zeros in both operands of the product).
template <int RB, class T>
__device__ int walked_steps(const BlockSetup<T>& b, int w0) {
  return (min(RB, b.n - w0) + 15) / 16;
}

// The output tile's rows r0.. of the chunk (those < n, columns < D) into out.
template <int RB, class Out, class T>
__device__ void store_rows(Out& acc, const ChunkParams& p, const BlockSetup<T>& b, int r0) {
  const int row0 = r0 + b.wm * (RB / 2), c0 = b.col0 + b.wn * 32, D = p.D;
  float* out = p.out + b.tok;
  acc.template each_element<false>(b.scratch, [&](int i, int j, int er, int ec, float& v) {
    const int r = row0 + i * 16 + er, c = c0 + j * 16 + ec;
    if (r < b.n && c < D) out[std::size_t(r) * D + c] = v;
  });
}

template <class T, int RB, bool StateT, int MinBlocks>
__global__ void __launch_bounds__(kBlockThreads, MinBlocks) chunk_rows_kernel(ChunkParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(p.D, RB, int(sizeof(T)));
  const BlockSetup<T> b(p, L, smem);
  const int r0 = b.rb * RB;
  if (r0 >= b.n) return;  // a row block past a ragged last chunk: the whole block, before any barrier
  stage_own<StateT, RB>(p, L, b, r0);
  stage_walked<RB>(p, L, b, 0, 0);
  __pipeline_wait_prior(1);
  __syncthreads();
  WarpBlock<T, RB / 32, 2> acc;
  state_term<StateT>(acc, L, b, r0, RB, [&](int i) { return p.scale * exp2f(b.log2g * float(i + 1)); });
  for (int j = 0; j <= b.rb; ++j) {  // the key blocks the causal mask lets rows r0.. see
    const int buf = j & 1;
    if (j < b.rb) {
      stage_walked<RB>(p, L, b, (j + 1) * RB, buf ^ 1);  // read last before the barrier ending step j - 1
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    score_tile<false, RB>(p, L, b, r0, j * RB, buf);
    __syncthreads();
    acc.template mma<false, false>(b.scores + b.wm * (RB / 2) * L.ldP, L.ldP, b.slice(buf) + b.wn * 32, L.ldJ,
                                   walked_steps<RB>(b, j * RB));
    __syncthreads();
  }
  store_rows<RB>(acc, p, b, r0);
}

template <class T, int RB, bool StateT, int MinBlocks>
__global__ void __launch_bounds__(kBlockThreads, MinBlocks) chunk_cols_kernel(ChunkParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout L = make_layout(p.D, RB, int(sizeof(T)));
  const BlockSetup<T> b(p, L, smem);
  const int r0 = b.rb * RB, blocks = (b.n + RB - 1) / RB;
  if (r0 >= b.n) return;  // as in the rows kernel
  stage_own<StateT, RB>(p, L, b, r0);
  stage_walked<RB>(p, L, b, r0, 0);
  __pipeline_wait_prior(1);
  __syncthreads();
  WarpBlock<T, RB / 32, 2> acc;
  state_term<StateT>(acc, L, b, r0, RB, [&](int j) { return j < b.n ? exp2f(b.log2g * float(b.n - 1 - j)) : 0.0f; });
  for (int i = b.rb; i < blocks; ++i) {  // the query blocks that see keys r0..
    const int buf = (i - b.rb) & 1;
    if (i + 1 < blocks) {
      stage_walked<RB>(p, L, b, (i + 1) * RB, buf ^ 1);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    score_tile<true, RB>(p, L, b, r0, i * RB, buf);
    __syncthreads();
    acc.template mma<false, false>(b.scores + b.wm * (RB / 2) * L.ldP, L.ldP, b.slice(buf) + b.wn * 32, L.ldJ,
                                   walked_steps<RB>(b, i * RB));
    __syncthreads();
  }
  store_rows<RB>(acc, p, b, r0);
}

int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }

// Per multiprocessor a GPU has the opt-in limit per block plus the 1 KiB the runtime keeps per
// block (sm_80: 164 KiB and 163; sm_86 and sm_89: 100 and 99; sm_90: 228 and 227).
constexpr std::size_t kReservedPerBlock = 1024;

struct TileChoice {
  int rb = 0;          // rows per block; 0: nothing fits
  int min_blocks = 0;  // blocks per multiprocessor the choice was made for
};

// RB 64 (32 when the chunk has at most 32 rows) or 32: the larger with which two blocks share a
// multiprocessor (a block waits at its barriers; the other computes), else the larger that fits.
TileChoice choose_tiles(const Problem& p, Dtype dtype, std::size_t limit) {
  const int top = effective_chunk(p) > 32 ? 64 : 32;
  for (int blocks : {2, 1})
    for (int rb = top; rb >= 32; rb -= 32)
      if (blocks * (chunked_shared_bytes(p, dtype, rb) + kReservedPerBlock) <= limit + kReservedPerBlock)
        return {rb, blocks};
  return {};
}

enum class Kind { rows, cols };

template <class T, int RB, int MinBlocks>
void launch_as(Kind kind, bool state_t, const ChunkParams& params, dim3 grid, std::size_t shared, int device,
               cudaStream_t stream) {
  auto go = [&](auto kernel) {
    allow_shared(kernel, device, shared);
    kernel<<<grid, kBlockThreads, shared, stream>>>(params);
    LATTN_CUDA_CHECK_LAUNCH();
  };
  if (kind == Kind::rows)
    state_t ? go(chunk_rows_kernel<T, RB, true, MinBlocks>) : go(chunk_rows_kernel<T, RB, false, MinBlocks>);
  else
    state_t ? go(chunk_cols_kernel<T, RB, true, MinBlocks>) : go(chunk_cols_kernel<T, RB, false, MinBlocks>);
}

template <class T>
void launch_typed(Kind kind, bool state_t, const ChunkParams& params, TileChoice tiles, dim3 grid, std::size_t shared,
                  int device, cudaStream_t stream) {
  if (tiles.rb == 64)
    tiles.min_blocks == 2 ? launch_as<T, 64, 2>(kind, state_t, params, grid, shared, device, stream)
                          : launch_as<T, 64, 1>(kind, state_t, params, grid, shared, device, stream);
  else
    tiles.min_blocks == 2 ? launch_as<T, 32, 2>(kind, state_t, params, grid, shared, device, stream)
                          : launch_as<T, 32, 1>(kind, state_t, params, grid, shared, device, stream);
}

// One chunk-parallel launch: `own`, `other`, `slice` in the roles of the header's table.
void launch_chunks(const Problem& pr, Dtype dtype, Kind kind, bool state_t, const void* own, const void* other,
                   const void* slice, const void* states, float* out, cudaStream_t stream) {
  const int device = current_device();
  const TileChoice tiles = choose_tiles(pr, dtype, max_shared_bytes(device));
  if (tiles.rb == 0) throw RuntimeFailure("chunked: the tiles do not fit in shared memory");
  ChunkParams p{own, other, slice, states, out, pr.seq, pr.dim, pr.heads, effective_chunk(pr), 0, 0,
                pr.decay == Decay::retnet, float(attention_scale(pr.dim))};
  p.chunks = (p.T + p.C - 1) / p.C;
  p.row_blocks = (p.C + tiles.rb - 1) / tiles.rb;
  const std::size_t shared = chunked_shared_bytes(pr, dtype, tiles.rb);
  const dim3 grid(unsigned(pr.heads_total() * std::size_t(p.chunks) * std::size_t(p.row_blocks)),
                  unsigned((round16(pr.dim) + kSlice - 1) / kSlice));
  if (dtype == Dtype::f32)
    launch_typed<float>(kind, state_t, p, tiles, grid, shared, device, stream);
  else
    launch_typed<bf16>(kind, state_t, p, tiles, grid, shared, device, stream);
}

}  // namespace

std::size_t chunked_shared_bytes(const Problem& p, Dtype dtype, int rows_per_block) {
  return make_layout(p.dim, rows_per_block, element_size(dtype)).total;
}

ChunkedTiles chunked_tiles(const Problem& p, Dtype dtype, std::size_t max_shared_bytes) {
  const TileChoice t = choose_tiles(p, dtype, max_shared_bytes);
  return {t.rb, t.min_blocks};
}

std::size_t chunked_states_bytes(const Problem& p, Dtype dtype) {
  return chunk_state_elems(p) * std::size_t(element_size(dtype));
}

std::size_t chunked_forward_workspace_bytes(const Problem& p, Dtype dtype) { return chunked_states_bytes(p, dtype); }

std::size_t chunked_backward_workspace_bytes(const Problem& p, Dtype dtype, bool states_kept) {
  return (states_kept ? 1 : 2) * chunked_states_bytes(p, dtype);
}

std::optional<std::string> chunked_unsupported(const Problem& p, Dtype dtype, std::size_t limit) {
  if (p.delta()) return chunked_delta_unsupported(p, dtype, limit);  // cuda/chunked_delta.cu: its own kernels
  if (choose_tiles(p, dtype, limit).rb == 0)
    return "the CUDA chunked kernels' tiles for dim " + std::to_string(p.dim) + " need " +
           std::to_string(chunked_shared_bytes(p, dtype, 32)) + " bytes of shared memory per block; this device has " +
           std::to_string(limit);
  return std::nullopt;
}

std::vector<ChunkedKernel> chunked_kernels(const Problem& p, Dtype dtype) {
  const int device = current_device();
  const std::size_t limit = max_shared_bytes(device);
  const TileChoice tiles = choose_tiles(p, dtype, limit);
  std::vector<ChunkedKernel> kernels;
  const KernelShape pass = chunk_state_pass_shape(dtype);
  kernels.push_back({"chunk_state_kernel", pass.threads, 0, pass.shared, pass.min_blocks,
                     chunk_state_pass_occupancy(dtype)});
  if (tiles.rb == 0) return kernels;
  const std::size_t shared = chunked_shared_bytes(p, dtype, tiles.rb);
  auto occupancy = [&](auto kernel) {
    int blocks = 0;
    allow_shared(kernel, device, shared);
    LATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kBlockThreads, shared));
    return blocks;
  };
  // The four instantiations a case uses run on one shape; the rows kernel's stands for them.
  auto resident = [&](auto t) {
    using T = decltype(t);
    if (tiles.rb == 64)
      return tiles.min_blocks == 2 ? occupancy(chunk_rows_kernel<T, 64, false, 2>) : occupancy(chunk_rows_kernel<T, 64, false, 1>);
    return tiles.min_blocks == 2 ? occupancy(chunk_rows_kernel<T, 32, false, 2>) : occupancy(chunk_rows_kernel<T, 32, false, 1>);
  };
  const int blocks = dtype == Dtype::f32 ? resident(float{}) : resident(bf16{});
  for (const char* name : {"chunk_rows_kernel", "chunk_cols_kernel"})
    kernels.push_back({name, kBlockThreads, tiles.rb, shared, tiles.min_blocks, blocks});
  return kernels;
}

void chunked_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator, cudaStream_t stream,
                     void* kept_states) {
  Workspace<unsigned char> own(allocator, kept_states ? 0 : chunked_states_bytes(p, dtype));
  void* h = kept_states ? kept_states : own.data();
  chunk_state_pass(p, dtype, {a.k, a.v, a.h0, a.hT, h, false}, stream);
  launch_chunks(p, dtype, Kind::rows, false, a.q, a.k, a.v, h, a.o, stream);
}

void chunked_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                      cudaStream_t stream, const void* kept_states) {
  Workspace<unsigned char> own(allocator, kept_states ? 0 : chunked_states_bytes(p, dtype));
  Workspace<unsigned char> dh(allocator, chunked_states_bytes(p, dtype));
  const void* h = kept_states;
  if (!h) {  // the forward's states again: its state pass alone (no final state)
    chunk_state_pass(p, dtype, {a.k, a.v, a.h0, nullptr, own.data(), false}, stream);
    h = own.data();
  }
  chunk_state_pass(p, dtype, {a.q, a.dO, a.dhT, a.dh0, dh.data(), true}, stream);
  launch_chunks(p, dtype, Kind::rows, true, a.dO, a.v, a.k, h, a.dq, stream);
  launch_chunks(p, dtype, Kind::cols, false, a.k, a.q, a.dO, dh.data(), a.dv, stream);
  launch_chunks(p, dtype, Kind::cols, true, a.v, a.dO, a.q, dh.data(), a.dk, stream);
}

}  // namespace lattn::cuda

// The gated chunked form's host API (cuda/chunked_gated.hpp) and its last kernel, dg. Fixed gates
// (decay none, retnet) have no dg: neither this kernel nor the reverse pass's row sums run for them.
//
// Forward: the state pass (h_c of every chunk, hT), then the output kernel. Backward: the state
// pass again unless the forward's states were kept, the reverse state pass (dh_c, dh0 and dg's
// per-chunk state terms), the dV/dK kernel (one launch), the dQ kernel, then dg. With grouped heads
// the dK and dQ kernels write per value head ("key parts", as the scan does: dg needs each value head's
// own) and sum_group_keys (cuda/scan.cu) adds each group's parts into dq and dk: deterministic,
// no atomics.
//
// dg (docs/kernels.md, "Gated decays"): within chunk c, with S_c the state entering it and dS_c the
// gradient of that state, dg_i = rowsum(dS_c . S_c) - sum over the chunk's rows tau < i of
// (q_tau . dq_tau - k_tau . dk_tau) (per key channel; scalar gates sum the channels). The reverse
// state pass leaves rowsum(dS_c . S_c) per 32-column slice; one block per (chunk, value head)
// sums them and walks the chunk's rows in double.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/linear_attention/cuda/chunked_gated.cuh"

namespace lattn::cuda {

namespace {

constexpr int kDgThreads = 256;
constexpr int kStateCols = 32;  // the state pass's column slices (its row sums are per slice)

struct DgParams {
  GatedShape shape;
  const void* q;
  const void* k;
  const float* dq;  // per value head (the key parts, or dq itself with one value head per q/k head)
  const float* dk;
  const float* rowsums;  // [chunk][head][Dv slice][Dk]
  float* dg;
};

// The sum of a double over the block (kDgThreads threads), returned to all of them.
__device__ double block_total(double* shared, double x) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kDgThreads / 32; ++w) total += shared[w];
  __syncthreads();  // before the next call writes shared again
  return total;
}

template <class T, bool Vector>
__global__ void __launch_bounds__(kDgThreads) gated_dg_kernel(DgParams p) {
  __shared__ double partial[kDgThreads / 32];
  __shared__ double terms[kDgThreads];  // scalar gates: a batch of rows' q . dq - k . dk
  const GatedShape& s = p.shape;
  const int h = int(blockIdx.x) % s.H, k = int(blockIdx.x) / s.H;
  const ChunkRef ch = locate_chunk(s, k, h);
  const int Dk = s.Dk, tiles = (s.Dv + kStateCols - 1) / kStateCols;
  const T* q = static_cast<const T*>(p.q) + ch.key;
  const T* kk = static_cast<const T*>(p.k) + ch.key;
  const float* dq = p.dq + ch.key_part;
  const float* dk = p.dk + ch.key_part;
  const float* rs = p.rowsums + (std::size_t(k) * s.H + h) * tiles * Dk;
  float* dg = p.dg + ch.gate;
  auto term = [&](int i, int d) {
    const std::size_t e = std::size_t(i) * Dk + d;
    return double(to_float(q[e])) * dq[e] - double(to_float(kk[e])) * dk[e];
  };
  if constexpr (Vector) {
    for (int d = int(threadIdx.x); d < Dk; d += kDgThreads) {
      double acc = 0;
      for (int t = 0; t < tiles; ++t) acc += rs[std::size_t(t) * Dk + d];
      for (int i = 0; i < ch.n; ++i) {
        dg[std::size_t(i) * Dk + d] = float(acc);
        acc -= term(i, d);
      }
    }
  } else {
    double x = 0;
    for (int e = int(threadIdx.x); e < tiles * Dk; e += kDgThreads) x += rs[e];
    double acc = block_total(partial, x);
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    for (int i0 = 0; i0 < ch.n; i0 += kDgThreads) {
      const int rows = min(kDgThreads, ch.n - i0);
      for (int r = warp; r < rows; r += kDgThreads / 32) {  // a warp per row
        double y = 0;
        for (int d = lane; d < Dk; d += 32) y += term(i0 + r, d);
        for (int o = 16; o > 0; o /= 2) y += __shfl_xor_sync(0xffffffffu, y, o);
        if (lane == 0) terms[r] = y;
      }
      __syncthreads();
      if (threadIdx.x == 0)
        for (int r = 0; r < rows; ++r) {
          dg[i0 + r] = float(acc);
          acc -= terms[r];
        }
      __syncthreads();
    }
  }
}

void launch_dg(Dtype dtype, const DgParams& params, cudaStream_t stream) {
  const unsigned blocks = unsigned(std::size_t(params.shape.chunks) * params.shape.H);
  const bool vector = params.shape.vector;
  if (dtype == Dtype::f32)
    vector ? gated_dg_kernel<float, true><<<blocks, kDgThreads, 0, stream>>>(params)
           : gated_dg_kernel<float, false><<<blocks, kDgThreads, 0, stream>>>(params);
  else
    vector ? gated_dg_kernel<bf16, true><<<blocks, kDgThreads, 0, stream>>>(params)
           : gated_dg_kernel<bf16, false><<<blocks, kDgThreads, 0, stream>>>(params);
  LATTN_CUDA_CHECK_LAUNCH();
}

int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }

// A packed problem's tables: the documents' boundaries, then the first chunk of each.
std::size_t table_ints(const Problem& p) { return p.packed() ? 2 * p.cu_seqlens.size() : 0; }

GatedShape gated_shape(const Problem& p, const Workspace<int>& tables, cudaStream_t stream) {
  GatedShape s{};
  s.T = p.seq, s.H = p.heads, s.Hk = p.qk_heads(), s.group = p.group();
  s.Dk = p.dim, s.Dv = p.value_dim(), s.W = p.gate_width();
  s.C = effective_chunk(p);
  s.chunks = gated_chunk_count(p);
  s.per_seq = (p.seq + s.C - 1) / s.C;
  s.vector = p.decay == Decay::vector;
  s.gates = gate_kind(p);
  s.retnet = p.decay == Decay::retnet;
  s.scale = float(attention_scale(p.dim));
  if (p.packed()) {
    const std::size_t n = p.cu_seqlens.size();
    std::vector<int> host(2 * n);
    std::copy(p.cu_seqlens.begin(), p.cu_seqlens.end(), host.begin());
    host[n] = 0;
    for (std::size_t d = 0; d + 1 < n; ++d)
      host[n + d + 1] = host[n + d] + (p.cu_seqlens[d + 1] - p.cu_seqlens[d] + s.C - 1) / s.C;
    // From pageable memory: cudaMemcpyAsync stages the copy before it returns.
    LATTN_CUDA_CHECK(cudaMemcpyAsync(tables.data(), host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
    s.docs = int(n - 1);
    s.cu = tables.data();
    s.first = tables.data() + n;
  }
  return s;
}

std::size_t rowsum_floats(const Problem& p) {
  if (gate_kind(p) == kFixedGates) return 0;  // no dg
  return std::size_t(gated_chunk_count(p)) * p.heads * ((p.value_dim() + kStateCols - 1) / kStateCols) * p.dim;
}

std::size_t key_part_floats(const Problem& p) {
  return p.group() > 1 ? p.heads_total() * std::size_t(p.seq) * p.dim : 0;
}

// Per multiprocessor a GPU has the opt-in limit per block plus the 1 KiB the runtime keeps per block.
constexpr std::size_t kReservedPerBlock = 1024;

const char* const kKernels[] = {"output", "dkv", "dq"};

}  // namespace

int gate_kind(const Problem& p) {
  return p.decay == Decay::vector ? kVectorGates : p.decay == Decay::scalar ? kScalarGates : kFixedGates;
}

int gated_chunk_count(const Problem& p) {
  const int C = effective_chunk(p);
  if (!p.packed()) return p.batch * ((p.seq + C - 1) / C);
  int total = 0;
  for (std::size_t d = 0; d + 1 < p.cu_seqlens.size(); ++d) total += (p.cu_seqlens[d + 1] - p.cu_seqlens[d] + C - 1) / C;
  return total;
}

std::size_t chunked_gated_states_bytes(const Problem& p, Dtype dtype) {
  return std::size_t(gated_chunk_count(p)) * p.heads * p.dim * std::size_t(p.value_dim()) * element_size(dtype);
}

std::size_t chunked_gated_forward_workspace_bytes(const Problem& p, Dtype dtype) {
  return table_ints(p) * sizeof(int) + chunked_gated_states_bytes(p, dtype);
}

std::size_t chunked_gated_backward_workspace_bytes(const Problem& p, Dtype dtype, bool states_kept) {
  return table_ints(p) * sizeof(int) + (states_kept ? 1 : 2) * chunked_gated_states_bytes(p, dtype) +
         (rowsum_floats(p) + 2 * key_part_floats(p)) * sizeof(float);
}

std::size_t gated_shared_bytes(const std::string& kernel, const Problem& p, Dtype dtype, int rows_per_block) {
  if (kernel == "output") return gated_output_shared_bytes(p, dtype, rows_per_block);
  if (kernel == "dkv") return gated_dkv_shared_bytes(p, dtype, rows_per_block);
  return gated_dq_shared_bytes(p, dtype, rows_per_block);
}

// RB 64 (bf16, chunks over 32 rows) with two blocks per multiprocessor, else RB 32 with two, else
// RB 32 alone: the launch bounds the kernels are built with. float32 takes RB 32 only: its FMA
// tiles with 64 rows go past the 128 registers a thread two blocks of 256 threads allow.
GatedTiles gated_tiles(const std::string& kernel, const Problem& p, Dtype dtype, std::size_t limit) {
  auto fits = [&](int rb, int blocks) {
    return blocks * (gated_shared_bytes(kernel, p, dtype, rb) + kReservedPerBlock) <= limit + kReservedPerBlock;
  };
  if (dtype == Dtype::bf16 && effective_chunk(p) > 32 && fits(64, 2)) return {64, 2};
  if (fits(32, 2)) return {32, 2};
  if (fits(32, 1)) return {32, 1};
  return {};
}

std::optional<std::string> chunked_gated_unsupported(const Problem& p, Dtype dtype, std::size_t limit) {
  for (const char* kernel : kKernels)
    if (gated_tiles(kernel, p, dtype, limit).rows_per_block == 0)
      return std::string("the CUDA chunked_gated ") + kernel + " kernel's tiles for dim " + std::to_string(p.dim) +
             ", dim_v " + std::to_string(p.value_dim()) + " need " +
             std::to_string(gated_shared_bytes(kernel, p, dtype, 32)) +
             " bytes of shared memory per block; this device has " + std::to_string(limit);
  const std::size_t pass = gated_state_pass_shared_bytes(dtype, gate_kind(p));
  if (pass > limit)
    return "the CUDA chunked_gated state pass needs " + std::to_string(pass) +
           " bytes of shared memory per block; this device has " + std::to_string(limit);
  return std::nullopt;
}

std::vector<ChunkedKernel> chunked_gated_kernels(const Problem& p, Dtype dtype) {
  const std::size_t limit = max_shared_bytes(current_device());
  std::vector<ChunkedKernel> kernels;
  const int gates = gate_kind(p);
  kernels.push_back({"gated_state_kernel", gated_state_pass_threads(), 0, gated_state_pass_shared_bytes(dtype, gates),
                     gated_state_pass_blocks(dtype, gates), gated_state_pass_occupancy(dtype, gates),
                     gated_state_pass_grid(p)});
  for (const char* kernel : kKernels) {
    const GatedTiles tiles = gated_tiles(kernel, p, dtype, limit);
    if (tiles.rows_per_block == 0) continue;
    const std::string name = kernel;
    const int resident = name == "output" ? gated_output_occupancy(p, dtype, tiles)
                         : name == "dkv"  ? gated_dkv_occupancy(p, dtype, tiles)
                                          : gated_dq_occupancy(p, dtype, tiles);
    kernels.push_back({"gated_" + name + "_kernel", kGatedThreads, tiles.rows_per_block,
                       gated_shared_bytes(kernel, p, dtype, tiles.rows_per_block), tiles.blocks_per_sm, resident});
  }
  return kernels;
}

void chunked_gated_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator,
                           cudaStream_t stream, void* kept_states) {
  Workspace<int> tables(allocator, table_ints(p));
  const GatedShape shape = gated_shape(p, tables, stream);
  Workspace<unsigned char> own(allocator, kept_states ? 0 : chunked_gated_states_bytes(p, dtype));
  void* h = kept_states ? kept_states : own.data();
  gated_state_pass(p, dtype, shape, {a.k, a.v, a.g, a.h0, a.hT, h, nullptr, nullptr, false}, stream);
  gated_output(p, dtype, shape, {a.q, a.k, a.v, nullptr, a.g, h, a.o}, stream);
}

void chunked_gated_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                            cudaStream_t stream, const void* kept_states) {
  Workspace<int> tables(allocator, table_ints(p));
  const GatedShape shape = gated_shape(p, tables, stream);
  Workspace<unsigned char> own(allocator, kept_states ? 0 : chunked_gated_states_bytes(p, dtype));
  Workspace<unsigned char> dh(allocator, chunked_gated_states_bytes(p, dtype));
  Workspace<float> rowsums(allocator, rowsum_floats(p));
  Workspace<float> parts(allocator, 2 * key_part_floats(p));
  const void* h = kept_states;
  if (!h) {  // the forward's states again: its state pass alone (no final state)
    gated_state_pass(p, dtype, shape, {a.k, a.v, a.g, a.h0, nullptr, own.data(), nullptr, nullptr, false}, stream);
    h = own.data();
  }
  const bool dg = shape.gates != kFixedGates;  // fixed gates have no dg, nor its row sums
  gated_state_pass(p, dtype, shape, {a.q, a.dO, a.g, a.dhT, a.dh0, dh.data(), h, dg ? rowsums.data() : nullptr, true},
                   stream);
  const bool grouped = p.group() > 1;
  float* dq = grouped ? parts.data() : a.dq;
  float* dk = grouped ? parts.data() + key_part_floats(p) : a.dk;
  gated_dkv(p, dtype, shape, {a.q, a.k, a.v, a.dO, a.g, dh.data(), a.dv, dk}, stream);
  gated_dq(p, dtype, shape, {a.q, a.k, a.v, a.dO, a.g, h, dq}, stream);
  if (dg) launch_dg(dtype, {shape, a.q, a.k, dq, dk, rowsums.data(), a.dg}, stream);
  if (grouped) {
    sum_group_keys(p, dq, a.dq, stream);
    sum_group_keys(p, dk, a.dk, stream);
  }
}

}  // namespace lattn::cuda

// The chunkwise-parallel form of the additive rule on the GPU, every decay: scalar or vector gates
// read from g, and decay none and retnet as fixed log-gates per value head (no g read, no dg). Its
// host API, which the CUDA variant table's chunked_gated (scalar, vector) and chunked (none,
// retnet) rows run (cuda/variants.cpp), and what its .cu files share. Host-side declarations only;
// every pointer is device memory in the layouts of kernels/linear_attention/problem.hpp. docs/cuda.md
// ("Gated decays, chunked") describes the kernels:
//   cuda/chunked_gated_states.cu  the state pass, forward (h_c, hT) and reverse (dh_c, dh0, dg's
//                                 per-chunk state term)
//   cuda/chunked_gated_output.cu  O, chunk-parallel
//   cuda/chunked_gated_dkv.cu     dV and dK, chunk-parallel, one launch
//   cuda/chunked_gated_dq.cu      dQ, chunk-parallel
//   cuda/chunked_gated.cu         dg, and the host API below
//   cuda/chunked_gated.cuh, cuda/chunked_gated_gates.cuh   the device code they share
// Every shape of docs/spec.md section 1c is taken as it is (grouped q/k heads, dim_v != dim,
// packed documents): a block works on one (sequence, value head) pair's chunk.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cuda {

// ---- the host API ----

// kept_states (chunked_gated_states_bytes of device memory, or null): the forward writes the chunk
// states there, and the backward reads them instead of recomputing them (`bwd_states: kept`).
void chunked_gated_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                           cudaStream_t stream, void* kept_states = nullptr);
void chunked_gated_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                            cudaStream_t stream, const void* kept_states = nullptr);

// Chunks of every value head: the sum over the sequences (batch rows, or packed documents) of
// ceil(length / chunk).
int gated_chunk_count(const Problem& problem);
// One set of chunk states: chunks x heads x Dk x Dv elements of the token dtype.
std::size_t chunked_gated_states_bytes(const Problem& problem, Dtype dtype);
// What the forward (without kept states) and the backward take from the allocator: a packed
// problem's tables (2 (documents + 1) ints), the states unless kept, and in the backward the
// states' gradients, dg's per-chunk state terms (chunks x heads x ceil(Dv / 32) x Dk floats) and,
// with grouped heads, dq and dk per value head (2 B H T Dk floats).
std::size_t chunked_gated_forward_workspace_bytes(const Problem& problem, Dtype dtype);
std::size_t chunked_gated_backward_workspace_bytes(const Problem& problem, Dtype dtype, bool states_kept);

// Why a problem cannot run on a device with `max_shared_bytes` of opt-in shared memory per block
// (the widest kernel's tiles, which grow with dim and dim_v), or nothing.
std::optional<std::string> chunked_gated_unsupported(const Problem& problem, Dtype dtype,
                                                     std::size_t max_shared_bytes);
// The tiles the launch code chooses for each chunk-parallel kernel under an opt-in limit.
struct GatedTiles {
  int rows_per_block = 0;  // 64 or 32; 0 when none fits
  int blocks_per_sm = 0;   // what its launch bounds promise: 2 or 1
};
// kernel: "output", "dkv" (dV and dK) or "dq".
GatedTiles gated_tiles(const std::string& kernel, const Problem& problem, Dtype dtype, std::size_t max_shared_bytes);
std::size_t gated_shared_bytes(const std::string& kernel, const Problem& problem, Dtype dtype, int rows_per_block);
// The gated form's kernels as a case launches them on the current device (chunked_kernels' fields).
std::vector<ChunkedKernel> chunked_gated_kernels(const Problem& problem, Dtype dtype);

// ---- what the .cu files share ----

// The kernels' gate modes (a template argument of each): log-gates read from g per token (scalar)
// or per token and key channel (vector), or fixed per value head (decay none: 0, retnet: log
// gamma_h), which read no g and write no dg.
constexpr int kScalarGates = 0, kVectorGates = 1, kFixedGates = 2;
int gate_kind(const Problem& problem);

// A problem as the kernels see it (cuda/chunked_gated.cuh locates a chunk from it). Chunk k (of
// every value head) is chunk c of sequence n, numbered sequence by sequence.
struct GatedShape {
  int T;             // tokens of a batch row (a packed batch: all its documents)
  int H, Hk, group;  // value heads, q/k heads, value heads per q/k head
  int Dk, Dv, W;     // key dim, value dim, log-gates per token (Dk: vector, 1: scalar)
  int C;             // the chunk (at most T)
  int chunks;        // chunks of every value head (all sequences)
  int per_seq;       // dense: chunks per batch row
  int docs;          // packed: documents
  const int* cu;     // packed: the documents' boundaries (docs + 1); null: dense
  const int* first;  // packed: the first chunk of each document (docs + 1)
  bool vector;
  int gates;    // kScalarGates, kVectorGates or kFixedGates (none, retnet: no g read)
  bool retnet;  // fixed gates: log gamma_h per value head (retnet) or 0 (none)
  float scale;  // dim^-1/2
};

// The pointers a chunk-parallel kernel reads and writes (the roles each kernel gives them are in
// its file). states: h_c (or dh_c), the token dtype; out (and dk): float32.
struct GatedArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* dO;
  const float* g;
  const void* states;
  float* out;
  float* dk = nullptr;  // the dV/dK kernel: dK (out: dV)
};

// The state pass (cuda/chunked_gated_states.cu): per sequence and value head, chunk by chunk
//   forward: stores S (entering chunk c) into states[c], then S <- diag(exp(b_last)) S +
//            (K . exp(b_last - b))^T V, from S = h0; the last S into final_state (hT)
//   reverse: stores dS (leaving chunk c) into states[c], then dS <- diag(exp(b_last)) dS +
//            s (Q . exp(b))^T dO, from dS = dhT; the last into final_state (dh0); after chunk c,
//            rowsums[c][h][Dv slice][d] = sum over the 32-column slice's columns of dS[d][.] h_c[d][.] (dg's
//            state term), h_c read from fwd_states.
struct GatedStatePass {
  const void* a;  // K or Q
  const void* x;  // V or dO
  const float* g;
  const float* s0;
  float* final_state;  // may be null
  void* states;
  const void* fwd_states;  // reverse only
  float* rowsums;          // reverse only
  bool reverse;
};
void gated_state_pass(const Problem& problem, Dtype dtype, const GatedShape& shape, const GatedStatePass& args,
                      cudaStream_t stream);

// The chunk-parallel launches, each with the tiles gated_tiles chooses for it.
void gated_output(const Problem& problem, Dtype dtype, const GatedShape& shape, const GatedArgs& args,
                  cudaStream_t stream);
// dV into out and dK into dk (states: dh_c); dK, as dQ, in the per-value-head key layout
// [B][H][T][Dk] (dk itself with one value head per q/k head).
void gated_dkv(const Problem& problem, Dtype dtype, const GatedShape& shape, const GatedArgs& args,
               cudaStream_t stream);
// dQ into out (states: h_c).
void gated_dq(const Problem& problem, Dtype dtype, const GatedShape& shape, const GatedArgs& args,
              cudaStream_t stream);
std::size_t gated_output_shared_bytes(const Problem& problem, Dtype dtype, int rows_per_block);
std::size_t gated_dkv_shared_bytes(const Problem& problem, Dtype dtype, int rows_per_block);
std::size_t gated_dq_shared_bytes(const Problem& problem, Dtype dtype, int rows_per_block);
// The state pass (both directions): shared memory per block, the blocks per multiprocessor its
// launch bounds promise on the current device, threads per block and blocks per launch (one per
// sequence, value head, 64 state rows and 32 state columns).
std::size_t gated_state_pass_shared_bytes(Dtype dtype, int gates);
int gated_state_pass_blocks(Dtype dtype, int gates);
int gated_state_pass_threads();
std::size_t gated_state_pass_grid(const Problem& problem);
// Resident blocks per multiprocessor of each kernel as launched (cudaOccupancy...).
int gated_state_pass_occupancy(Dtype dtype, int gates);
int gated_output_occupancy(const Problem& problem, Dtype dtype, GatedTiles tiles);
int gated_dkv_occupancy(const Problem& problem, Dtype dtype, GatedTiles tiles);
int gated_dq_occupancy(const Problem& problem, Dtype dtype, GatedTiles tiles);

}  // namespace lattn::cuda

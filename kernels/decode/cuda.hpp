// The decode step on the GPU (cuda.cu): every rule and decay, grouped heads and a Dk x Dv
// state, float32 or bf16 q, k, v, a float32 or bf16 state updated in place, contiguous or in a pool. Its reference is reference.cpp
// beside it; the test table (tests/op_table.hpp) checks it on a GPU and on the CPU emulation
// (tests/cuda_emulation).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "kernels/cuda/dtype.hpp"
#include "kernels/decode/problem.hpp"

namespace lattn::cuda {

// A thread holds up to 16 state rows (key channels), and a head's rows are split over at most 32
// row groups of a 256-thread block: 512 rows. The value dim is not bounded: blocks take its
// columns in slices.
constexpr int kDecodeMaxDim = 512;

// How decode_step launches a problem (cuda.cu's comment says why): a thread holds one vector of
// `vector` state columns (4: 16 bytes of float32, 8 of bf16) in each of its rows_per_thread rows;
// a head's slice of column_vectors x vector columns takes row_groups x column_vectors threads,
// heads_per_block heads a block (threads in all), blocks x column_slices blocks. The tokens are
// staged stage_tokens at a time in shared_bytes of shared memory (no opt-in).
struct DecodeLaunch {
  int vector = 0;
  bool vectorised = false;  // Dv a multiple of `vector`: one load and store per vector (else element by element)
  int rows_per_thread = 0, row_groups = 0, column_vectors = 0, heads_per_block = 0;
  int column_slices = 0, threads = 0, stage_tokens = 0;
  unsigned blocks = 0;
  std::size_t shared_bytes = 0;
};
// The launch on a device of `multiprocessors` multiprocessors.
DecodeLaunch decode_launch(const DecodeProblem& p, int multiprocessors);

// Why the kernel cannot run this step, or nothing.
std::optional<std::string> decode_unsupported(const DecodeProblem& p);

// q, k, v in `dtype` (bf16 as raw 16-bit patterns); the states float32 (args.state) or bf16
// (args.state_bf16, for a problem with state_bf16), at their slots of a pool where the problem is
// pooled (args.state_index, on the device); the rest float32. No scratch.
void decode_step(const DecodeProblem& p, Dtype dtype, const DecodeArgs<void>& args, cudaStream_t stream);

// Outside the timed calls: each sequence's states from h0 (float32, [batch][H][Dk][Dv]) into its
// slot in the state's dtype, and back from the slots into hT (float32, the same layout).
void decode_seed_states(const DecodeProblem& p, const DecodeArgs<void>& args, const float* h0, cudaStream_t stream);
void decode_gather_states(const DecodeProblem& p, const DecodeArgs<void>& args, float* hT, cudaStream_t stream);

}  // namespace lattn::cuda

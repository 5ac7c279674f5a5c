// The decode step on the GPU (cuda.cu): every rule and decay, grouped heads and a Dk x Dv
// state, float32 or bf16 q, k, v, a float32 or bf16 state updated in place, contiguous or in a pool. Its reference is reference.cpp
// beside it; the test table (tests/op_table.hpp) checks it on a GPU and on the CPU emulation
// (tests/cuda_emulation).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "kernels/cuda/dtype.hpp"
#include "kernels/decode/problem.hpp"

namespace lattn::cuda {

// A block's warps hold 16 state rows (key channels) per thread: 32 warps of a 1024-thread block
// hold 512 rows. The value dim is not bounded: blocks take its columns 32 at a time.
constexpr int kDecodeMaxDim = 512;

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

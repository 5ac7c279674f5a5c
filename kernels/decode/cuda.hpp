// The decode step on the GPU (cuda.cu): every rule and decay, grouped heads and a Dk x Dv
// state, float32 or bf16 q, k, v, a float32 state updated in place. Its reference is reference.cpp
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

// q, k, v in `dtype` (bf16 as raw 16-bit patterns); the rest float32. No scratch.
void decode_step(const DecodeProblem& p, Dtype dtype, const DecodeArgs<void>& args, cudaStream_t stream);

}  // namespace lattn::cuda

// The modern layer block (docs/spec.md section 2b) on the CPU, float32: the template of block.hpp with
// OpenBLAS products (cpu/products.hpp) and the kernel suite's CPU kernels for the linear branch and
// the sliding window. Every temporary comes from `allocator`; the peak scratch in closed form
// (tested in tests/run/test_memory.cpp).
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/layer/block/block.hpp"
#include "kernels/layer/hybrid/cpu.hpp"

namespace lattn::cpu {

void block_forward(const LayerProblem& problem, const BlockArgs<float>& args, Allocator& allocator);
void block_forward_backward(const LayerProblem& problem, const BlockArgs<float>& args, Allocator& allocator);
std::size_t block_forward_workspace_bytes(const LayerProblem& problem);
std::size_t block_forward_backward_workspace_bytes(const LayerProblem& problem);
// The chunk states a fwd_bwd call's chunked branch keeps for its backward (part of the workspace).
std::size_t block_kept_chunk_states_bytes(const LayerProblem& problem);

// A bf16 case on AMX tiles, as the hybrid block's (hybrid/cpu.hpp: layer_forward_bf16): x and dOut
// bf16 in `tokens` (args' x and dOut not read), every product of block.hpp on AMX tiles, the
// chunked branch on its AMX row (no kept chunk states), the rest float32. Scratch exact.
void block_forward_bf16(const LayerProblem& problem, const BlockArgs<float>& args, const LayerBf16Tokens& tokens,
                        Allocator& allocator);
void block_forward_backward_bf16(const LayerProblem& problem, const BlockArgs<float>& args,
                                 const LayerBf16Tokens& tokens, Allocator& allocator);
std::size_t block_forward_bf16_workspace_bytes(const LayerProblem& problem);
std::size_t block_forward_backward_bf16_workspace_bytes(const LayerProblem& problem);

}  // namespace lattn::cpu

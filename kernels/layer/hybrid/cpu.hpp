// CPU float32 hybrid block of the layer suite (docs/spec.md section 2): projections, the linear branch
// (kernels/linear_attention/cpu/kernels.hpp), the sliding window (kernels/sliding_window/cpu.hpp), the norm
// and the gate. OpenMP threads set by the caller, every temporary from `allocator`, and the peak
// scratch in closed form (*_workspace_bytes, tested in tests/run/test_memory.cpp).
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn::cpu {

// The hybrid block: out only, or out and every gradient in one call (the backward runs from what
// the forward kept in scratch).
void layer_forward(const LayerProblem& problem, const LayerForwardArgs<float>& args, Allocator& allocator);
void layer_forward_backward(const LayerProblem& problem, const LayerBackwardArgs<float>& args,
                            Allocator& allocator);
std::size_t layer_forward_workspace_bytes(const LayerProblem& problem);
std::size_t layer_forward_backward_workspace_bytes(const LayerProblem& problem);
// The chunk states a fwd_bwd call's chunked branch keeps for its backward (part of the workspace
// above): 0 for scan, when keep_chunk_states is off, or where the chunked path cannot keep them.
std::size_t layer_kept_chunk_states_bytes(const LayerProblem& problem);

}  // namespace lattn::cpu

// CPU float32 hybrid block of the layer suite (docs/spec.md section 2): projections, the linear branch
// (kernels/linear_attention/cpu/kernels.hpp), the sliding window (kernels/sliding_window/cpu.hpp), the norm
// and the gate. OpenMP threads set by the caller, every temporary from `allocator`, and the peak
// scratch in closed form (*_workspace_bytes, tested in tests/run/test_memory.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

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

// A bf16 case (docs/kernels.md, "bf16 layers on AMX tiles"), where layer_amx_refusal
// (layer/cpu/products.hpp) finds nothing against it: x and dOut arrive bf16 (`tokens`; the args' x
// and dOut are not read), every other tensor float32. Every product runs on AMX tiles with float32
// accumulation, the chunked branch on its AMX row (which keeps no chunk states: the backward
// recomputes them), the window, norm and gate in float32 as above. Scratch exact, as above.
struct LayerBf16Tokens {
  const std::uint16_t* x = nullptr;
  const std::uint16_t* dOut = nullptr;  // fwd_bwd only
};
void layer_forward_bf16(const LayerProblem& problem, const LayerForwardArgs<float>& args,
                        const LayerBf16Tokens& tokens, Allocator& allocator);
void layer_forward_backward_bf16(const LayerProblem& problem, const LayerBackwardArgs<float>& args,
                                 const LayerBf16Tokens& tokens, Allocator& allocator);
std::size_t layer_forward_bf16_workspace_bytes(const LayerProblem& problem);
std::size_t layer_forward_backward_bf16_workspace_bytes(const LayerProblem& problem);

}  // namespace lattn::cpu

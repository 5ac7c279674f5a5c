// The delta rule's CPU kernels (docs/spec.md section 1b), behind the entry points of kernels.hpp, which call
// them for problems with rule delta: the scan (cpu/scan/scan_delta_forward.cpp and cpu/scan/scan_delta.cpp)
// and the chunked WY form (cpu/chunked/chunked_delta_forward.cpp and cpu/chunked/chunked_delta_backward.cpp).
// Scratch sizes in floats, in closed form (docs/kernels.md).
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

void scan_delta_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void scan_delta_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t scan_delta_forward_floats(const Problem& problem);
std::size_t scan_delta_backward_floats(const Problem& problem);

// The chunked form takes every shape of docs/spec.md section 1c (grouped q/k heads, Dk x Dv states,
// packed documents). keep: the chunk states (chunked_delta_kept_states_floats, allocated by the
// caller: each (sequence, value head) pair's own chunks), or null.
void chunked_delta_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator, float* keep);
void chunked_delta_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator,
                            const float* kept);
std::size_t chunked_delta_kept_states_floats(const Problem& problem);
std::size_t chunked_delta_forward_floats(const Problem& problem);
std::size_t chunked_delta_backward_floats(const Problem& problem, bool kept);

}  // namespace lattn::cpu

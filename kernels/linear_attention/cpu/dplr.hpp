// The diagonal-plus-low-rank rule's CPU kernels (`rule: dplr`, docs/spec.md section 1f), float32, every
// decay and the shapes of section 1c: the scan (cpu/scan/scan_dplr.cpp) and the chunked form
// (cpu/chunked/chunked_dplr.cpp). Their float64 reference is kernels/linear_attention/reference_dplr.cpp.
// Scratch sizes in floats, in closed form (the tests hold the kernels to them).
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

void scan_dplr_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void scan_dplr_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t scan_dplr_forward_floats(const Problem& problem);
std::size_t scan_dplr_backward_floats(const Problem& problem);

// The chunked form keeps no chunk states: its backward runs the forward over each slice's chunks
// again and keeps their entering states in its own scratch.
void chunked_dplr_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void chunked_dplr_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t chunked_dplr_forward_floats(const Problem& problem);
std::size_t chunked_dplr_backward_floats(const Problem& problem);

}  // namespace lattn::cpu

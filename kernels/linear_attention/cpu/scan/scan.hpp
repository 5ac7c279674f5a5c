// The additive rule's scan on the CPU (cpu/scan/scan.cpp), every decay: the `scan_columns` row of
// cpu/variants.cpp. Scratch in floats, in closed form.
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

void scan_columns_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void scan_columns_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t scan_columns_forward_floats(const Problem& problem);
std::size_t scan_columns_backward_floats(const Problem& problem);

}  // namespace lattn::cpu

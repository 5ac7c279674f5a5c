// Float64 ground truth of the layer suite (docs/spec.md section 2): the linear branch by
// kernels/linear_attention/reference.hpp, the sliding window by kernels/sliding_window/reference.hpp,
// the projections by dgemm.
#pragma once

#include "kernels/layer/problem.hpp"

namespace lattn::reference {

void layer_forward(const LayerProblem& problem, const LayerForwardArgs<double>& args);
// Writes out and every gradient.
void layer_forward_backward(const LayerProblem& problem, const LayerBackwardArgs<double>& args);

}  // namespace lattn::reference

// Float64 ground truth of the layer suite (SPEC section 2): the sliding-window attention written
// literally (a loop over each query's window), the linear branch by reference::forward/backward,
// the projections by dgemm.
#pragma once

#include "layer_problem.hpp"
#include "problem.hpp"

namespace lattn::reference {

// [batch][heads][seq][dim] tensors; lse may be null.
void sliding_window_forward(const Problem& problem, int window, const double* q, const double* k, const double* v,
                            double* o, double* lse);
// Overwrites dq, dk, dv with the gradients of <o, dO>.
void sliding_window_backward(const Problem& problem, int window, const double* q, const double* k, const double* v,
                             const double* dO, double* dq, double* dk, double* dv);

void layer_forward(const LayerProblem& problem, const LayerForwardArgs<double>& args);
// Writes out and every gradient.
void layer_forward_backward(const LayerProblem& problem, const LayerBackwardArgs<double>& args);

}  // namespace lattn::reference

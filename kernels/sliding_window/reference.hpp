// Float64 ground truth of the sliding-window softmax attention (docs/spec.md section 2): query t attends
// keys tau in [max(0, t - window + 1), t] with p = softmax(dim^-1/2 q_t . k_tau).
#pragma once

#include "kernels/linear_attention/problem.hpp"

namespace lattn::reference {

// [batch][heads][seq][dim] tensors; lse may be null.
void sliding_window_forward(const Problem& problem, int window, const double* q, const double* k, const double* v,
                            double* o, double* lse);
// Overwrites dq, dk, dv with the gradients of <o, dO>.
void sliding_window_backward(const Problem& problem, int window, const double* q, const double* k, const double* v,
                             const double* dO, double* dq, double* dk, double* dv);

}  // namespace lattn::reference

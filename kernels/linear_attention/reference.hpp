// Float64 ground truth for rel_err: the scan form of SPEC section 1, forward and backward.
#pragma once

#include "kernels/linear_attention/problem.hpp"

namespace lattn::reference {

// Writes o and hT. Threads over batch x heads.
void forward(const Problem& problem, const ForwardArgs<double>& args);

// Writes dq, dk, dv, dh0 of L = <O, dO> + <hT, dhT>. Memory O(D^2) per head: the state is
// recomputed by a forward recurrence for dq, then G runs in reverse for dk and dv.
void backward(const Problem& problem, const BackwardArgs<double>& args);

}  // namespace lattn::reference

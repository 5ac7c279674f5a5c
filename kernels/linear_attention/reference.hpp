// Float64 ground truth for rel_err: the scan form of docs/spec.md sections 1 and 1b (every decay, gated
// ones included), forward and backward; the other rules' in their own files, named below.
#pragma once

#include "kernels/linear_attention/problem.hpp"

namespace lattn::reference {

// Writes o and hT. Threads over batch x heads.
void forward(const Problem& problem, const ForwardArgs<double>& args);

// Writes dq, dk, dv, dh0 (and dg for gated decays) of L = <O, dO> + <hT, dhT>. Memory
// O(sqrt(T) D^2) per thread: states are checkpointed every sqrt(T) tokens and recomputed a segment
// at a time while G runs in reverse (reference.cpp).
void backward(const Problem& problem, const BackwardArgs<double>& args);

// rule dplr (docs/spec.md section 1f; reference_dplr.cpp): forward and backward call these for it.
void dplr_forward(const Problem& problem, const ForwardArgs<double>& args);
void dplr_backward(const Problem& problem, const BackwardArgs<double>& args);
// The trapezoidal rule's (docs/spec.md section 1e; reference_trapezoidal.cpp), which forward and
// backward hand rule trapezoidal to. Besides the above, backward writes dg, ddt and dtrap.
void trapezoidal_forward(const Problem& problem, const ForwardArgs<double>& args);
void trapezoidal_backward(const Problem& problem, const BackwardArgs<double>& args);

// The backwards' checkpointing: the longest sequence cut into `count` segments of `length` =
// ceil(sqrt(T)) tokens; a thread keeps the state before each segment and recomputes the length + 1
// states within one, O(sqrt(T)) states instead of T.
struct Segments {
  int length = 1, count = 1;
};
Segments sqrt_segments(const Problem& problem);

}  // namespace lattn::reference

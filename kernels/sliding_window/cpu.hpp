// CPU float32 sliding-window softmax attention (docs/spec.md section 2), the layer's second branch. Like
// every CPU kernel: OpenMP threads set by the caller, every temporary from `allocator`, and the
// peak scratch in closed form (*_workspace_bytes, tested in tests/run/test_memory.cpp). The shape is a
// linear-attention Problem's token layout (its chunk and decay are not read) and `window`.
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

// Sliding-window causal softmax attention on [batch][heads][seq][dim] tensors (problem.chunk and
// decay are not read): o_t = sum_tau softmax_tau(s q_t . k_tau) v_tau over tau in
// [max(0, t - window + 1), t], s = dim^-1/2. lse ([batch][heads][seq], may be null in the forward)
// is each row's log-sum-exp of the scaled scores, which the backward reads instead of a saved P.
struct SlidingWindowForwardArgs {
  const float *q, *k, *v;
  float *o, *lse;
};

// With accumulate, the gradients are added to what dq, dk, dv hold; otherwise they are overwritten.
struct SlidingWindowBackwardArgs {
  const float *q, *k, *v, *o, *lse, *dO;
  float *dq, *dk, *dv;
  bool accumulate = false;
};

// Rows of one query block: the unit of work and of the score scratch. A block computes
// Bq x (Bq + W - 1) scores of which Bq x W are in the window; 32 wastes 20% at W = 128 (64: 33%)
// while its products stay large enough for BLAS to run near its peak.
inline constexpr int kWindowQueryBlock = 32;

void sliding_window_forward(const Problem& problem, int window, const SlidingWindowForwardArgs& args,
                            Allocator& allocator);
void sliding_window_backward(const Problem& problem, int window, const SlidingWindowBackwardArgs& args,
                             Allocator& allocator);
std::size_t sliding_window_forward_workspace_bytes(const Problem& problem, int window);
std::size_t sliding_window_backward_workspace_bytes(const Problem& problem, int window);

}  // namespace lattn::cpu

// CPU float32 kernels of the layer suite (SPEC section 2): the sliding-window softmax attention
// and the whole hybrid block. Like kernels.hpp: OpenMP threads set by the caller, every temporary
// from `allocator`, and each kernel's peak scratch in closed form (*_workspace_bytes, tested).
#pragma once

#include <cstddef>

#include "layer_problem.hpp"
#include "problem.hpp"
#include "workspace.hpp"

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

}  // namespace lattn::cpu

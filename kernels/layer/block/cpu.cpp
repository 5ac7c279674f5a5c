// The modern layer block on the CPU (block/cpu.hpp): what block.hpp's template needs from the CPU.
// The projections are sgemms through cpu/products.hpp; the linear branch is the kernel suite's
// scan or chunked kernel for the case's rule and decay, so the block times exactly the kernels the
// kernel suite times.
#include "kernels/layer/block/cpu.hpp"

#include <algorithm>

#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/sliding_window/cpu.hpp"

namespace lattn::cpu {
namespace {

struct CpuOps {
  Allocator& allocator;
  bool chunked;
  float* chunk_states;  // kept by the chunked forward for its backward, or null

  Workspace<float> buffer(std::size_t n) { return Workspace<float>(allocator, n); }
  void product(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
    parallel_sgemm(trans_b, m, n, k, A, lda, B, ldb, 0.0f, C, ldc);
  }
  void weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C) {
    float* const outs[1] = {C};
    k_split_product(m, n, k, A, lda, B, ldb, outs, n, allocator);
  }
  void linear_forward(const Problem& p, const ForwardArgs<float>& args) {
    if (chunked)
      cpu::chunked_forward(p, args, allocator, chunk_states);
    else
      scan_forward(p, args, allocator);
  }
  void linear_backward(const Problem& p, const BackwardArgs<float>& args) {
    if (chunked)
      chunked_backward(p, args, allocator, chunk_states);
    else
      scan_backward(p, args, allocator);
  }
  void window_forward(const Problem& p, int window, const float* q, const float* k, const float* v, float* o,
                      float* lse) {
    sliding_window_forward(p, window, {q, k, v, o, lse}, allocator);
  }
  void window_backward(const Problem& p, int window, const float* q, const float* k, const float* v, const float* o,
                       const float* lse, const float* dO, float* dq, float* dk, float* dv) {
    sliding_window_backward(p, window, {q, k, v, o, lse, dO, dq, dk, dv, true}, allocator);
  }
};

std::size_t linear_forward_bytes(const LayerProblem& p, bool keep) {
  return p.chunked ? chunked_forward_workspace_bytes(p.linear, keep) : scan_forward_workspace_bytes(p.linear);
}

}  // namespace

std::size_t block_kept_chunk_states_bytes(const LayerProblem& p) {
  return p.chunked && p.keep_chunk_states ? chunked_kept_states_bytes(p.linear) : 0;
}

std::size_t block_forward_workspace_bytes(const LayerProblem& p) {
  const std::size_t window = p.block.window ? sliding_window_forward_workspace_bytes(p.linear, p.window) : 0;
  return block::sizes(p, false).forward() * sizeof(float) + std::max(linear_forward_bytes(p, false), window);
}

std::size_t block_forward_backward_workspace_bytes(const LayerProblem& p) {
  const block::Layout l = block::layout(p);
  const block::Sizes s = block::sizes(p, true);
  const std::size_t kept_states = block_kept_chunk_states_bytes(p);
  const bool kept = kept_states > 0;
  std::size_t transient = std::max(
      {linear_forward_bytes(p, kept),
       p.chunked ? chunked_backward_workspace_bytes(p.linear, kept) : scan_backward_workspace_bytes(p.linear),
       k_split_bytes(l.M, l.M, int(l.R)), k_split_bytes(l.M, l.cols, int(l.R))});
  if (l.r > 0) transient = std::max(transient, k_split_bytes(l.r, l.M, int(l.R)));
  if (l.window)
    transient = std::max({transient, sliding_window_forward_workspace_bytes(p.linear, p.window),
                          sliding_window_backward_workspace_bytes(p.linear, p.window)});
  return (s.forward() + s.backward()) * sizeof(float) + kept_states + transient;
}

void block_forward(const LayerProblem& p, const BlockArgs<float>& args, Allocator& allocator) {
  CpuOps ops{allocator, p.chunked, nullptr};
  block::run(p, args, ops, false);
}

void block_forward_backward(const LayerProblem& p, const BlockArgs<float>& args, Allocator& allocator) {
  Workspace<float> states(allocator, block_kept_chunk_states_bytes(p) / sizeof(float));
  CpuOps ops{allocator, p.chunked, states.size() ? states.data() : nullptr};
  block::run(p, args, ops, true);
}

}  // namespace lattn::cpu

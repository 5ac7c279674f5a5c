// Chunkwise-parallel form on the CPU, float32, forward and backward: the entry points, which pick
// the register-tiled AVX-512 implementation (chunked_tiled.cpp) or the OpenBLAS one
// (chunked_blas.cpp), and for gated decays cpu_chunked_gated.cpp (its own header has the
// mathematics with gates), and for the delta rule cpu_chunked_delta.cpp (the WY form).
//
// For a chunk of n rows (the last may be shorter than C) and the state S entering it
// (SPEC section 1; M the causal decay mask, lam_i = gamma^(i+1), gam_j = gamma^(n-1-j)):
//   O_c    = s ( ((Q_c K_c^T) . M) V_c + diag(lam) Q_c S )
//   S_next = gamma^n S + (diag(gam) K_c)^T V_c
// Backward walks the chunks from last to first with dS = dhT:
//   dA   = s (dO_c V_c^T) . M
//   dQ_c = dA K_c + s diag(lam) dO_c S^T
//   dK_c = dA^T Q_c + diag(gam) V_c dS^T
//   dV_c = s ((Q_c K_c^T) . M)^T dO_c + diag(gam) K_c dS
//   dS  <- gamma^n dS + s (diag(lam) Q_c)^T dO_c
// The backward needs the state entering each chunk. The tiled path's forward can keep them for
// every head (O(B * H * chunks * D^2), `bwd_states: "kept"`); otherwise the backward recomputes
// them per head into a per-thread buffer (`"recomputed"`, O(threads * chunks * D^2)).
#include <algorithm>
#include <stdexcept>

#include "kernels/linear_attention/cpu_chunked_tiled.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_delta.hpp"
#include "kernels/linear_attention/cpu_scan_pass.hpp"

namespace lattn::cpu {

bool chunked_uses_tiles() { return tiles_active(); }

std::size_t chunked_kept_states_bytes(const Problem& p) {
  if (p.delta()) return chunked_delta_kept_states_floats(p) * sizeof(float);
  if (gated(p.decay)) return chunked_gated_kept_states_floats(p) * sizeof(float);
  return chunked_uses_tiles() ? chunked_tiled_kept_states_floats(p) * sizeof(float) : 0;
}

std::size_t chunked_forward_workspace_bytes(const Problem& p, bool keep) {
  if (p.delta()) return chunked_delta_forward_floats(p) * sizeof(float);
  if (gated(p.decay)) return chunked_gated_forward_floats(p) * sizeof(float);
  if (chunked_uses_tiles()) return chunked_tiled_forward_floats(p, keep) * sizeof(float);
  return std::size_t(head_parallel_threads(p)) * chunked_blas_forward_floats(p) * sizeof(float);
}

std::size_t chunked_backward_workspace_bytes(const Problem& p, bool kept) {
  if (p.delta()) return chunked_delta_backward_floats(p, kept) * sizeof(float);
  if (gated(p.decay)) return chunked_gated_backward_floats(p, kept) * sizeof(float);
  if (chunked_uses_tiles()) return chunked_tiled_backward_floats(p, kept) * sizeof(float);
  return std::size_t(head_parallel_threads(p)) * chunked_blas_backward_floats(p) * sizeof(float);
}

std::size_t chunked_forward_backward_workspace_bytes(const Problem& p) {
  const std::size_t kept = chunked_kept_states_bytes(p);
  return kept + std::max(chunked_forward_workspace_bytes(p, kept > 0), chunked_backward_workspace_bytes(p, kept > 0));
}

void chunked_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  if (p.delta()) chunked_delta_forward(p, a, allocator, keep);
  else if (gated(p.decay)) chunked_gated_forward(p, a, allocator, keep);
  else if (chunked_uses_tiles()) chunked_tiled_forward(p, a, allocator, keep);
  else if (keep) throw std::logic_error("chunked_forward: the OpenBLAS path keeps no chunk states");
  else chunked_blas_forward(p, a, allocator);
}

void chunked_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  if (p.delta()) chunked_delta_backward(p, a, allocator, kept);
  else if (gated(p.decay)) chunked_gated_backward(p, a, allocator, kept);
  else if (chunked_uses_tiles()) chunked_tiled_backward(p, a, allocator, kept);
  else if (kept) throw std::logic_error("chunked_backward: the OpenBLAS path takes no kept chunk states");
  else chunked_blas_backward(p, a, allocator);
}

}  // namespace lattn::cpu

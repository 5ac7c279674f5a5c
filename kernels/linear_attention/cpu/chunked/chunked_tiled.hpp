// The additive rule's chunked form without gates: register-tiled AVX-512 products
// (cpu/chunked/chunked_tiled_forward.cpp and cpu/chunked/chunked_tiled_backward.cpp, the `chunked_tiled` row of
// cpu/variants.cpp) where AVX-512 is compiled in and active, OpenBLAS sgemm (cpu/chunked/chunked_blas.cpp,
// `chunked_blas`) otherwise; and the gated decays' chunked form (cpu/chunked/chunked_gated.cpp,
// `chunked_gated`). Scratch in floats in closed form: all threads' for the tiled path, one thread's
// for the BLAS path.
//
// For a chunk of n rows (the last may be shorter than C) and the state S entering it
// (docs/spec.md section 1; M the causal decay mask, lam_i = gamma^(i+1), gam_j = gamma^(n-1-j)):
//   O_c    = s ( ((Q_c K_c^T) . M) V_c + diag(lam) Q_c S )
//   S_next = gamma^n S + (diag(gam) K_c)^T V_c
// Backward walks the chunks from last to first with dS = dhT:
//   dA   = s (dO_c V_c^T) . M
//   dQ_c = dA K_c + s diag(lam) dO_c S^T
//   dK_c = dA^T Q_c + diag(gam) V_c dS^T
//   dV_c = s ((Q_c K_c^T) . M)^T dO_c + diag(gam) K_c dS
//   dS  <- gamma^n dS + s (diag(lam) Q_c)^T dO_c
// The backward needs the state entering each chunk. The tiled path's forward can keep them for
// every (sequence, value head) item (O(H * total chunks * Dk * Dv), `bwd_states: "kept"`);
// otherwise the backward recomputes them per item into a per-thread buffer (`"recomputed"`,
// O(threads * chunks * Dk * Dv)). The tiled and gated paths take the shapes of docs/spec.md
// section 1c as they are (grouped q/k heads, Dk != Dv, packed documents); the BLAS path takes
// square dense problems (the gather adapter runs it on the others).
#pragma once

#include <cstddef>

#include "kernels/linear_attention/problem.hpp"
#include "core/workspace.hpp"

namespace lattn::cpu {

// keep / kept: the chunk states of cpu/kernels.hpp's chunked_forward/backward (or null), sized by
// chunked_tiled_kept_states_floats.
void chunked_tiled_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator, float* keep);
void chunked_tiled_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator,
                            const float* kept);
std::size_t chunked_tiled_kept_states_floats(const Problem& problem);
std::size_t chunked_tiled_forward_floats(const Problem& problem, bool keep);
std::size_t chunked_tiled_backward_floats(const Problem& problem, bool kept);

void chunked_blas_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void chunked_blas_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t chunked_blas_forward_floats(const Problem& problem);
std::size_t chunked_blas_backward_floats(const Problem& problem);

// Gated decays (cpu/chunked/chunked_gated.cpp), on the tile products whichever vector width runs (their
// portable form without AVX-512): the forward keeps S^T entering each chunk when given `keep`
// (chunked_gated_kept_states_floats), the backward recomputes them without `kept`. Scratch in
// floats, all threads'.
void chunked_gated_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator, float* keep);
void chunked_gated_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator,
                            const float* kept);
std::size_t chunked_gated_kept_states_floats(const Problem& problem);
std::size_t chunked_gated_forward_floats(const Problem& problem);
std::size_t chunked_gated_backward_floats(const Problem& problem, bool kept);

}  // namespace lattn::cpu

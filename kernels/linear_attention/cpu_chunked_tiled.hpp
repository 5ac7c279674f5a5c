// The implementations behind chunked_forward/backward (kernels.hpp): register-tiled AVX-512
// products (chunked_tiled.cpp) where AVX-512 is compiled in and active, OpenBLAS sgemm
// (chunked_blas.cpp) otherwise; gated decays on their own (chunked_gated.cpp). Scratch in floats in closed form: all threads' for the tiled
// path, one thread's for the BLAS path.
#pragma once

#include <cstddef>

#include "kernels/linear_attention/problem.hpp"
#include "core/workspace.hpp"

namespace lattn::cpu {

// keep / kept: the chunk states of kernels.hpp's chunked_forward/backward (or null), sized by
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

// Gated decays (chunked_gated.cpp), on the tile products whichever vector width runs (their
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

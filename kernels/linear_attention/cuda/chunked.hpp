// What the chunked form's two CUDA files share (cuda/chunked.cu: the chunk-parallel kernels and
// the host API of kernels.hpp; chunk_states.cu: the sequential pass over the chunk states).
// Host-side declarations only; every pointer is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/dtype.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cuda {

// The chunk states in device memory: one D x D matrix per (batch x head, chunk), row-major, in
// the token dtype (float32, or bf16: the chunk-parallel kernels read them as a tensor-core operand,
// so they are rounded to bf16 there anyway; the pass that makes them carries the state in float32).
inline std::size_t chunk_state_elems(const Problem& p) {
  const std::size_t chunks = std::size_t((p.seq + p.chunk - 1) / p.chunk);
  return p.heads_total() * chunks * std::size_t(p.dim) * std::size_t(p.dim);
}

// One sequential pass over the chunks of every (batch x head), chunk by chunk in `reverse` or
// forward order, with n the chunk's rows, A_c and X_c its rows of a and x, w its row weights:
//     stores S (the value entering the chunk) into states[bh][chunk], then
//     S <- gamma^n S + (diag(w) A_c)^T X_c,
// from S = s0 (float32 D x D per head); the last S goes to final_state (float32; may be null).
//   forward (h):  a = K, x = V,  w_j = gamma^(n-1-j),   s0 = h0   -> states h_c, final hT
//   reverse (dh): a = Q, x = dO, w_i = s gamma^(i+1),   s0 = dhT  -> states dh_c (the gradient
//                 of the state leaving chunk c), final dh0
struct StatePassArgs {
  const void* a;
  const void* x;
  const float* s0;
  float* final_state;
  void* states;
  bool reverse;
};
void chunk_state_pass(const Problem& problem, Dtype dtype, const StatePassArgs& args, cudaStream_t stream);

// The pass's launch: threads, dynamic shared memory and the blocks per multiprocessor its
// __launch_bounds__ ask for.
struct KernelShape {
  int threads;
  std::size_t shared;
  int min_blocks;
};
KernelShape chunk_state_pass_shape(Dtype dtype);
// Resident blocks per multiprocessor of the pass's kernel with that shape (cudaOccupancy...).
int chunk_state_pass_occupancy(Dtype dtype);

}  // namespace lattn::cuda

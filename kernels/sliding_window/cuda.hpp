// CUDA sliding-window softmax attention (docs/spec.md section 2; cuda.cu beside this file), host-side
// declarations. Every pointer is device memory; each function only enqueues work on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"

namespace lattn::cuda {

// Query t attends keys tau in [max(0, t-W+1), t], p = softmax(dim^-1/2 q_t . k_tau). q, k, v, dO,
// o, dq, dk, dv: [batch][heads][seq][dim]; lse (the per-row log-sum-exp the forward saves for the
// backward, in the units of the scaled scores): [batch][heads][seq]. q, k, v, dO are float32 or
// bf16 by `dtype`; o, lse and the gradients are float32. O(seq * window) time, O(seq * dim) memory.
struct SwaProblem {
  int batch = 1;
  int heads = 1;
  int seq = 1;
  int dim = 1;
  int window = 1;  // W >= 1; W >= seq is full causal attention

  std::size_t heads_total() const { return std::size_t(batch) * heads; }
  std::size_t token_elems() const { return heads_total() * seq * dim; }  // one of q, k, v, o
  std::size_t row_elems() const { return heads_total() * seq; }          // lse
};

struct DeviceSwaForward {
  const void* q;
  const void* k;
  const void* v;
  float* o;
  float* lse;  // null: not kept (a forward-only call)
};

struct DeviceSwaBackward {
  const void* q;
  const void* k;
  const void* v;
  const void* dO;
  const float* o;    // the forward's outputs
  const float* lse;
  float* dq;
  float* dk;
  float* dv;
};

constexpr int kSwaMaxDim = 256;

void swa_forward(const SwaProblem& problem, Dtype dtype, const DeviceSwaForward& args, Allocator& allocator,
                 cudaStream_t stream);
// Three launches: D = rowsum(dO * O) into scratch, dK and dV per key block, dQ per query block.
void swa_backward(const SwaProblem& problem, Dtype dtype, const DeviceSwaBackward& args, Allocator& allocator,
                  cudaStream_t stream);

inline std::size_t swa_forward_workspace_bytes(const SwaProblem&) { return 0; }
// D_t = dO_t . o_t, one float per row: batch * heads * seq * 4 bytes.
inline std::size_t swa_backward_workspace_bytes(const SwaProblem& p) { return p.row_elems() * sizeof(float); }

// Shared memory of one block with `rows` query (and key) rows per block (16, 32 or 64); the
// backward's is the larger of its two tile kernels.
std::size_t swa_shared_bytes(const SwaProblem& problem, Dtype dtype, bool backward, int rows);
std::optional<std::string> swa_unsupported(const SwaProblem& problem, Dtype dtype, std::size_t max_shared_bytes);

}  // namespace lattn::cuda

// CUDA kernels of the layer (docs/spec.md section 2; kernels.cu beside this file): its layout changes, norm
// and gate. The projections run on cuBLAS and the branches on the linear-attention and
// sliding-window kernels; backends/cuda composes them. Every pointer is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "core/workspace.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn::cuda {

// float32 throughout. rows: [batch * seq][ld] (columns h * head_dim + j of head h), heads:
// [batch][heads][seq][head_dim]; the cuBLAS products and the branch kernels around them are
// composed by the backend (cuda_backend.cpp).
void layer_rows_to_heads(const LayerProblem& problem, const float* rows, int ld, float* heads, cudaStream_t stream);
// rows = a + c (c may be null), both in the heads layout; rows has leading dimension M.
void layer_heads_to_rows(const LayerProblem& problem, const float* a, const float* c, float* rows,
                         cudaStream_t stream);
// Y = sig(beta_h) RMSNorm(Lin_h) g_h + (1 - sig(beta_h)) Swa_h into the rows layout; rinv (may be
// null) keeps each (batch, head, token) row's 1 / RMS for the backward.
void layer_norm_gate_forward(const LayerProblem& problem, const float* g, const float* beta, const float* lin,
                             const float* swa, float* y, float* rinv, cudaStream_t stream);

struct LayerGateBackward {
  const float *g, *beta, *lin, *swa, *rinv, *dy;  // dy: rows layout
  float *dlin, *dswa;                           // heads layout
  float* dg_terms;                              // rows layout, scratch
  float* gate;                                  // one per (batch, head, token) row, scratch
  float *dg, *dbeta;                            // [M], [heads]
};
void layer_norm_gate_backward(const LayerProblem& problem, const LayerGateBackward& args, cudaStream_t stream);

// ---- The whole block (hybrid/cuda/layer.cpp): the kernels above, the branches' kernels, and the
// projections on a row-major sgemm the backend provides (cuBLAS) ----

// C = op(A) op(B) + beta C for row-major m x n C on device pointers, enqueued on the layer's stream.
using DeviceGemm = std::function<void(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda,
                                      const float* B, int ldb, float beta, float* C, int ldc)>;

// The layer's scratch, in the order one call takes it from its allocator (bytes per block): the
// backend sizes one device block by it, so that no call allocates inside a timed region.
std::vector<std::size_t> layer_scratch_slices(const LayerProblem& problem, bool backward);

// One fwd (out) or fwd_bwd (out and every gradient) call, enqueued on `stream`; float32.
void layer_enqueue(const LayerProblem& problem, bool backward, const LayerBackwardArgs<float>& args,
                   Allocator& scratch, const DeviceGemm& gemm, cudaStream_t stream);

}  // namespace lattn::cuda

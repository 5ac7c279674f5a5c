// CUDA kernels of SPEC section 1 (and, at the end, section 2's sliding window; docs/cuda.md),
// host-side declarations. Every pointer is device memory in the layouts of kernels/problem.hpp.
// Token tensors (q, k, v, dO) are float32 or bf16 (as raw 16-bit patterns) by `dtype`; states
// (h0, dhT) and every output are float32, and every product accumulates in float32. Each function
// only enqueues work on `stream` (asynchronous).
//
// None of the linear-attention kernels needs scratch memory (the sliding-window backward, at the
// end, takes one float per row): the chunked backward recomputes the chunk states
// instead of storing them, and the scan backward runs a forward recurrence for dq and a reverse
// one for dk, dv. The allocator is taken anyway, so that a kernel that does need scratch counts
// it, and the *_workspace_bytes closed forms (all 0) are held to the count by the tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "layer_problem.hpp"
#include "problem.hpp"
#include "workspace.hpp"

namespace lattn::cuda {

enum class Dtype { f32, bf16 };

struct DeviceForward {
  const void* q;
  const void* k;
  const void* v;
  const float* h0;
  float* o;
  float* hT;
};

struct DeviceBackward {
  const void* q;
  const void* k;
  const void* v;
  const float* h0;
  const void* dO;
  const float* dhT;
  float* dq;
  float* dk;
  float* dv;
  float* dh0;
};

// The scan kernels handle dim <= kScanMaxDim (the state slice lives in registers).
constexpr int kScanMaxDim = 256;

void scan_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                  cudaStream_t stream);
void scan_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                   cudaStream_t stream);
void chunked_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                     cudaStream_t stream);
void chunked_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                      cudaStream_t stream);

inline std::size_t scan_forward_workspace_bytes(const Problem&) { return 0; }
inline std::size_t scan_backward_workspace_bytes(const Problem&) { return 0; }
inline std::size_t chunked_forward_workspace_bytes(const Problem&) { return 0; }
inline std::size_t chunked_backward_workspace_bytes(const Problem&) { return 0; }

// Shared memory one chunked block needs with `rows_per_block` query rows staged at a time.
std::size_t chunked_shared_bytes(const Problem& problem, Dtype dtype, int rows_per_block);
// Why a case cannot run on a device with `max_shared_bytes` of opt-in shared memory per block.
std::optional<std::string> scan_unsupported(const Problem& problem);
std::optional<std::string> chunked_unsupported(const Problem& problem, Dtype dtype, std::size_t max_shared_bytes);

// ---- Sliding-window softmax attention (SPEC section 2, sliding_window.cu) ----
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
  float* lse;
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

// ---- The layer's layout changes and its norm and gate (SPEC section 2, layer.cu) ----
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

}  // namespace lattn::cuda

// CUDA kernels of SPEC section 1 (cuda_scan.cu, cuda_chunked.cu; docs/cuda.md), host-side
// declarations. Every pointer is device memory in the layouts of kernels/problem.hpp.
// Token tensors (q, k, v, dO) are float32 or bf16 (as raw 16-bit patterns) by `dtype`; states
// (h0, dhT) and every output are float32, and every product accumulates in float32. Each function
// only enqueues work on `stream` (asynchronous).
//
// None of these kernels needs scratch memory: the chunked backward recomputes the chunk states
// instead of storing them, and the scan backward runs a forward recurrence for dq and a reverse
// one for dk, dv. The allocator is taken anyway, so that a kernel that does need scratch counts
// it, and the *_workspace_bytes closed forms (all 0) are held to the count by the tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "kernels/linear_attention/problem.hpp"
#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"

namespace lattn::cuda {

// g: the log-gates of a gated decay, float32 whatever the dtype ([B][H][T] or [B][H][T][D]); null
// otherwise. dg: their gradient.
struct DeviceForward {
  const void* q;
  const void* k;
  const void* v;
  const float* h0;
  float* o;
  float* hT;
  const float* g = nullptr;
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
  const float* g = nullptr;
  float* dg = nullptr;
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
// The chunked kernels do not run gated decays (scalar, vector): this says so for those.
std::optional<std::string> chunked_unsupported(const Problem& problem, Dtype dtype, std::size_t max_shared_bytes);

}  // namespace lattn::cuda

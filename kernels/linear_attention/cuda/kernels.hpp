// CUDA kernels of docs/spec.md section 1 (cuda/scan.cu, cuda/scan_delta.cu, cuda/scan_dplr.cu,
// cuda/chunked_delta*.cu; docs/cuda.md), host-side declarations. Every pointer is device memory in the layouts of
// kernels/linear_attention/problem.hpp. Token tensors (q, k, v, dO) are float32 or bf16 (as raw
// 16-bit patterns) by `dtype`; states (h0, dhT) and every output are float32, and every product
// accumulates in float32. Each function only enqueues work on `stream` (asynchronous).
//
// The scan takes every shape of docs/spec.md section 1c (kernels/linear_attention/cuda/scan_shapes.cuh):
// its scratch is a packed problem's document boundaries and, with grouped heads, dq and dk per
// value head before their sum; the additive rule's backward runs a forward recurrence for dq and a
// reverse one for dk, dv and keeps nothing else (the delta rule's backward keeps a token tensor,
// the dplr rule's two, below). The additive rule's chunked form, every decay and shape, is cuda/chunked_gated.hpp's; the
// delta rule's (cuda/chunked_delta*.cu, below) takes every shape too. The *_workspace_bytes closed forms are held
// to the allocator's count by the tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

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
  const float* beta = nullptr;  // the delta rule's, float32 whatever the dtype
  // The further rules' inputs, float32 whatever the dtype (docs/spec.md sections 1e-1h): dplr's a and
  // b ([B][H][T][Dk]), the trapezoidal rule's dt and trap ([B][H][T]), the bonus u ([H][Dk]).
  const float* a = nullptr;
  const float* b = nullptr;
  const float* dt = nullptr;
  const float* trap = nullptr;
  const float* u = nullptr;
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
  const float* beta = nullptr;
  float* dbeta = nullptr;
  // As DeviceForward's, with their gradients.
  const float* a = nullptr;
  const float* b = nullptr;
  float* da = nullptr;
  float* db = nullptr;
  const float* dt = nullptr;
  const float* trap = nullptr;
  float* ddt = nullptr;
  float* dtrap = nullptr;
  const float* u = nullptr;
  float* du = nullptr;
};

// The scan kernels handle dim and dim_v <= kScanMaxDim (the state slice lives in registers, its
// rows Dk or, in the transposed passes, Dv).
constexpr int kScanMaxDim = 256;

// The scan's entry points: each runs the row of the scan's variant table (cuda/variants.cpp) that
// takes the problem.
void scan_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                  cudaStream_t stream);
void scan_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                   cudaStream_t stream);
// The additive rule's scan, every decay, and RWKV-6's bonus (cuda/scan.cu; the table's `scan` row). Scratch: a
// packed problem's boundaries; the backward's, with grouped heads, one set of key parts (dq, then dk, per
// value head), two for gated decays (dg reads both); the bonus's du per (sequence, value head) pair.
void scan_additive_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                           cudaStream_t stream);
void scan_additive_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                            cudaStream_t stream);
std::size_t scan_additive_forward_workspace_bytes(const Problem& problem);
std::size_t scan_additive_backward_workspace_bytes(const Problem& problem);
// dq or dk of every q/k head: the sum of its value heads' rows in `parts` ([B][H][T][Dk], device
// memory; cuda/scan.cu), for the scan's grouped heads.
void sum_group_keys(const Problem& problem, const float* parts, float* out, cudaStream_t stream);
// The delta rule's scan (cuda/scan_delta.cu; the table's `scan_delta` row): beside a packed
// problem's document boundaries, its backward keeps e_t = v_t - u_t of every token (a value
// tensor of floats), for scalar gates dg's per-channel sums (a key tensor per value head) and,
// with grouped heads, dq and dk per value head (two more).
void scan_delta_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                        cudaStream_t stream);
void scan_delta_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                         cudaStream_t stream);
std::size_t scan_delta_forward_workspace_bytes(const Problem& problem);
std::size_t scan_delta_backward_workspace_bytes(const Problem& problem);
// The diagonal-plus-low-rank rule's scan (cuda/scan_dplr.cu; the table's `scan_dplr` row): beside a
// packed problem's document boundaries, its backward keeps u_t = S_{t-1}^T b_t and z_t = G_t^T a_t
// of every token (two value tensors of floats), for scalar gates dg's per-channel sums (a key
// tensor per value head) and, with grouped heads, dq and dk per value head (two more).
void scan_dplr_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                       cudaStream_t stream);
void scan_dplr_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                        cudaStream_t stream);
std::size_t scan_dplr_forward_workspace_bytes(const Problem& problem);
std::size_t scan_dplr_backward_workspace_bytes(const Problem& problem);

// The delta rule's chunked WY form (cuda/chunked_delta*.cu; the chunked table's `chunked_delta`
// row), every decay and every shape of docs/spec.md section 1c. Its scratch: a packed problem's
// boundaries (2 (N + 1) ints); the forward's chunk states (one Dk x Dv matrix per chunk and value
// head), W (B x H x T x Dk) and U / V_new (B x H x T x Dv), all in the token dtype, which `kept`
// (chunked_delta_kept_bytes of device memory, or null) holds for the backward instead (`bwd_states:
// kept`); the backward's state gradients (as the states), dV_new and dW (B x H x T x Dv and x Dk
// floats), for gated decays dg's row sums (ceil(Dv / 32) x chunks x H x Dk floats) and its
// partial sums (the gates' shape), and with grouped heads dq and dk per value head (2 B x H x T x
// Dk floats). Each part is a block of its own, rounded up to 256 bytes.
constexpr int kDeltaMaxDim = 256;     // dim (Dk) the chunked delta kernels take
constexpr int kDeltaChunkLimit = 64;  // the longest chunk they take (the triangular solve's tile)
constexpr int kDeltaMinBf16Dim = 4;   // the smallest dim they take in bf16 (chunked_delta_unsupported says why)
void chunked_delta_forward(const Problem& problem, Dtype dtype, const DeviceForward& args, Allocator& allocator,
                           cudaStream_t stream, void* kept = nullptr);
void chunked_delta_backward(const Problem& problem, Dtype dtype, const DeviceBackward& args, Allocator& allocator,
                            cudaStream_t stream, const void* kept = nullptr);
std::size_t chunked_delta_kept_bytes(const Problem& problem, Dtype dtype);
std::size_t chunked_delta_forward_workspace_bytes(const Problem& problem, Dtype dtype);
std::size_t chunked_delta_backward_workspace_bytes(const Problem& problem, Dtype dtype, bool states_kept);
// Why the row cannot take a problem whatever the device and dtype (dim, chunk), and with the dtype
// (bf16 at tiny dims) and the device's opt-in shared memory per block.
std::optional<std::string> chunked_delta_limits(const Problem& problem);
std::optional<std::string> chunked_delta_unsupported(const Problem& problem, Dtype dtype, std::size_t max_shared_bytes);

// What the scan variant that runs `problem` takes from the allocator (cuda/variants.cpp).
std::size_t scan_forward_workspace_bytes(const Problem& problem);
std::size_t scan_backward_workspace_bytes(const Problem& problem);
// Why the scan cannot take a problem (its dim or dim_v past kScanMaxDim), or nothing.
std::optional<std::string> scan_unsupported(const Problem& problem);

// A chunked form's kernels as a case launches them on the current device: threads and dynamic
// shared memory per block, rows per block (0 for the state pass), the blocks per multiprocessor
// their launch bounds were built for, and the blocks that can reside on one multiprocessor
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor); and, where the report gives it, the blocks of
// the launch (0: not given).
struct ChunkedKernel {
  std::string name;
  int threads;
  int rows_per_block;
  std::size_t shared_bytes;
  int launch_bounds_blocks;
  int resident_blocks;
  std::size_t grid_blocks = 0;
};
// The delta rule's chunked kernels (cuda/chunked_delta*.cu), in launch order: forward
// (prepare, state pass, output), then the backward's (dV_local, reverse state pass, dq / dk, WY).
std::vector<ChunkedKernel> chunked_delta_kernels(const Problem& problem, Dtype dtype);

}  // namespace lattn::cuda

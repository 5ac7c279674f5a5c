// The trapezoidal rule (Mamba-3, MIMO ranks R >= 1; docs/spec.md section 1e) on the GPU, host-side
// declarations: cuda/trapezoidal.cu runs the additive rule's scan (cuda/scan.cu) or its gated
// chunked form (cuda/chunked_gated*.cu) as the inner row on kernels/linear_attention/trapezoidal.hpp's
// inner problem (R rows per token, scalar gates), with its own per-token passes around it, as the
// CPU's adapter does (docs/kernels.md, "The trapezoidal rule"). Every pointer is device memory in
// the layouts of kernels/linear_attention/problem.hpp; dt, trap, g and their gradients float32,
// token tensors float32 or bf16. Each function only enqueues work on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cuda {

// The MIMO ranks the per-token passes take (each warp keeps two R x R matrices in shared memory).
constexpr int kTrapezoidalMaxRank = 16;

// The row the rule runs on: the scan's (`scan_trapezoidal`) or the chunked form's (`chunked_trapezoidal`).
enum class TrapezoidalInner { scan, chunked };

// kept (chunked only): the inner row's chunk states, trapezoidal_kept_bytes of device memory, or null.
void trapezoidal_forward(TrapezoidalInner inner, const Problem& problem, Dtype dtype, const DeviceForward& args,
                         Allocator& allocator, cudaStream_t stream, void* kept = nullptr);
void trapezoidal_backward(TrapezoidalInner inner, const Problem& problem, Dtype dtype, const DeviceBackward& args,
                          Allocator& allocator, cudaStream_t stream, const void* kept = nullptr);

// Scratch, in closed form: a packed problem's document boundaries (N + 1 ints); v' (a value tensor
// of floats) and h0' (a state tensor); for R > 1 the inner log-gates (B H T R floats); for bf16
// tokens q and k widened to float32 (the inner row runs float32); then the inner row's own. The
// backward adds dhT' (a state tensor), for R > 1 the inner dg (B H T R floats) and for bf16 dO
// widened (a value tensor); its dt pass reuses v'.
std::size_t trapezoidal_forward_workspace_bytes(TrapezoidalInner inner, const Problem& problem, Dtype dtype);
std::size_t trapezoidal_backward_workspace_bytes(TrapezoidalInner inner, const Problem& problem, Dtype dtype,
                                                 bool kept);
// The chunked inner row's chunk states (float32 whatever the dtype).
std::size_t trapezoidal_kept_bytes(const Problem& problem, Dtype dtype);

// Why the passes cannot take a problem (its rank past kTrapezoidalMaxRank), with the scan's limits
// (trapezoidal_scan_limits) or with the chunked form's on a device of `max_shared_bytes` opt-in
// shared memory per block (trapezoidal_chunked_unsupported).
std::optional<std::string> trapezoidal_scan_limits(const Problem& problem);
std::optional<std::string> trapezoidal_chunked_limits(const Problem& problem);
std::optional<std::string> trapezoidal_chunked_unsupported(const Problem& problem, Dtype dtype,
                                                           std::size_t max_shared_bytes);

}  // namespace lattn::cuda

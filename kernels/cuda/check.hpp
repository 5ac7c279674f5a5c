// Error checks of CUDA runtime calls: a failing call throws lattn::RuntimeFailure naming the call
// and its file:line, so a broken launch fails its case with a readable message instead of
// corrupting the next one. (The CUDA backend has no cuBLAS call yet, so there is no cuBLAS check.)
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.hpp"

namespace lattn::cuda {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                         cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace lattn::cuda

#define LATTN_CUDA_CHECK(call) ::lattn::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here, execution errors at the next sync.
#define LATTN_CUDA_CHECK_LAUNCH() ::lattn::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Host-side launch helpers that the CUDA kernels' launch code shares (kernels/linear_attention/cuda/*.cu,
// kernels/sliding_window/cuda.cu): the element size of a
// dtype, the current device, and the dynamic shared-memory limits, each queried or raised once per
// device and kernel so that no attribute call lands inside a timed loop. Included inside each .cu's
// own unit (internal linkage; the caches are per file, as the kernels they serve are).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/dtype.hpp"

namespace lattn::cuda {
namespace {

// inline: a file that uses only some of these gets no unused-function warning for the others.
inline int element_size(Dtype dtype) { return dtype == Dtype::f32 ? 4 : 2; }

inline int current_device() {
  int device = 0;
  LATTN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Read once per device: launches stay free of attribute queries inside timed loops.
inline std::size_t max_shared_bytes(int device) {
  static std::map<int, std::size_t> known;
  auto it = known.find(device);
  if (it == known.end()) {
    int bytes = 0;
    LATTN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    it = known.emplace(device, std::size_t(bytes)).first;
  }
  return it->second;
}

// Raises a kernel's dynamic shared-memory limit on `device` when a launch needs more than before.
template <class Kernel>
void allow_shared(Kernel kernel, int device, std::size_t bytes) {
  static std::map<std::pair<const void*, int>, std::size_t> allowed;
  std::size_t& have = allowed[{reinterpret_cast<const void*>(kernel), device}];
  if (bytes > have) {
    LATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    have = bytes;
  }
}

}  // namespace
}  // namespace lattn::cuda

#include "backends/cuda/device_allocator.hpp"

#include <cuda_runtime_api.h>

#include "kernels/cuda/check.hpp"

namespace lattn::cuda {

RawMemory device_memory() {
  return {256,
          [](std::size_t bytes) {
            void* ptr = nullptr;
            LATTN_CUDA_CHECK(cudaMalloc(&ptr, bytes));
            return ptr;
          },
          [](void* ptr) { cudaFree(ptr); }};
}

}  // namespace lattn::cuda

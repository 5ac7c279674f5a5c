// Device memory for the counting allocator (src/run/counting_allocator.hpp): the CUDA backend's
// scratch is counted and cached exactly as the CPU backend's host scratch is.
#pragma once

#include "src/run/counting_allocator.hpp"

namespace lattn::cuda {

// cudaMalloc on the current device (256-byte aligned, cudaMalloc's own alignment) and cudaFree.
RawMemory device_memory();

}  // namespace lattn::cuda

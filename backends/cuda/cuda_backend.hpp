#pragma once

#include <memory>

#include "src/run/backend.hpp"

namespace lattn::cuda {

// The CUDA backend (docs/cuda.md): the kernels of kernels/cuda on GPU `options.device`, device
// memory through a counting allocator, timing by CUDA events on the backend's own stream, and an
// L2 flush before each timed call of a case whose `cache` is cold. Constructing it never fails: with no
// usable GPU, availability() says why ("no CUDA device: ...").
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace lattn::cuda

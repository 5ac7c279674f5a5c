#pragma once

#include <memory>

#include "src/run/backend.hpp"

namespace lattn::cpu {

// The OpenBLAS/OpenMP backend. `threads` (0: every core) is set for the whole process: OpenMP runs
// the kernels' outer loops and BLAS stays single-threaded inside them.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace lattn::cpu

// cuBLAS, opened on first use rather than linked: libcublasLt alone is ~540 MiB, and mapping it
// made every lattnbench start (CPU runs, --help, the tests' hundreds of runs) ~150 ms slower.
// Only what the layer needs: a handle on a stream and float32 sgemm.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "kernels/layer/hybrid/cuda/kernels.hpp"

namespace lattn::cuda {

// Why cuBLAS cannot be used here (it was found nowhere: the message names every place looked at),
// or nothing; the first call looks, later ones remember. The layer's rows skip their cases with it.
std::optional<std::string> cublas_unavailable();

// A cuBLAS handle bound to `stream`, float32 products in float32 (no TF32 rounding of the
// operands). Throws RuntimeFailure when cuBLAS cannot be opened.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  // The row-major product the layer's kernels take (kernels/layer/hybrid/cuda/kernels.hpp).
  DeviceGemm gemm() const;

 private:
  void* handle_ = nullptr;
};

}  // namespace lattn::cuda

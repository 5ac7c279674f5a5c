// Stand-in for backends/cuda/cublas.cpp in the CPU emulation: the same CublasHandle, whose gemm()
// makes the same column-major call (row_major_gemm.hpp) that cublas.cpp hands cublasSgemm, here to
// OpenBLAS's column-major cblas_sgemm on the host memory that emulated device memory is. So the
// CUDA layer case runs in the emulation with its real composition (kernels/layer/hybrid/cuda/layer.cpp)
// and its real mapping of row-major products onto a column-major BLAS. Like cuBLAS, it refuses
// pointers that are not device memory. OpenBLAS runs single-threaded here: the shapes are small,
// and ThreadSanitizer cannot see the synchronisation of its own (uninstrumented) threads.
#include <cblas.h>

#include <string>

#include "backends/cuda/cublas.hpp"
#include "backends/cuda/row_major_gemm.hpp"
#include "core/error.hpp"
#include "lattn_emu/control.hpp"

namespace lattn::cuda {

std::optional<std::string> cublas_unavailable() { return std::nullopt; }

CublasHandle::CublasHandle(cudaStream_t stream) : handle_(stream) { openblas_set_num_threads(1); }

CublasHandle::~CublasHandle() = default;

DeviceGemm CublasHandle::gemm() const {
  return [](bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    const ColumnMajorGemm g = column_major_call(trans_a, trans_b, m, n, k, A, lda, B, ldb, ldc);
    // The extents cuBLAS reads and writes, column-major: op(a) is g.m x g.k, op(b) g.k x g.n, C g.m x g.n.
    const auto extent = [](bool trans, int rows, int cols, int ld) {
      return std::size_t(trans ? rows - 1 : cols - 1) * std::size_t(ld) + std::size_t(trans ? cols : rows);
    };
    if (!lattn_emu::is_device_memory(g.a, extent(g.trans_a, g.m, g.k, g.lda) * sizeof(float)) ||
        !lattn_emu::is_device_memory(g.b, extent(g.trans_b, g.k, g.n, g.ldb) * sizeof(float)) ||
        !lattn_emu::is_device_memory(C, extent(false, g.m, g.n, g.ldc) * sizeof(float)))
      throw RuntimeFailure("emulated cublasSgemm: an operand is not (wholly) device memory");
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n,
                g.k, 1.0f, g.a, g.lda, g.b, g.ldb, beta, C, g.ldc);
  };
}

}  // namespace lattn::cuda

#include "backends/cuda/cublas.hpp"

#include <cublas_v2.h>  // types and enums only: the library is opened with dlopen (api())
#include <dlfcn.h>

#include <string>

#include "backends/cuda/row_major_gemm.hpp"
#include "core/error.hpp"

namespace lattn::cuda {
namespace {

struct Api {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                          const float*, int, const float*, int, const float*, float*, int);
};

// By soname, then at this toolkit's path.
const Api& api() {
  static const Api loaded = [] {
    void* lib = nullptr;
    for (const char* name : {LATTN_CUBLAS_SONAME, LATTN_CUBLAS_PATH})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib)
      throw RuntimeFailure(std::string("the CUDA layer needs cuBLAS: cannot open " LATTN_CUBLAS_SONAME ": ") + dlerror());
    auto symbol = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f) throw RuntimeFailure(std::string("cuBLAS has no ") + name);
      return f;
    };
    Api a;
    a.create = reinterpret_cast<decltype(a.create)>(symbol("cublasCreate_v2"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(symbol("cublasDestroy_v2"));
    a.set_stream = reinterpret_cast<decltype(a.set_stream)>(symbol("cublasSetStream_v2"));
    a.set_math_mode = reinterpret_cast<decltype(a.set_math_mode)>(symbol("cublasSetMathMode"));
    a.sgemm = reinterpret_cast<decltype(a.sgemm)>(symbol("cublasSgemm_v2"));
    return a;
  }();
  return loaded;
}

void check(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string(__FILE__) + ":" + std::to_string(line) + ": " + call + ": cuBLAS status " +
                         std::to_string(int(status)));
}
#define LATTN_CUBLAS_CHECK(call) check((call), #call, __LINE__)

}  // namespace

CublasHandle::CublasHandle(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  LATTN_CUBLAS_CHECK(api().create(&h));
  handle_ = h;
  LATTN_CUBLAS_CHECK(api().set_stream(h, stream));
  LATTN_CUBLAS_CHECK(api().set_math_mode(h, CUBLAS_DEFAULT_MATH));
}

CublasHandle::~CublasHandle() {
  if (handle_) api().destroy(static_cast<cublasHandle_t>(handle_));
}

DeviceGemm CublasHandle::gemm() const {
  auto h = static_cast<cublasHandle_t>(handle_);
  return [h](bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    const float one = 1.0f;
    const ColumnMajorGemm g = column_major_call(trans_a, trans_b, m, n, k, A, lda, B, ldb, ldc);
    LATTN_CUBLAS_CHECK(api().sgemm(h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   g.m, g.n, g.k, &one, g.a, g.lda, g.b, g.ldb, &beta, C, g.ldc));
  };
}

}  // namespace lattn::cuda

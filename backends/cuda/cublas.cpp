#include "backends/cuda/cublas.hpp"

#include <cublas_v2.h>  // types and enums only: the library is opened with dlopen (api())
#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// Where cuBLAS may be, in order: LATTN_CUBLAS (a path), the loader's path (by soname), this
// toolkit's library folder, the usual toolkit folders, and the nvidia-cublas wheels of Python
// environments (pip's nvidia/cublas/lib: a machine with PyTorch but no toolkit libraries).
std::vector<std::string> cublas_candidates() {
  std::vector<std::string> names;
  if (const char* path = std::getenv("LATTN_CUBLAS"); path && *path) names.push_back(path);
  names.push_back(LATTN_CUBLAS_SONAME);
  names.push_back(LATTN_CUBLAS_PATH);
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(var); home && *home) names.push_back(std::string(home) + "/lib64/" LATTN_CUBLAS_SONAME);
  names.push_back("/usr/local/cuda/lib64/" LATTN_CUBLAS_SONAME);
  std::vector<std::string> patterns = {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                                       "/usr/lib/python3/dist-packages", "/opt/conda/lib/python3*/site-packages"};
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* env = std::getenv(var); env && *env) patterns.push_back(std::string(env) + "/lib/python3*/site-packages");
  if (const char* home = std::getenv("HOME"); home && *home)
    patterns.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  for (const std::string& site : patterns) {
    glob_t found{};
    if (glob((site + "/nvidia/cublas/lib/" LATTN_CUBLAS_SONAME).c_str(), 0, nullptr, &found) == 0)
      for (std::size_t i = 0; i < found.gl_pathc; ++i) names.push_back(found.gl_pathv[i]);
    globfree(&found);
  }
  return names;
}

struct Loaded {
  std::optional<Api> api;
  std::string why_not;  // when not: every place looked at
};

const Loaded& loaded() {
  static const Loaded result = [] {
    Loaded l;
    void* lib = nullptr;
    std::string tried;
    for (const std::string& name : cublas_candidates()) {
      if ((lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
      tried += (tried.empty() ? "" : ", ") + name;
    }
    if (!lib) {
      l.why_not = "the CUDA layer needs cuBLAS (" LATTN_CUBLAS_SONAME "), found nowhere: tried " + tried +
                  " (set LATTN_CUBLAS to its path)";
      return l;
    }
    Api a{};
    for (auto [slot, name] : {std::pair<void**, const char*>{reinterpret_cast<void**>(&a.create), "cublasCreate_v2"},
                              {reinterpret_cast<void**>(&a.destroy), "cublasDestroy_v2"},
                              {reinterpret_cast<void**>(&a.set_stream), "cublasSetStream_v2"},
                              {reinterpret_cast<void**>(&a.set_math_mode), "cublasSetMathMode"},
                              {reinterpret_cast<void**>(&a.sgemm), "cublasSgemm_v2"}})
      if (!(*slot = dlsym(lib, name))) {
        l.why_not = std::string("the cuBLAS that was found has no ") + name;
        return l;
      }
    l.api = a;
    return l;
  }();
  return result;
}

const Api& api() {
  if (!loaded().api) throw RuntimeFailure(loaded().why_not);
  return *loaded().api;
}

void check(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string(__FILE__) + ":" + std::to_string(line) + ": " + call + ": cuBLAS status " +
                         std::to_string(int(status)));
}
#define LATTN_CUBLAS_CHECK(call) check((call), #call, __LINE__)

}  // namespace

std::optional<std::string> cublas_unavailable() {
  if (loaded().api) return std::nullopt;
  return loaded().why_not;
}

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

#include "backends/cpu/cpu_environment.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace lattn::cpu {
namespace {

const char* openblas_core_for_this_cpu() {
  const char* detected = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") || !detected || std::strcmp(detected, "Prescott") != 0) return nullptr;
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return "Haswell";
  return nullptr;
}

}  // namespace

void prepare_cpu_environment(char** argv) {
  if (std::getenv("LATTN_ENV_SET")) return;  // already re-executed
  std::string set;
  if (const char* core = openblas_core_for_this_cpu()) {
    setenv("LATTN_OPENBLAS_DETECTED", openblas_get_corename(), 1);
    setenv("OPENBLAS_CORETYPE", core, 1);
    set += "OPENBLAS_CORETYPE ";
  }
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", "1000", 1);
    set += "GOMP_SPINCOUNT ";
  }
  if (set.empty()) return;
  set.pop_back();
  setenv("LATTN_ENV_SET", set.c_str(), 1);
  execv("/proc/self/exe", argv);
}

}  // namespace lattn::cpu

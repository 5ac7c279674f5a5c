#include "cpu/openblas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace lattn::cpu {

void select_openblas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("LATTN_OPENBLAS_DETECTED")) return;
  const char* detected = openblas_get_corename();
  if (!detected || std::strcmp(detected, "Prescott") != 0) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512bf16")) core = "Cooperlake";
  else if (__builtin_cpu_supports("avx512f")) core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2")) core = "Haswell";
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  setenv("LATTN_OPENBLAS_DETECTED", detected, 1);
  execv("/proc/self/exe", argv);
}

}  // namespace lattn::cpu

#include "kernels/cpu/vec.hpp"

#include <stdexcept>

namespace lattn::cpu {
namespace {

std::optional<Vec> g_override;

bool cpu_has(Vec v) {
  switch (v) {
    case Vec::generic: return true;
    case Vec::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Vec::avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

bool compiled(Vec v) {
#if defined(__AVX512F__)
  if (v == Vec::avx512) return true;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (v == Vec::avx2) return true;
#endif
  return v == Vec::generic;
}
}  // namespace

const char* to_string(Vec vec) {
  switch (vec) {
    case Vec::generic: return "generic";
    case Vec::avx2: return "avx2";
    case Vec::avx512: return "avx512";
  }
  return "?";
}

std::vector<Vec> available_vecs() {
  std::vector<Vec> out;
  for (Vec v : {Vec::generic, Vec::avx2, Vec::avx512})
    if (compiled(v) && cpu_has(v)) out.push_back(v);
  return out;
}

Vec active_vec() {
  if (g_override) return *g_override;
  static const Vec best = available_vecs().back();
  return best;
}

void set_vec_override(std::optional<Vec> vec) {
  if (vec && !(compiled(*vec) && cpu_has(*vec))) throw std::invalid_argument("vector width not available here");
  g_override = vec;
}

bool tiles_active() {
#if defined(__AVX512F__)
  return active_vec() == Vec::avx512;
#else
  return false;
#endif
}

}  // namespace lattn::cpu

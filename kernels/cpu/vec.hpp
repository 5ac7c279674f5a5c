// The vector width the CPU kernels run at: every width this build compiled (-march) that this CPU
// also has, the widest by default. Tests force each available width in turn, so that every code
// path is checked on a machine that has it.
#pragma once

#include <optional>
#include <vector>

namespace lattn::cpu {

enum class Vec { generic, avx2, avx512 };

const char* to_string(Vec vec);
// Widths compiled into this build and supported by this CPU, narrowest first.
std::vector<Vec> available_vecs();
// The widest of available_vecs(), unless a test has forced another with set_vec_override.
Vec active_vec();
// Tests force each width in turn (it must be available); std::nullopt restores the widest.
void set_vec_override(std::optional<Vec> vec);

// Whether the register-tiled AVX-512 products (tile_gemm.hpp) run now: compiled in and active.
bool tiles_active();

}  // namespace lattn::cpu

// What the AMX test files (test_amx.cpp, test_amx_layer.cpp: one executable) share: whether this
// run is the hardware's (--hardware, set by test_amx.cpp's main) and the tile path the kernel tests
// run on.
#pragma once

#include "kernels/linear_attention/cpu/bf16.hpp"

namespace lattn::amx_tests {

extern bool hardware_run;  // --hardware: the kernel tests run on the CPU's tiles
inline cpu::AmxPath tested_path() { return hardware_run ? cpu::AmxPath::hardware : cpu::AmxPath::emulated; }

}  // namespace lattn::amx_tests

// Stand-in for the CUDA toolkit's cuda_runtime.h, which nvcc includes in every .cu before its first
// line. The build step (tests/cuda_emulation/emulate_cu.cmake) puts `#include <cuda_runtime.h>` at
// the top of each emulated .cu for the same reason: the qualifiers, the built-in variables, the
// barriers, shuffles and math functions of device code, and the launcher.
#pragma once

#include <cuda_runtime_api.h>
#include <math.h>

#include <cmath>

#include "lattn_emu/device.hpp"
#include "lattn_emu/launch.hpp"
#include "lattn_emu/qualifiers.hpp"

// CUDA's integer and floating min/max, which device code calls unqualified.
#define LATTN_EMU_MINMAX(T)                      \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
LATTN_EMU_MINMAX(int)
LATTN_EMU_MINMAX(unsigned int)
LATTN_EMU_MINMAX(long)
LATTN_EMU_MINMAX(unsigned long)
LATTN_EMU_MINMAX(long long)
LATTN_EMU_MINMAX(unsigned long long)
#undef LATTN_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// The fast-math intrinsics, here at full precision (the emulation's results are held to the
// float64 reference with the same tolerances as a GPU's).
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// What the AMX chunked forward (cpu/chunked/chunked_amx.cpp) and backward
// (cpu/chunked/chunked_amx_backward.cpp) share: bf16 rounding and pairing, and a chunk's decay
// factors. Plain C++: both files run it on the emulated tiles on any CPU.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"

namespace lattn::cpu::amx_chunked {

constexpr int kMaxChunk = 256, kMaxDim = 256;

inline int round_up(int x, int to) { return (x + to - 1) / to * to; }

inline int items_threads(const Problem& p) {
  return int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())));
}

// Round to nearest even; a NaN stays a (quiet) NaN.
inline Bf16 to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return Bf16((bits >> 16) | 0x40u);
  return Bf16((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline float from_bf16(Bf16 x) {
  const std::uint32_t bits = std::uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline std::uint32_t pair_of(Bf16 lo, Bf16 hi) { return std::uint32_t(lo) | (std::uint32_t(hi) << 16); }

// A chunk's decay factors for its n rows (n >= 1): L_i, the summed log-decay of rows 0 .. i
// ((i + 1) ln gamma for retnet, the gates' running sum for scalar gates `g`, 0 for none);
// lam_i = s exp(L_i); gam_j = exp(L_{n-1} - L_j); returns exp(L_{n-1}). L, lam, gam: n floats each.
inline float chunk_decays(int n, float scale, float log_gamma, const float* g, float* L, float* lam, float* gam) {
  float run = 0;
  for (int i = 0; i < n; ++i) {
    run += g ? g[i] : log_gamma;
    L[i] = run;
  }
  for (int i = 0; i < n; ++i) {
    lam[i] = scale * exp_nonpositive(L[i]);
    gam[i] = exp_nonpositive(L[n - 1] - L[i]);
  }
  return exp_nonpositive(L[n - 1]);
}

// The item's log-decay per token for retnet, 0 otherwise.
inline float log_gamma_of(const Problem& p, int head) {
  return p.decay == Decay::retnet ? float(std::log(decay_gamma(p.decay, head))) : 0.0f;
}

}  // namespace lattn::cpu::amx_chunked

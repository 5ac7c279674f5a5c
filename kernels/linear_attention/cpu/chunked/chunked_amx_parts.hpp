// What the AMX chunked forward (cpu/chunked/chunked_amx.cpp) and backward
// (cpu/chunked/chunked_amx_backward.cpp) share, with the other AMX rows and the layer's AMX
// products: bf16 rounding and pairing, a chunk's decay factors, and the choice of tile policy
// (on_path). Plain C++: every file runs it on the emulated tiles on any CPU.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/amx.hpp"
#include "kernels/cpu/amx_counted.hpp"
#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"

namespace lattn::cpu::amx_chunked {

constexpr int kMaxChunk = 256, kMaxDim = 256;

inline int round_up(int x, int to) { return (x + to - 1) / to * to; }

inline int items_threads(const Problem& p) {
  return int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())));
}

// Round to nearest even; a NaN stays a (quiet) NaN. A select, not a branch, so that loops of it
// vectorise.
inline Bf16 to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t nan = (bits >> 16) | 0x40u, rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return Bf16((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
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

// run(tiles) on the path's tiles: the emulation, the counted tiles, or the hardware where it may run
// (`kernel` names the caller in the error otherwise).
template <class Run>
void on_path(const char* kernel, AmxPath path, Run run) {
  if (path == AmxPath::emulated) return run(amx::Emulated{});
  if (path == AmxPath::counted) return run(amx::Counted{});
  if (path == AmxPath::none) throw std::logic_error(std::string(kernel) + ": AMX turned off");
#if defined(LATTN_AMX_INTRINSICS)
  if (const auto& why = amx::hardware_refusal()) throw std::logic_error(std::string(kernel) + ": " + *why);
  run(amx::Hardware{});
#else
  throw std::logic_error(std::string(kernel) + ": this build has no AMX intrinsics");
#endif
}

}  // namespace lattn::cpu::amx_chunked

// Stand-in for the CUDA toolkit's cuda_bf16.h: __nv_bfloat16 as its 16 bits, and the conversions
// the project's kernels use, rounding to nearest even as the device's cvt.rn.bf16.f32 does (NaN
// stays NaN, sign kept; overflow rounds to infinity). The conversions are written out here rather
// than shared with core/random.cpp, so that the tests compare two implementations, not one with itself.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16;
__nv_bfloat16 __float2bfloat16_rn(float x);
float __bfloat162float(__nv_bfloat16 x);

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  // The toolkit's implicit conversions (absent only under __CUDA_NO_BFLOAT16_CONVERSIONS__).
  __nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}
  operator float() const { return __bfloat162float(*this); }
};
static_assert(sizeof(__nv_bfloat16) == 2);

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
  __nv_bfloat16 b;
  b.__x = bits;
  return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)  // NaN: keep the sign, make it quiet
    return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x0040u));
  const std::uint32_t lower = u & 0xffffu, upper = u >> 16;
  // Round half to even: up when the dropped half is above 0x8000, or exactly 0x8000 with an odd upper half.
  const bool up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return __ushort_as_bfloat16(static_cast<unsigned short>(upper + (up ? 1u : 0u)));
}
inline __nv_bfloat16 __float2bfloat16(float x) { return __float2bfloat16_rn(x); }
inline float __bfloat162float(__nv_bfloat16 b) {
  const std::uint32_t u = std::uint32_t(b.__x) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

// exp(x) for x <= 0, shared by the kernels that take exponentials in their inner loops (the sliding
// window's softmax, the gated linear attention's gates).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace lattn::cpu {

// exp(x) for x <= 0, within 1 ulp: Cody-Waite reduction to r in [-ln2/2, ln2/2], Cephes' degree-6
// polynomial, 2^n from the exponent bits. Unlike std::exp it vectorises, and the window's
// exponentials would otherwise cost as much as its products. n is rounded with the 1.5 * 2^23
// trick instead of floor() and a float-to-int conversion: GCC does not vectorise a conversion that
// may trap unless -fno-trapping-math.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // exp(-87) ~ 1.6e-38: still a normal float, and far below any weight that counts
  constexpr float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;  // round(x / ln2) sits in t's low mantissa bits
  const float n = t - magic;
  const std::int32_t ni = std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(magic);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  const float e = q * r * r + r + 1.0f;
  return e * std::bit_cast<float>((ni + 127) << 23);
}

}  // namespace lattn::cpu

// The modern block's elementwise functions (block.hpp): sigmoid, softplus, silu and silu's
// derivative over the block's number type. In float32 (the CPU block) branch-free on
// exp_nonpositive, so that their loops over channels vectorise: with std::exp (a call per element)
// the short convolution's silu and the output gate cost as much as the input projection. In float64
// (the reference) std::exp. tests/kernels/test_layer_block.cpp holds the float32 forms to the
// float64 ones.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/exp.hpp"

namespace lattn::block {

// log1p(x) for x in [0, 1]: 2 atanh(s) with s = x / (2 + x) in [0, 1/3], its odd series to s^15
// (relative error below 2e-8; s carries no cancellation, so small x keep their relative accuracy).
inline float log1p_unit(float x) {
  const float s = x / (2.0f + x), s2 = s * s;
  float p = 1.0f / 15.0f;
  p = p * s2 + 1.0f / 13.0f;
  p = p * s2 + 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  return 2.0f * s * (p * s2 + 1.0f);
}
template <class T>
T sigmoid(T z) {
  if constexpr (std::is_same_v<T, float>) {  // exp(-|z|) <= 1: no overflow for either sign
    const float e = cpu::exp_nonpositive(-std::fabs(z)), s = 1.0f / (1.0f + e);
    return z >= 0.0f ? s : e * s;
  } else {
    return T(1) / (T(1) + std::exp(-z));
  }
}
template <class T>
T softplus(T z) {
  if constexpr (std::is_same_v<T, float>)  // max(z, 0) + log1p(exp(-|z|))
    return std::max(z, 0.0f) + log1p_unit(cpu::exp_nonpositive(-std::fabs(z)));
  else
    return z > T(20) ? z : std::log1p(std::exp(z));
}
template <class T>
T silu(T z) {
  return z * sigmoid(z);
}
template <class T>
T silu_grad(T z) {
  const T s = sigmoid(z);
  return s * (T(1) + z * (T(1) - s));
}

}  // namespace lattn::block

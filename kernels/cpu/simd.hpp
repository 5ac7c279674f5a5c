// The register types the CPU scan kernels are written against: AVX-512 (16 lanes), AVX2 (8 lanes)
// and a portable one-lane form, each with the few operations a state walk needs (masked and plain
// loads and stores, broadcasts, multiplies and fused multiply-adds: the build is ISO C++, which
// leaves floating-point contraction off, so FMAs are spelled out).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace lattn::cpu::simd {

#if defined(__AVX512F__)
struct Avx512 {
  using V = __m512;
  using M = __mmask16;
  static constexpr int L = 16, NV = 2, U = 6, R = 2;
  static M mask(int n) { return n >= L ? M(0xFFFF) : M((1u << std::max(n, 0)) - 1); }
  static V load(M m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void stream(float* p, V v) { _mm512_stream_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  using V = __m256;
  using M = __m256i;
  // 16 ymm registers: U = 2 tokens of 2 column registers keeps c, y, the row and broadcasts in 12.
  static constexpr int L = 8, NV = 2, U = 2, R = 2;
  static M mask(int n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
  }
  static V load(M m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, M m, V v) { _mm256_maskstore_ps(p, m, v); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void stream(float* p, V v) { _mm256_stream_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif

// The portable form: one lane, std::fma.
struct Portable {
  using V = float;
  using M = bool;
  static constexpr int L = 1;
  static M mask(int n) { return n > 0; }
  static V load(M m, const float* p) { return m ? *p : 0.0f; }
  static void store(float* p, M m, V v) {
    if (m) *p = v;
  }
  static V loadu(const float* p) { return *p; }
  static void storeu(float* p, V v) { *p = v; }
  static V set1(float x) { return x; }
  static V zero() { return 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
};

// A block's loads and stores: masked only where the block is ragged (masked loads and stores
// cost ~8% of the walk's rate in L1 even with every lane set).
template <class I, bool FULL>
typename I::V load_lanes(typename I::M m, const float* p) {
  if constexpr (FULL) return I::loadu(p);
  else return I::load(m, p);
}
template <class I, bool FULL>
void store_lanes(float* p, typename I::M m, typename I::V v) {
  if constexpr (FULL) I::storeu(p, v);
  else I::store(p, m, v);
}

}  // namespace lattn::cpu::simd

// The register types the CPU scan kernels are written against: AVX-512 (16 lanes), AVX2 (8 lanes)
// and a portable one-lane form, each with the few operations a state walk needs (masked and plain
// loads and stores, broadcasts, multiplies and fused multiply-adds: the build is ISO C++, which
// leaves floating-point contraction off, so FMAs are spelled out). Each also loads bf16 lanes
// (their bits, widened to float32) and stores float32 lanes as bf16, rounding to nearest even in
// integer arithmetic (the same bits as round_bf16 below on every form, for finite values; the
// AVX512-BF16 instruction would flush denormals), so that a walk reads and writes a bf16 state in
// its own loads and stores.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace lattn::cpu::simd {

// float32 to bf16 bits, rounding to nearest even (finite values).
inline std::uint16_t round_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return std::uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
inline float widen_bf16(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

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
  static V loadu(const std::uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load(M m, const std::uint16_t* p) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return widen(_mm256_maskz_loadu_epi16(m, p));
#else
    alignas(32) std::uint16_t lanes[L] = {};
    for (int i = 0; i < L; ++i)
      if (m >> i & 1) lanes[i] = p[i];
    return loadu(lanes);
#endif
  }
  static void storeu(std::uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi32_epi16(__mmask16(0xFFFF), rounded(v)));
  }
  static void store(std::uint16_t* p, M m, V v) { _mm512_mask_cvtepi32_storeu_epi16(p, m, rounded(v)); }

 private:
  // The zero-masked forms with every lane set here and in rounded(): the plain ones start from an
  // undefined register, which GCC 12 reports as maybe-uninitialized once inlined into a walk.
  static V widen(__m256i b) {
    const __mmask16 all = 0xFFFF;
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, b), 16));
  }
  // The bf16 bits in each 32-bit lane's low half (round_bf16).
  static __m512i rounded(V v) {
    const __mmask16 all = 0xFFFF;
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(all, bits, 16), _mm512_set1_epi32(1));
    return _mm512_maskz_srli_epi32(all, _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  }
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
  static V loadu(const std::uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static V load(M m, const std::uint16_t* p) {
    alignas(16) std::uint16_t lanes[L] = {};
    alignas(32) std::int32_t on[L];
    _mm256_store_si256(reinterpret_cast<__m256i*>(on), m);
    for (int i = 0; i < L; ++i)
      if (on[i]) lanes[i] = p[i];
    return loadu(lanes);
  }
  static void storeu(std::uint16_t* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), rounded(v)); }
  static void store(std::uint16_t* p, M m, V v) {
    alignas(16) std::uint16_t lanes[L];
    alignas(32) std::int32_t on[L];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), rounded(v));
    _mm256_store_si256(reinterpret_cast<__m256i*>(on), m);
    for (int i = 0; i < L; ++i)
      if (on[i]) p[i] = lanes[i];
  }

 private:
  // The eight bf16 values (round_bf16) in order: packus packs within 128-bit halves, the permute
  // joins the halves' low quadwords.
  static __m128i rounded(V v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  }
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
  static V loadu(const std::uint16_t* p) { return widen_bf16(*p); }
  static V load(M m, const std::uint16_t* p) { return m ? widen_bf16(*p) : 0.0f; }
  static void storeu(std::uint16_t* p, V v) { *p = round_bf16(v); }
  static void store(std::uint16_t* p, M m, V v) {
    if (m) *p = round_bf16(v);
  }
};

// A block's loads and stores: masked only where the block is ragged (masked loads and stores
// cost ~8% of the walk's rate in L1 even with every lane set).
// T: float, or std::uint16_t for bf16 lanes.
template <class I, bool FULL, class T>
typename I::V load_lanes(typename I::M m, const T* p) {
  if constexpr (FULL) return I::loadu(p);
  else return I::load(m, p);
}
template <class I, bool FULL, class T>
void store_lanes(T* p, typename I::M m, typename I::V v) {
  if constexpr (FULL) I::storeu(p, v);
  else I::store(p, m, v);
}

}  // namespace lattn::cpu::simd

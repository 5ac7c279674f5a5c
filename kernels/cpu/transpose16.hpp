// In-register transpose of a 16 x 16 block of 32-bit lanes: r[i] is row i on entry, column i on
// exit. The one copy that the tile products (tile_gemm.cpp), the packed products (packed_gemm.cpp)
// and the bf16 chunked form (cpu/chunked/chunked_bf16.cpp, on pairs of bf16 as 32-bit words) share.
// Compiled for AVX-512F by its own target attribute, so that a file built without it (the bf16
// form, which enables AVX-512 by a target pragma) can include it at the top; only code running
// where AVX-512F is active may call it.
#pragma once

#include <immintrin.h>

#include <cstddef>

namespace lattn::cpu {

__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16], w[16];
  for (std::size_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (std::size_t i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Now lane L of u[4i + m] holds column 4L + m of rows 4i..4i+3.
  for (std::size_t m = 0; m < 4; ++m) {
    w[m] = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
    w[4 + m] = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
    w[8 + m] = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
    w[12 + m] = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
  }
  for (std::size_t m = 0; m < 4; ++m) {
    r[m] = _mm512_shuffle_f32x4(w[m], w[8 + m], 0x88);
    r[8 + m] = _mm512_shuffle_f32x4(w[m], w[8 + m], 0xdd);
    r[4 + m] = _mm512_shuffle_f32x4(w[4 + m], w[12 + m], 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(w[4 + m], w[12 + m], 0xdd);
  }
}

}  // namespace lattn::cpu

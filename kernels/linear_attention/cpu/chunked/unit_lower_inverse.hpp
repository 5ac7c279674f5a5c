// T = (I + diag(beta) A)^-1 for the delta rule's chunked forms, A strictly lower triangular (A_kk):
// the float32 kernel's (cpu/chunked/chunked_delta_forward.cpp) and the AMX row's
// (cpu/chunked/chunked_amx_delta.cpp), one code for both. By forward substitution, row i =
// e_i - beta_i sum_{m<i} A[i][m] row m, zero above the diagonal. Each row is summed in registers, a
// few column vectors at a time: as an axpy per m into the row in memory it was bound by the row's
// loads and stores (~15% of the chunked forward at D 128).
#pragma once

#include <cstddef>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"

namespace lattn::cpu {

namespace unit_lower {

// Columns [j0, j0 + 4 I::L) of T's row i: the sum over the rows m < i that reach them (T is lower
// triangular, so rows m < j0 add nothing there) in four register accumulators, then one store.
// FULL: the four vectors lie inside the `cols` columns (else masked to them).
template <class I, bool FULL>
void columns(const float* A, std::size_t ldA, const float* beta, int cols, float* T, std::size_t ldT, int i, int j0) {
  using V = typename I::V;
  constexpr int L = I::L;
  typename I::M m4[4];
  for (int k = 0; k < 4; ++k) m4[k] = I::mask(cols - j0 - k * L);
  V acc[4] = {I::zero(), I::zero(), I::zero(), I::zero()};
  const float* ai = A + std::size_t(i) * ldA;
  const float b = beta[i];
  for (int m = j0; m < i; ++m) {
    const V f = I::set1(-b * ai[m]);
    const float* tm = T + std::size_t(m) * ldT + j0;
    for (int k = 0; k < 4; ++k)
      acc[k] = I::fma(f, simd::load_lanes<I, FULL>(m4[k], tm + std::ptrdiff_t(k) * L), acc[k]);
  }
  float* row = T + std::size_t(i) * ldT + j0;
  for (int k = 0; k < 4; ++k) simd::store_lanes<I, FULL>(row + std::ptrdiff_t(k) * L, m4[k], acc[k]);
}

template <class I>
void rows(const float* A, std::size_t ldA, const float* beta, int n, int cols, float* T, std::size_t ldT) {
  constexpr int G = 4 * I::L;
  for (int i = 0; i < n; ++i) {
    int j0 = 0;
    for (; j0 + G <= cols; j0 += G) columns<I, true>(A, ldA, beta, cols, T, ldT, i, j0);
    if (j0 < cols) columns<I, false>(A, ldA, beta, cols, T, ldT, i, j0);
    T[std::size_t(i) * ldT + i] = 1.0f;  // no row m < i reaches column i
  }
}

}  // namespace unit_lower

// T's n rows (ld ldT), each written in columns 0 .. cols - 1 (cols >= n), from A's strictly lower
// part (ld ldA) and beta's n values.
inline void invert_unit_lower(const float* A, std::size_t ldA, const float* beta, int n, int cols, float* T,
                              std::size_t ldT) {
  switch (active_vec()) {
#if defined(__AVX512F__)
    case Vec::avx512: return unit_lower::rows<simd::Avx512>(A, ldA, beta, n, cols, T, ldT);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return unit_lower::rows<simd::Avx2>(A, ldA, beta, n, cols, T, ldT);
#endif
    default: return unit_lower::rows<simd::Portable>(A, ldA, beta, n, cols, T, ldT);
  }
}

}  // namespace lattn::cpu

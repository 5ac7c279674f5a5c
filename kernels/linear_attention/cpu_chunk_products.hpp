// Helpers the chunked forms with gates and with the delta rule share: products on the tile kernels
// (tile_gemm.hpp) in the shapes a chunk needs, and the elementwise loops on the gates' factors.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"

namespace lattn::cpu {

// An M x N row-major product into c (ld ldc).
inline tile::Product rows_product(float* c, long ldc, int M, int N, tile::Segment s1, float alpha = 1.0f) {
  tile::Product u;
  u.M = M;
  u.N = N;
  u.c = c;
  u.ldc = ldc;
  u.s1 = s1;
  u.alpha = alpha;
  return u;
}

// Y = beta Y + alpha X^T Z for a packed D x D state Y, X (n x D rows), Z packed n x D panels.
inline void state_product(float* Yp, int D, int n, const float* X, const float* Zp, float alpha, float beta) {
  tile::Product u = rows_product(Yp, tile::kNR, D, D, tile::seg(tile::Range::full, n, X, 1, D, Zp), alpha);
  u.cps = long(D) * tile::kNR;
  u.beta = beta;
  tile::run(u);
}

// Row d of a packed D x D state times w[d].
inline void scale_state_rows(float* Yp, int D, const float* w) {
  for (int panel = 0; panel < tile::panel_cols(D) / tile::kNR; ++panel)
    for (int d = 0; d < D; ++d) {
      float* row = Yp + (std::size_t(panel) * D + d) * tile::kNR;
#pragma omp simd
      for (int j = 0; j < tile::kNR; ++j) row[j] *= w[d];
    }
}

// The loops below keep to forms GCC vectorises: one statement kind per loop, contiguous floats.
// x[d] = exp(x[d]) for x <= 0.
inline void exp_in_place(float* __restrict x, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) x[d] = exp_nonpositive(x[d]);
}

// out[d] = exp(a[d] - b[d]) (b null: exp(a[d])), the difference taken in double.
inline void exp_of_difference(float* __restrict out, const double* a, const double* b, int n) {
  if (b) {
#pragma omp simd
    for (int d = 0; d < n; ++d) out[d] = float(a[d] - b[d]);
  } else {
#pragma omp simd
    for (int d = 0; d < n; ++d) out[d] = float(a[d]);
  }
  exp_in_place(out, n);
}

inline float dot(const float* __restrict x, const float* __restrict y, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int d = 0; d < n; ++d) sum += x[d] * y[d];
  return sum;
}

inline void multiply(float* __restrict x, const float* __restrict y, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) x[d] *= y[d];
}

}  // namespace lattn::cpu

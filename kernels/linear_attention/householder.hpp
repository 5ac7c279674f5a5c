// DeltaProduct (docs/spec.md section 1h) as the delta rule over the interleaved steps: a problem of
// n Householder writes per token is the delta rule's problem of seq * n steps in which step
// t n + j writes k, v, beta row t n + j (their own layout already), decays by g_t at j = 0 only
// (log-gate 0 at the others) and is read out by q_t at j = n - 1 only (q and dO zero at the
// others). The float64 reference (reference.cpp) and the CPU's adapter (cpu/householder.cpp) both
// compute it so; tests/kernels/test_reference.cpp holds the reference to the recurrence written out
// step by step, and to central finite differences.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/linear_attention/problem.hpp"

namespace lattn {

// The delta rule's problem of the interleaved steps: seq and the documents' offsets times n.
inline Problem householder_steps(const Problem& p) {
  Problem s = p;
  const int n = p.householder;
  s.seq = p.seq * n;
  for (int& at : s.cu_seqlens) at *= n;
  s.householder = 1;
  return s;
}

// Row r of `rows` rows of `width` values to row r n + at of the interleaved rows; the others zero.
template <class T>
void interleave_rows(const T* src, std::size_t rows, std::size_t width, int n, int at, T* dst) {
  std::fill_n(dst, rows * n * width, T(0));
  for (std::size_t r = 0; r < rows; ++r) std::copy_n(src + r * width, width, dst + (r * n + at) * width);
}

// Row r n + at of the interleaved rows to row r.
template <class T>
void pick_rows(const T* src, std::size_t rows, std::size_t width, int n, int at, T* dst) {
  for (std::size_t r = 0; r < rows; ++r) std::copy_n(src + (r * n + at) * width, width, dst + r * width);
}

}  // namespace lattn

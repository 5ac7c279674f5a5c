// A row-major product C = op(A) op(B) (m x n, as cblas_sgemm takes it) expressed as the
// column-major call cuBLAS makes: a row-major matrix read column-major is its transpose, so the
// call computes C^T = op(B)^T op(A)^T, with the operands and the transposes swapped and m, n
// exchanged. Host-only and dependency-free, so that the CPU tests hold the mapping to OpenBLAS's
// column-major sgemm where no GPU is (tests/kernels/test_row_major_gemm.cpp).
#pragma once

namespace lattn::cuda {

struct ColumnMajorGemm {
  bool trans_a, trans_b;  // of the column-major call's first and second operand
  int m, n, k;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  int ldc;
};

inline ColumnMajorGemm column_major_call(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda,
                                         const float* B, int ldb, int ldc) {
  return {trans_b, trans_a, n, m, k, B, ldb, A, lda, ldc};
}

}  // namespace lattn::cuda

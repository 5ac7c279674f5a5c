// The CUDA layer's row-major -> column-major mapping of its cuBLAS products
// (backends/cuda/row_major_gemm.hpp), held on the CPU to OpenBLAS: the mapped call, made by
// OpenBLAS's column-major sgemm, must give the row-major product cblas computes directly, for
// every pair of transposes the layer uses and leading dimensions wider than the matrices.
#include <catch2/catch.hpp>

#include <cblas.h>

#include <random>
#include <vector>

#include "backends/cuda/row_major_gemm.hpp"

TEST_CASE("the row-major products of the CUDA layer map onto column-major calls", "[cuda_mapping]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true}) {
      const int m = 7, n = 5, k = 3;
      // op(A) is m x k: A is stored m x k (or k x m when transposed), row-major, with padding.
      const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, lda = a_cols + 2;
      const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n, ldb = b_cols + 1;
      const int ldc = n + 3;
      std::vector<float> A(std::size_t(a_rows) * lda), B(std::size_t(b_rows) * ldb);
      for (float& x : A) x = uniform(rng);
      for (float& x : B) x = uniform(rng);
      std::vector<float> expected(std::size_t(m) * ldc, 0.5f), got(expected);
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                  1.0f, A.data(), lda, B.data(), ldb, 0.25f, expected.data(), ldc);
      const lattn::cuda::ColumnMajorGemm g =
          lattn::cuda::column_major_call(trans_a, trans_b, m, n, k, A.data(), lda, B.data(), ldb, ldc);
      cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans, g.m,
                  g.n, g.k, 1.0f, g.a, g.lda, g.b, g.ldb, 0.25f, got.data(), g.ldc);
      INFO("trans_a " << trans_a << " trans_b " << trans_b);
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).margin(1e-6));
    }
}

// The layer's products (cpu/products.hpp): why they are split as they are is beside each.
#include "kernels/layer/cpu/products.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/tuning.hpp"
#include "kernels/cpu/vec.hpp"

namespace lattn::cpu {
namespace {

constexpr int kRowBlock = 256;  // the largest block of C's rows one product takes

}  // namespace

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
              A, lda, B, ldb, beta, C, ldc);
}

int threads_for(std::size_t tasks) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), std::max<std::size_t>(tasks, 1)));
}

// C = A op(B) + beta C (m x n, row-major), in blocks of C's rows taken by whichever thread is
// free: on a machine shared with other work a thread that loses its core for a while then costs
// its blocks, not the whole product (an even split would leave the other thread waiting). About
// four blocks per thread, of 64 to 256 rows: large enough for BLAS, though each call repacks B.
void parallel_sgemm(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                    float beta, float* C, int ldc) {
  const int wanted = (m + 4 * omp_get_max_threads() - 1) / (4 * omp_get_max_threads());
  const int block = std::clamp(wanted, 64, kRowBlock), blocks = (m + block - 1) / block;
#pragma omp parallel for schedule(dynamic) num_threads(threads_for(std::size_t(blocks)))
  for (int index = 0; index < blocks; ++index) {
    const int r0 = index * block, rows = std::min(block, m - r0);
    sgemm(false, trans_b, rows, n, k,
                A + std::size_t(r0) * lda, lda, B, ldb, beta, C + std::size_t(r0) * ldc, ldc);
  }
}

// The weight gradients: products C = A^T B (m x n) of A (k x m) and B (k x n), k the
// batch's tokens and so much larger than m and n: split over k into blocks that whichever thread
// is free takes, each product into its own partial, then the partials summed in block order (the
// sum's order does not depend on which thread ran what). Split over C's rows instead, as
// parallel_sgemm does, every call repacks all of B: x^T [dQ dK dV] (512 x 1536, k 4096) ran in
// 44 ms that way against 33.5 ms split over k (2 threads, median of 9, 3 of 4 rounds).
// C's columns go to `outs` in groups of `out_cols` (row-major, row stride out_cols): dWq, dWk,
// dWv from one product.
static int k_blocks(int k) { return std::max(1, std::min(k, 2 * omp_get_max_threads())); }

std::size_t k_split_bytes(int m, int n, int k) { return std::size_t(k_blocks(k)) * m * n * sizeof(float); }

void k_split_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                     int out_cols, Allocator& allocator) {
  const int blocks = k_blocks(k);
  const std::size_t mn = std::size_t(m) * n;
  Workspace<float> partials(allocator, blocks * mn);
#pragma omp parallel num_threads(threads_for(std::size_t(blocks)))
  {
#pragma omp for schedule(dynamic)
    for (int t = 0; t < blocks; ++t) {
      const int k0 = int(long(k) * t / blocks), k1 = int(long(k) * (t + 1) / blocks);
      sgemm(true, false, m, n, k1 - k0, A + std::size_t(k0) * lda, lda,
                  B + std::size_t(k0) * ldb, ldb, 0.0f, partials.data() + t * mn, n);
    }
#pragma omp for schedule(static)
    for (int i = 0; i < m; ++i)
      for (int j0 = 0; j0 < n; j0 += out_cols) {
        float* __restrict out = outs[j0 / out_cols] + std::size_t(i) * out_cols;
        const float* first = partials.data() + std::size_t(i) * n + j0;
#pragma omp simd
        for (int j = 0; j < out_cols; ++j) out[j] = first[j];
        for (int t = 1; t < blocks; ++t) {
          const float* __restrict part = first + t * mn;
#pragma omp simd
          for (int j = 0; j < out_cols; ++j) out[j] += part[j];
        }
      }
  }
}

namespace {

std::optional<ProductPath> g_chosen;

std::optional<ProductPath> path_from_environment() {
  const char* env = std::getenv("LATTN_LAYER_PRODUCTS");
  if (!env) return std::nullopt;
  if (std::strcmp(env, "openblas") == 0) return ProductPath::openblas;
  if (std::strcmp(env, "packed") == 0) return ProductPath::packed;
  return std::nullopt;
}

// The default: the tuning's layer.products (kernels/cpu/tuning.hpp), whose default is the packed
// products at AVX-512, which on Zen 4 run the layer's projections at 1.03-1.10x OpenBLAS's AVX-512
// sgemm, and OpenBLAS's own kernels at AVX2, which the 6 x 16 micro-tile was not shown to beat;
// the calibration (backends/cpu/tuning.hpp) times both on the CPU it meets.
ProductPath default_path() {
  return tuning::value(tuning::Knob::layer_products) == tuning::kProductsPacked ? ProductPath::packed
                                                                                 : ProductPath::openblas;
}

}  // namespace

ProductPath product_path() {
  static const std::optional<ProductPath> forced = path_from_environment();
  const ProductPath path = forced ? *forced : g_chosen ? *g_chosen : default_path();
  // Without a vector kernel the packed products are element by element: OpenBLAS then.
  return path == ProductPath::packed && gemm::available() ? ProductPath::packed : ProductPath::openblas;
}

void set_product_path(std::optional<ProductPath> path) { g_chosen = path; }

std::string product_path_name() {
  return product_path() == ProductPath::packed ? std::string("packed_") + gemm::kernel_name() : "openblas";
}

std::size_t layer_product_bytes(int m, int n, int k) {
  return product_path() == ProductPath::packed ? gemm::parallel_scratch_bytes(m, n, k) : 0;
}

void layer_product(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float beta,
                   float* C, int ldc, Allocator& allocator) {
  if (product_path() == ProductPath::packed)
    gemm::parallel_multiply(false, trans_b, m, n, k, A, lda, B, ldb, beta, C, ldc, allocator);
  else
    parallel_sgemm(trans_b, m, n, k, A, lda, B, ldb, beta, C, ldc);
}

// The packed path needs no split over k: its threads share one packing of B and take blocks of C's
// rows. Where every group is whole panels, one product over all n columns writes each panel into its
// group's output: op(A) = A^T (the tokens' rows read across) is then packed once, not once a group
// (x^T [dQ dK dV], 512 x 1536, k 16384 on Zen 5: 275 GFLOP/s as three products, 373-394 as one;
// the layer suite's fwd_bwd at T 8192 1.04x on Zen 4).
namespace {
bool one_weight_product(int n, int out_cols) { return n > out_cols && out_cols % gemm::panel_width() == 0; }
}  // namespace

std::size_t layer_weight_product_bytes(int m, int n, int k, int out_cols) {
  if (product_path() != ProductPath::packed) return k_split_bytes(m, n, k);
  return gemm::parallel_scratch_bytes(m, one_weight_product(n, out_cols) ? n : std::min(n, out_cols), k);
}

void layer_weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                          int out_cols, Allocator& allocator) {
  if (product_path() != ProductPath::packed) return k_split_product(m, n, k, A, lda, B, ldb, outs, out_cols, allocator);
  if (one_weight_product(n, out_cols)) {
    const int nr = gemm::panel_width();
    std::vector<float*> panels;
    for (int j = 0; j < n; j += nr) panels.push_back(outs[j / out_cols] + j % out_cols);
    return gemm::parallel_multiply_to_panels(true, false, m, n, k, A, lda, B, ldb, 0.0f, panels.data(), out_cols,
                                             allocator);
  }
  for (int j0 = 0; j0 < n; j0 += out_cols)
    gemm::parallel_multiply(true, false, m, std::min(out_cols, n - j0), k, A, lda, B + j0, ldb, 0.0f, outs[j0 / out_cols],
                            out_cols, allocator);
}

}  // namespace lattn::cpu

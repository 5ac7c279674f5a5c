// The layer's products on the CPU. Every OpenBLAS product the projections make calls `sgemm` below,
// the one place that names the BLAS routine; parallel_sgemm and k_split_product take OpenMP threads
// over blocks that whichever thread is free takes, with the product single-threaded inside
// (project_to_heads in hybrid/cpu.cpp calls sgemm on its own row tiles).
// The hybrid layer (hybrid/cpu.cpp) takes its products through layer_product / layer_weight_product,
// which run either those or the packed products of kernels/cpu/packed_gemm.hpp: product_path()
// says which. The modern block (block/cpu.cpp) calls parallel_sgemm and k_split_product directly.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/workspace.hpp"

namespace lattn::cpu {

// C = op(A) op(B) + beta C, row-major, on the calling thread: cblas_sgemm.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc);

// Threads for `tasks` independent pieces of work: at most omp_get_max_threads(), at least 1.
int threads_for(std::size_t tasks);

// C = A op(B) + beta C (m x n, row-major), in blocks of C's rows. No scratch.
void parallel_sgemm(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                    float beta, float* C, int ldc);

// C = A^T B (m x n) of A (k x m) and B (k x n), k the batch's tokens, split over k (scratch:
// k_split_bytes). C's columns go to `outs` in groups of `out_cols` (row stride out_cols).
std::size_t k_split_bytes(int m, int n, int k);
void k_split_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                     int out_cols, Allocator& allocator);

// Which products the hybrid layer runs: OpenBLAS's sgemm, or the packed products. By default the
// packed ones at AVX-512 and OpenBLAS's otherwise (cpu/vec.hpp's active width); a test may set
// another, and the environment variable LATTN_LAYER_PRODUCTS=openblas|packed overrides both (for
// A/B runs of one build).
enum class ProductPath { openblas, packed };
ProductPath product_path();
// A path set by a test; the environment variable still wins. nullopt: back to the default.
void set_product_path(std::optional<ProductPath> path);
// What the layer's records and the device block name: "openblas" or "packed_<micro-kernel>".
std::string product_path_name();

// C = A op(B) + beta C (m x n, row-major) through product_path(); its scratch, exact.
std::size_t layer_product_bytes(int m, int n, int k);
void layer_product(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float beta,
                   float* C, int ldc, Allocator& allocator);
// C = A^T B as k_split_product computes it (C's columns to `outs` in groups of `out_cols`) through
// product_path(); its scratch, exact.
std::size_t layer_weight_product_bytes(int m, int n, int k, int out_cols);
void layer_weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                          int out_cols, Allocator& allocator);

}  // namespace lattn::cpu

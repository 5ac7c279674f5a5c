// The layer's products on the CPU. Every product the projections make calls `sgemm` below, the
// one place that names the BLAS routine, so that it can be swapped there; parallel_sgemm and
// k_split_product take OpenMP threads over blocks that whichever thread is free takes, with the
// product single-threaded inside (project_to_heads in cpu.cpp calls sgemm on its own row tiles).
#pragma once

#include <cstddef>

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

}  // namespace lattn::cpu

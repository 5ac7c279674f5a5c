// The layer's products on the CPU: every cblas_sgemm the projections make goes through these two
// functions (and project_to_heads in cpu.cpp, which packs x once for three weights), so that the
// product routine can be swapped in one place. Both take OpenMP threads over blocks that whichever
// thread is free takes, with OpenBLAS single-threaded inside.
#pragma once

#include <cstddef>

#include "core/workspace.hpp"

namespace lattn::cpu {

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

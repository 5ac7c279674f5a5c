// A packed, register-tiled float32 product for large row-major matrices (the layer's projections),
// op(B) is packed into panels of NR columns (a KC x NR panel stays in L1 while every
// row micro-tile of the A block reads it), op(A) into micro-panels of MR rows (a MC x KC block
// stays in L2), and an MR x NR micro-tile of C lives in registers for the whole KC depth.
//
// Why our own: OpenBLAS 0.3.21 (Debian 12) has no Zen 4/5 kernels, so AMD hosts run its Haswell
// (AVX2) kernel, which reaches about half the FMA rate of a core with full-width AVX-512; and its
// single-threaded calls on blocks of rows each repack all of B, where here one packing of B is
// shared by all threads.
//
// Micro-tiles: 14 x 32 at AVX-512 (28 zmm accumulators, two panel loads and 14 broadcasts for 28
// FMAs per k), 6 x 16 at AVX2 (12 ymm accumulators). Neither at the generic width: available() is
// false there, and callers use OpenBLAS. Those are the defaults of the `packed_gemm` tuning
// (kernels/cpu/tuning.hpp), which also offers 12 x 32 and 8 x 32 (4 x 16 at AVX2) and other KC and
// MC; every function here reads the tuning in force when called, so sizes taken from it hold only
// while it stays the same (it is set once, before the cases run).
#pragma once

#include <cstddef>

#include "core/workspace.hpp"

namespace lattn::cpu::gemm {

// Whether the packed products run at the active vector width (cpu/vec.hpp): AVX-512 or AVX2 + FMA.
bool available();
// The micro-kernel at the active width ("avx512_14x32", "avx2_6x16"), or "none".
const char* kernel_name();

// Scratch of parallel_multiply for these sizes with the threads it would take now (exact).
std::size_t parallel_scratch_bytes(int m, int n, int k);

// C = op(A) op(B) + beta C, row-major, op(A) m x k, op(B) k x n; beta 0 never reads C. op(B) packed
// in slabs of rows (whole where it takes at most 4 MiB), each shared out between the OpenMP threads,
// which then take blocks of C's rows in turn, each packing its own op(A) rows. Call from outside a
// parallel region.
void parallel_multiply(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B,
                       int ldb, float beta, float* C, int ldc, Allocator& allocator);

// The same with C's columns in panels of panel_width() placed apart, as multiply_packed_to_panels
// below writes them: C(i, p * panel_width() + j) at panel_c[p][i * ldc + j].
void parallel_multiply_to_panels(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda,
                                 const float* B, int ldb, float beta, float* const* panel_c, int ldc,
                                 Allocator& allocator);

// The same in two steps, for callers that run their own threads over row blocks of C (and use
// each block before the next): op(B) packed whole once, then products of any rows against it on
// the calling thread, each with its own A scratch.
std::size_t packed_b_floats(int k, int n);
// Columns per packed panel. Panels are k x panel_width() each, one after the other, so where n1 is a
// multiple of it, the packings of B1 (k x n1) and B2 (k x n2) side by side are the packing of [B1 B2].
int panel_width();
// Packs op(B) (k x n) into dst (packed_b_floats). Inside a parallel region, every thread of the
// team must call it (the panels are shared out; it ends in a barrier); outside, it runs alone.
void pack_b(bool trans_b, int k, int n, const float* B, int ldb, float* dst);
std::size_t packed_a_floats(int m, int k);  // A scratch of multiply_packed for m rows of depth k
// C's m rows in blocks of whole micro-tiles for `threads` threads that take them in turn: about four
// blocks per thread, at most MC rows each (the rows multiply_packed packs and multiplies at a time), their count a multiple of the threads and their sizes
// within one micro-tile of each other, so that the threads finish together.
struct RowBlocks {
  int count = 0;      // blocks
  int most_rows = 0;  // rows of the largest block, a multiple of the micro-tile's (the A scratch's)
  int rows = 0, tiles = 0, mr = 1;
  int begin(int index) const;  // first row of block `index`; begin(count) is m
};
RowBlocks row_blocks(int m, int threads);
void multiply_packed(bool trans_a, int m, int n, int k, const float* A, int lda, const float* packed_b, float beta,
                     float* C, int ldc, float* a_scratch);
// The same with C's columns in panels of panel_width() placed apart: C(i, p * panel_width() + j) at
// panel_c[p][i * ldc + j] (a product written straight into another layout, as the layer's
// projections into [batch][head][token][dim]).
void multiply_packed_to_panels(bool trans_a, int m, int n, int k, const float* A, int lda, const float* packed_b,
                               float beta, float* const* panel_c, int ldc, float* a_scratch);

}  // namespace lattn::cpu::gemm

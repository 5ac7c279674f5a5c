// A register-tiled AVX-512 product for the small per-chunk matrices of the chunked form.
//
// Why not OpenBLAS here: a chunk's products are 128 x 128 x D, a few MFLOP each; every sgemm call
// packs both operands and cannot skip the causal zeros, fuse two products into one accumulator,
// or scale rows between them. This does all three:
//
//   C[i][j] = alpha * mask[i][j] * ( rs[i] * sum_k A1(i,k) B1(k,j) + sum_k A2(i,k) B2(k,j) ) + beta C[i][j]
//
// (rs, mask optional). A operands are read by scalar broadcasts, so any layout works (A(i,k) =
// a[i*ars + k*acs]: a matrix or its transpose). B operands are packed into panels of 32 columns
// (two zmm), each panel a K x 32 row-major block, zero-padded past the last column: the packed
// panel is contiguous, so its 16 KiB (K = 128) stays in L1 while every row tile of C reads it.
// The micro-tile is 8 rows x 32 columns: 16 accumulators, and per k two panel loads and 8
// broadcasts for 16 FMAs.
//
// Causal structure: a segment's k range can be cut to k < i0 + 8 (A lower triangular: masked
// scores) or k >= i0 (A the transpose of a lower-triangular matrix), or to a band that moves with
// the rows (A zero outside a sliding window), and an output marked lower skips tiles that lie
// wholly above the diagonal (they are never read).
#pragma once

#include <cstddef>

namespace lattn::cpu::tile {

constexpr int kMR = 8;   // rows of a micro-tile
constexpr int kNR = 32;  // columns of a micro-tile and of a packed panel

inline int panel_cols(int n) { return (n + kNR - 1) / kNR * kNR; }

// The k range of the micro-tile whose rows start at i0 (rows i0 .. i0 + MR - 1): full 0 .. K-1;
// lower k < i0 + MR; upper k >= i0; band i0 + band_lo <= k < i0 + MR + band_hi (clipped to 0 .. K-1).
enum class Range { none, full, lower, upper, band };

struct Segment {
  Range range = Range::none;
  int K = 0;
  const float* a = nullptr;
  long ars = 0, acs = 0;
  const float* b = nullptr;  // packed panels, panel p at b + p * K * kNR
  // Or, with brs set, B read in place: B(k, j) = b[k * brs + j] for a row-major matrix whose
  // width is a multiple of 32 (no zero padding is needed then).
  long brs = 0;
  int band_lo = 0, band_hi = 0;  // Range::band's offsets
};

// A segment over k < K of A(i, k) = a[i * ars + k * acs] and B (packed, or in place with brs).
inline Segment seg(Range range, int K, const float* a, long ars, long acs, const float* b, long brs = 0) {
  Segment s;
  s.range = range;
  s.K = K;
  s.a = a;
  s.ars = ars;
  s.acs = acs;
  s.b = b;
  s.brs = brs;
  return s;
}

struct Product {
  int M = 0, N = 0;
  float* c = nullptr;
  long ldc = 0;            // C(i, j) at c[(j / 32) * cps + i * ldc + j % 32]
  long cps = kNR;          // cps = 32 for a row-major C (ldc its row stride); M * 32 for a packed one
  float beta = 0.0f;       // beta != 0: C's old value is read
  Segment s1;
  const float* rs = nullptr;  // per-row scale after s1
  Segment s2;
  float alpha = 1.0f;
  const float* mask = nullptr;  // multiplies C elementwise (ld ldm) on tiles that cross the diagonal,
  long ldm = 0;                 // and on every tile when mask_all
  bool mask_all = false;
  bool lower = false;  // C is lower triangular (mask zeroes above the diagonal): skip tiles above it
  // Memory the caller reads next (the next chunk's rows): prefetched into L2 a few lines per
  // micro-tile, so that its misses overlap this product's FMAs instead of stalling the next one.
  const float* prefetch = nullptr;
  std::size_t prefetch_floats = 0;
};

void run(const Product& product);

// dst panels of the K x N matrix X (X(k, j) = src[k * lds + j], or src[j * lds + k] when
// transposed), each row k scaled by w[k] when w is given.
void pack(const float* src, long lds, bool transposed, int K, int N, const float* w, float* dst);
// The inverse of pack for a packed D x D state: dst[i * ldd + j] = X(i, j).
void unpack(const float* panels, int K, int N, float* dst, long ldd);
// Panels of X^T from the panels of a packed D x D matrix X, in one pass (16 x 16 blocks
// transposed in registers where D allows; the last panel zero-padded as pack pads it).
void transpose_packed(const float* panels, int D, float* dst);
// Panels of X^T (N x K) from the panels of a packed K x N matrix X (a Dk x Dv state), the last
// panel zero-padded.
void transpose_packed(const float* panels, int K, int N, float* dst);

}  // namespace lattn::cpu::tile

// See packed_gemm.hpp. Loop order: op(B) packed a slab of rows at a time (whole where it fits in
// 4 MiB: every weight of the layer at M = 512; all threads share the panels out, then read them
// all), then C's rows in blocks of MC that the threads take in turn; per block the slab's depth in
// blocks of KC (the block's op(A) rows packed by its thread), then B panels outside A micro-panels,
// so that one KC x NR panel is read from L1 by every micro-tile of the block.
// Slabs rather than BLIS's KC x NC blocks: two barriers per slab instead of per depth block of 256
// (a thread that loses its core for a moment on a shared machine stalls the other at each one; x^T G
// over 4096 tokens had 32), and a slab, unlike op(B) packed whole (25 MiB for x^T G at M = 512 and
// 4096 tokens: ~5% slower), is read back from L3.
#include "kernels/cpu/packed_gemm.hpp"

#include <omp.h>

#include <algorithm>

#include "kernels/cpu/transpose16.hpp"
#include "kernels/cpu/tuning.hpp"
#include "kernels/cpu/vec.hpp"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace lattn::cpu::gemm {
namespace {

// C's rows [0, rows) and columns [0, cols) of a micro-tile at c: beta C + the product of the
// packed A micro-panel a (kc x MR) and B panel b (kc x NR).
using MicroKernel = void (*)(int kc, const float* a, const float* b, float* c, long ldc, int rows, int cols,
                             float beta);

struct Blocking {
  int mr, nr;  // micro-tile
  int kc;      // depth of a packed block: a KC x NR panel of B (32 KiB at AVX-512) is read from L1
  int mc;      // rows of a packed A block (MC x KC: 140 KiB at AVX-512) read from L2; a multiple of mr
  MicroKernel kernel;
};

// The portable micro-tile (generic width): 4 x 16, element by element.
void micro_generic(int kc, const float* a, const float* b, float* c, long ldc, int rows, int cols, float beta) {
  constexpr int MR = 4, NR = 16;
  float acc[MR][NR] = {};
  for (int k = 0; k < kc; ++k, a += MR, b += NR)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      float& out = c[i * ldc + j];
      out = beta != 0.0f ? beta * out + acc[i][j] : acc[i][j];
    }
}

#if defined(__AVX512F__)
// A micro-panel of up to 16 rows of a row-major A, 16 depths at a time through a register
// transpose: out[k * mr + i] = src[i * lda + k] for k < k_fast (a multiple of 16), rows past
// `valid` zero. Read element by element with stride mr, this packing took ~7% of the products'
// time at n = 512 (the output projection: 2n flops per packed element).
int pack_rows_avx512(const float* src, long lda, int valid, int mr, int kc, float* out) {
  const int k_fast = kc / 16 * 16;
  const __mmask16 row_lanes = __mmask16((1u << mr) - 1);
  for (int k0 = 0; k0 < k_fast; k0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < valid ? _mm512_loadu_ps(src + std::ptrdiff_t(i) * lda + k0) : _mm512_setzero_ps();
    transpose16(r);
    for (int kk = 0; kk < 16; ++kk) _mm512_mask_storeu_ps(out + std::size_t(k0 + kk) * mr, row_lanes, r[kk]);
  }
  return k_fast;
}

inline __mmask16 lanes(int n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max(n, 0)) - 1); }

// MR rows: the `packed_gemm` tuning's micro_rows (14 by default).
template <int MR>
void micro_avx512(int kc, const float* a, const float* b, float* c, long ldc, int rows, int cols, float beta) {
  __m512 acc[MR][2];
#pragma GCC unroll 14
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k, a += MR, b += 32) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 14
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  const __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16);
  const __m512 vbeta = _mm512_set1_ps(beta);
#pragma GCC unroll 14
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
    float* row = c + i * ldc;
    __m512 x0 = acc[i][0], x1 = acc[i][1];
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(m0, row), x0);
      x1 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(m1, row + 16), x1);
    }
    _mm512_mask_storeu_ps(row, m0, x0);
    _mm512_mask_storeu_ps(row + 16, m1, x1);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <int MR>
void micro_avx2(int kc, const float* a, const float* b, float* c, long ldc, int rows, int cols, float beta) {
  constexpr int NR = 16;
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k, a += MR, b += NR) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  if (rows == MR && cols == NR) {
    const __m256 vbeta = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
      __m256 x0 = acc[i][0], x1 = acc[i][1];
      if (beta != 0.0f) {
        x0 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row), x0);
        x1 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row + 8), x1);
      }
      _mm256_storeu_ps(row, x0);
      _mm256_storeu_ps(row + 8, x1);
    }
    return;
  }
  // An edge tile: through memory, element by element.
  alignas(32) float tile[MR][NR];
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(tile[i], acc[i][0]);
    _mm256_store_ps(tile[i] + 8, acc[i][1]);
  }
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      float& out = c[i * ldc + j];
      out = beta != 0.0f ? beta * out + tile[i][j] : tile[i][j];
    }
}
#endif

// The tuned blocking at the active width (kernels/cpu/tuning.hpp, `packed_gemm`): micro_rows picks
// the micro-kernel, depth_block is KC, and MC is row_tiles micro-tiles.
Blocking blocking() {
  using tuning::Knob;
  const int mr = tuning::value(Knob::gemm_micro_rows), kc = tuning::value(Knob::gemm_depth_block),
            mc = tuning::value(Knob::gemm_row_tiles) * mr;
  switch (active_vec()) {
#if defined(__AVX512F__)
    case Vec::avx512:
      return {mr, 32, kc, mc, mr == 8 ? micro_avx512<8> : mr == 12 ? micro_avx512<12> : micro_avx512<14>};
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return {mr, 16, kc, mc, mr == 4 ? micro_avx2<4> : micro_avx2<6>};
#endif
    default: return {4, 16, kc, mc, micro_generic};
  }
}

int round_up(int x, int to) { return (x + to - 1) / to * to; }

// Micro-panels of op(A)'s rows [i0, i0 + rows) and depth [k0, k0 + kc): panel q holds
// dst[q * kc * mr + k * mr + i] = op(A)(i0 + q * mr + i, k0 + k), rows past the end zero.
void pack_a(const Blocking& s, bool trans_a, const float* A, long lda, int i0, int rows, int k0, int kc, float* dst) {
  for (int q = 0; q * s.mr < rows; ++q) {
    float* out = dst + std::size_t(q) * kc * s.mr;
    const int r0 = q * s.mr, valid = std::min(s.mr, rows - r0);
    if (trans_a) {  // op(A)(i, k) = A[k * lda + i]: each k's mr values are contiguous
      for (int k = 0; k < kc; ++k) {
        const float* src = A + std::ptrdiff_t(k0 + k) * lda + i0 + r0;
        float* o = out + std::size_t(k) * s.mr;
        for (int i = 0; i < valid; ++i) o[i] = src[i];
        for (int i = valid; i < s.mr; ++i) o[i] = 0.0f;
      }
    } else {  // op(A)(i, k) = A[i * lda + k]: rows read along, written with stride mr
      const float* rows = A + std::ptrdiff_t(i0 + r0) * lda + k0;
      int k_done = 0;
#if defined(__AVX512F__)
      if (s.mr <= 16 && active_vec() == Vec::avx512) k_done = pack_rows_avx512(rows, lda, valid, s.mr, kc, out);
#endif
      for (int i = 0; i < valid; ++i)
        for (int k = k_done; k < kc; ++k) out[std::size_t(k) * s.mr + i] = rows[std::ptrdiff_t(i) * lda + k];
      for (int i = valid; i < s.mr; ++i)
        for (int k = k_done; k < kc; ++k) out[std::size_t(k) * s.mr + i] = 0.0f;
    }
  }
}

// Panel p of op(B)'s depth [k0, k0 + kc) and columns [j0 + p * nr, + nr) at dst + p * panel_stride,
// row k at + k * nr; columns past n zero.
void pack_b_panel(const Blocking& s, bool trans_b, const float* B, long ldb, int n, int k0, int kc, int j0, int p,
                  std::size_t panel_stride, float* dst) {
  float* out = dst + std::size_t(p) * panel_stride;
  const int c0 = j0 + p * s.nr, valid = std::min(s.nr, n - c0);
  if (trans_b) {  // op(B)(k, j) = B[j * ldb + k]: columns read along, written with stride nr
    for (int j = 0; j < valid; ++j) {
      const float* src = B + std::ptrdiff_t(c0 + j) * ldb + k0;
      for (int k = 0; k < kc; ++k) out[std::size_t(k) * s.nr + j] = src[k];
    }
    for (int k = 0; k < kc; ++k)
      for (int j = valid; j < s.nr; ++j) out[std::size_t(k) * s.nr + j] = 0.0f;
  } else {
    for (int k = 0; k < kc; ++k) {
      const float* src = B + std::ptrdiff_t(k0 + k) * ldb + c0;
      float* o = out + std::size_t(k) * s.nr;
      for (int j = 0; j < valid; ++j) o[j] = src[j];
      for (int j = valid; j < s.nr; ++j) o[j] = 0.0f;
    }
  }
}

// C (rows x cols at c) = beta C + packed A block (micro-panels of depth kc) times packed B panels
// (panel p at b + p * panel_stride). C's panel p (its columns p * NR ..) starts at c + p * NR, or at
// panel_c[p] + row0 * ldc when panel_c is given.
void macro(const Blocking& s, int kc, int rows, int cols, const float* a, const float* b, std::size_t panel_stride,
           float beta, float* c, long ldc, float* const* panel_c, int row0) {
  for (int p = 0; p * s.nr < cols; ++p) {
    const int j = p * s.nr, w = std::min(s.nr, cols - j);
    float* const cp = panel_c ? panel_c[p] + std::ptrdiff_t(row0) * ldc : c + j;
    for (int q = 0; q * s.mr < rows; ++q) {
      const int i = q * s.mr;
      s.kernel(kc, a + std::size_t(q) * kc * s.mr, b + std::size_t(p) * panel_stride, cp + std::ptrdiff_t(i) * ldc,
               ldc, std::min(s.mr, rows - i), w, beta);
    }
  }
}

// C = beta C where there is nothing to multiply (k = 0).
void scale(int m, int n, float beta, float* C, long ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float& out = C[std::ptrdiff_t(i) * ldc + j];
      out = beta != 0.0f ? beta * out : 0.0f;
    }
}

struct Plan {
  int kc;
  RowBlocks blocks;
  int threads;
  int slab;  // rows of op(B) packed at a time
};

// op(B) is packed in slabs of at most kSlabFloats (4 MiB: a slab stays in L3 while the threads
// read it), whole where it fits; a slab is at least KC rows deep.
constexpr std::size_t kSlabFloats = std::size_t(1) << 20;

Plan plan(const Blocking& s, int m, int n, int k) {
  Plan p{};
  const std::size_t rows_fit = kSlabFloats / std::size_t(round_up(n, s.nr));
  p.slab = std::size_t(k) <= rows_fit ? k : std::min(k, std::max(s.kc, int(rows_fit) / s.kc * s.kc));
  p.kc = std::max(1, std::min(k, s.kc));
  p.blocks = row_blocks(std::max(m, 1), omp_get_max_threads());
  p.threads = std::max(1, std::min(omp_get_max_threads(), p.blocks.count));
  return p;
}

// multiply_packed's loops: C's block of rows at C (row-major) or in the panels at panel_c, where
// the block's first row is row panel_row0 of each panel.
void multiply_blocks(bool trans_a, int m, int n, int k, const float* A, int lda, const float* packed_b, float beta,
                     float* C, int ldc, float* const* panel_c, int panel_row0, float* a_scratch) {
  const Blocking s = blocking();
  const std::size_t panel_stride = std::size_t(k) * s.nr;  // whole-depth panels
  for (int k0 = 0; k0 < k; k0 += s.kc) {
    const int kc = std::min(s.kc, k - k0);
    for (int i0 = 0; i0 < m; i0 += s.mc) {
      const int rows = std::min(s.mc, m - i0);
      pack_a(s, trans_a, A, lda, i0, rows, k0, kc, a_scratch);
      macro(s, kc, rows, n, a_scratch, packed_b + std::size_t(k0) * s.nr, panel_stride, k0 == 0 ? beta : 1.0f,
            C ? C + std::ptrdiff_t(i0) * ldc : nullptr, ldc, panel_c, panel_row0 + i0);
    }
  }
}

}  // namespace

bool available() { return active_vec() != Vec::generic; }

const char* kernel_name() {
  switch (active_vec()) {
    case Vec::avx512: {
      const int mr = tuning::value(tuning::Knob::gemm_micro_rows);
      return mr == 8 ? "avx512_8x32" : mr == 12 ? "avx512_12x32" : "avx512_14x32";
    }
    case Vec::avx2: return tuning::value(tuning::Knob::gemm_micro_rows) == 4 ? "avx2_4x16" : "avx2_6x16";
    default: return "none";
  }
}

std::size_t parallel_scratch_bytes(int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const Blocking s = blocking();
  const Plan p = plan(s, m, n, k);
  return (std::size_t(p.slab) * round_up(n, s.nr) + std::size_t(p.threads) * p.blocks.most_rows * p.kc) *
         sizeof(float);
}

namespace {

// parallel_multiply into C (row-major) or, where panel_c is given, into its panels.
void parallel_blocks(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc, float* const* panel_c, Allocator& allocator) {
  const Blocking s = blocking();
  const Plan p = plan(s, m, n, k);
  Workspace<float> packed(allocator, std::size_t(p.slab) * round_up(n, s.nr));
#pragma omp parallel num_threads(p.threads)
  {
    Workspace<float> a_block(allocator, std::size_t(p.blocks.most_rows) * p.kc);
    for (int k0 = 0; k0 < k; k0 += p.slab) {
      const int depth = std::min(p.slab, k - k0);
      // The slab's rows of op(B): op(B)(k0 + r, j) is B[(k0 + r) * ldb + j], or B[j * ldb + k0 + r].
      pack_b(trans_b, depth, n, trans_b ? B + k0 : B + std::ptrdiff_t(k0) * ldb, ldb, packed.data());
      // The first slab applies beta; the later ones add onto it.
#pragma omp for schedule(dynamic)
      for (int index = 0; index < p.blocks.count; ++index) {
        const int i0 = p.blocks.begin(index), rows = p.blocks.begin(index + 1) - i0;
        const float* a_rows = trans_a ? A + std::ptrdiff_t(k0) * lda + i0 : A + std::ptrdiff_t(i0) * lda + k0;
        multiply_blocks(trans_a, rows, n, depth, a_rows, lda, packed.data(), k0 == 0 ? beta : 1.0f,
                        panel_c ? nullptr : C + std::ptrdiff_t(i0) * ldc, ldc, panel_c, i0, a_block.data());
      }
    }
  }
}

void scale_panels(int m, int n, float beta, float* const* panel_c, int ldc) {
  const int nr = blocking().nr;
  for (int p = 0; p * nr < n; ++p) scale(m, std::min(nr, n - p * nr), beta, panel_c[p], ldc);
}

}  // namespace

void parallel_multiply(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B,
                       int ldb, float beta, float* C, int ldc, Allocator& allocator) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale(m, n, beta, C, ldc);
  parallel_blocks(trans_a, trans_b, m, n, k, A, lda, B, ldb, beta, C, ldc, nullptr, allocator);
}

void parallel_multiply_to_panels(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda,
                                 const float* B, int ldb, float beta, float* const* panel_c, int ldc,
                                 Allocator& allocator) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale_panels(m, n, beta, panel_c, ldc);
  parallel_blocks(trans_a, trans_b, m, n, k, A, lda, B, ldb, beta, nullptr, ldc, panel_c, allocator);
}

std::size_t packed_b_floats(int k, int n) {
  if (k <= 0 || n <= 0) return 0;
  return std::size_t(k) * round_up(n, blocking().nr);
}

int panel_width() { return blocking().nr; }

// Whole micro-tiles per block, as even as they go: with the blocks' count a multiple of the threads,
// threads taking them in turn finish together. Blocks of MC rows each with a short last one (1024
// rows: 7 x 140 + 44) left one thread 560 rows against 464.
RowBlocks row_blocks(int m, int threads) {
  const Blocking s = blocking();
  RowBlocks b{};
  b.rows = std::max(m, 0);
  b.mr = s.mr;
  const int tiles = (b.rows + s.mr - 1) / s.mr, threads_used = std::max(threads, 1);
  if (tiles == 0) return b;
  const int per_block = std::clamp((tiles + 4 * threads_used - 1) / (4 * threads_used), 1, s.mc / s.mr);
  b.count = (tiles + per_block - 1) / per_block;
  if (b.count > threads_used) b.count = std::min(tiles, round_up(b.count, threads_used));
  b.tiles = tiles;
  b.most_rows = (tiles + b.count - 1) / b.count * s.mr;  // whole micro-tiles: the A scratch's rows
  return b;
}

int RowBlocks::begin(int index) const {
  if (count == 0) return 0;
  const int base = tiles / count, extra = tiles % count;
  return std::min(rows, (index * base + std::min(index, extra)) * mr);
}

void pack_b(bool trans_b, int k, int n, const float* B, int ldb, float* dst) {
  const Blocking s = blocking();
  const int panels = (n + s.nr - 1) / s.nr;
#pragma omp for schedule(static)
  for (int panel = 0; panel < panels; ++panel)
    pack_b_panel(s, trans_b, B, ldb, n, 0, k, 0, panel, std::size_t(k) * s.nr, dst);
}

std::size_t packed_a_floats(int m, int k) {
  if (m <= 0 || k <= 0) return 0;
  const Blocking s = blocking();
  return std::size_t(std::min(round_up(m, s.mr), s.mc)) * std::min(k, s.kc);
}

void multiply_packed(bool trans_a, int m, int n, int k, const float* A, int lda, const float* packed_b, float beta,
                     float* C, int ldc, float* a_scratch) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale(m, n, beta, C, ldc);
  multiply_blocks(trans_a, m, n, k, A, lda, packed_b, beta, C, ldc, nullptr, 0, a_scratch);
}

void multiply_packed_to_panels(bool trans_a, int m, int n, int k, const float* A, int lda, const float* packed_b,
                               float beta, float* const* panel_c, int ldc, float* a_scratch) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale_panels(m, n, beta, panel_c, ldc);
  multiply_blocks(trans_a, m, n, k, A, lda, packed_b, beta, nullptr, ldc, panel_c, 0, a_scratch);
}

}  // namespace lattn::cpu::gemm

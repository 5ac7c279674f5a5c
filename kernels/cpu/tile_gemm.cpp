// See tile_gemm.hpp. The AVX-512 micro-tiles where AVX-512 is compiled in, AVX2 micro-tiles where
// only AVX2 is; a portable form of the same products (element by element, the same k ranges,
// skipped tiles and masks) runs at the generic width (a build without either, or a test forcing
// it), for the kernels that have no OpenBLAS form of their own (the gated chunked form).
#include "kernels/cpu/tile_gemm.hpp"

#include <algorithm>

#include "kernels/cpu/transpose16.hpp"
#include "kernels/cpu/tuning.hpp"
#include "kernels/cpu/vec.hpp"

namespace lattn::cpu::tile {
namespace {

// B(k, j) of a segment: packed panels, or row-major in place.
float b_at(const Segment& s, int k, int j) {
  if (s.brs) return s.b[std::ptrdiff_t(k) * s.brs + j];
  return s.b[std::size_t(j / kNR) * s.K * kNR + std::size_t(k) * kNR + j % kNR];
}

// The k range [k0, k1) of a segment for the micro-tile of `rows` rows that starts at row i0: every
// form takes the same, so that a row sums over the same k whichever form runs.
inline void segment_range(const Segment& s, int i0, int rows, int& k0, int& k1) {
  k0 = 0;
  k1 = s.K;
  if (s.range == Range::lower) k1 = std::min(s.K, i0 + rows);
  if (s.range == Range::upper) k0 = std::min(s.K, i0);
  if (s.range == Range::band) {
    k0 = std::clamp(i0 + s.band_lo, 0, s.K);
    k1 = std::clamp(i0 + rows + s.band_hi, k0, s.K);
  }
}

// sum_k A(i, k) B(k, j) over the k range the micro-tile at row i0 takes.
float segment_sum(const Segment& s, int i, int i0, int j) {
  int k0, k1;
  segment_range(s, i0, kMR, k0, k1);
  float sum = 0.0f;
  for (int k = k0; k < k1; ++k) sum += s.a[std::ptrdiff_t(i) * s.ars + std::ptrdiff_t(k) * s.acs] * b_at(s, k, j);
  return sum;
}

void run_portable(const Product& p) {
  for (int i = 0; i < p.M; ++i) {
    const int i0 = i / kMR * kMR;
    for (int j = 0; j < p.N; ++j) {
      const int j0 = j / kNR * kNR;
      if (p.lower && i0 < j0) continue;  // a tile wholly above the diagonal
      float x = p.s1.range != Range::none ? segment_sum(p.s1, i, i0, j) : 0.0f;
      if (p.rs) x *= p.rs[i];
      if (p.s2.range != Range::none) x += segment_sum(p.s2, i, i0, j);
      x *= p.alpha;
      if (p.mask && (p.mask_all || j0 + kNR - 1 > i0)) x *= p.mask[std::ptrdiff_t(i) * p.ldm + j];
      float& c = p.c[std::ptrdiff_t(j0 / kNR) * p.cps + std::ptrdiff_t(i) * p.ldc + j % kNR];
      c = p.beta != 0.0f ? p.beta * c + x : x;
    }
  }
}

}  // namespace
}  // namespace lattn::cpu::tile

#if defined(__AVX512F__)
#include <immintrin.h>

namespace lattn::cpu::tile {
namespace {

inline __mmask16 lanes(int n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max(n, 0)) - 1); }

template <int MR>
struct Acc {
  __m512 v[MR][2];
};

// NB = 1: only the tile's first 16 columns (the rest lie above the diagonal of a lower output).
template <int MR, int NB>
__attribute__((always_inline)) inline void fma_segment(Acc<MR>& acc, int k0, int k1, const float* a, long ars,
                                                       long acs, const float* b, long brs) {
  const float* bk = b + k0 * brs;
  const float* ak = a + k0 * acs;
  for (int k = k0; k < k1; ++k, bk += brs, ak += acs) {
    const __m512 b0 = _mm512_loadu_ps(bk);
    const __m512 b1 = NB > 1 ? _mm512_loadu_ps(bk + 16) : b0;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(ak[i * ars]);
      acc.v[i][0] = _mm512_fmadd_ps(x, b0, acc.v[i][0]);
      if constexpr (NB > 1) acc.v[i][1] = _mm512_fmadd_ps(x, b1, acc.v[i][1]);
    }
  }
}

template <int MR, int NB>
__attribute__((always_inline)) inline void run_segment(Acc<MR>& acc, const Segment& s, int i0, int panel) {
  int k0, k1;
  segment_range(s, i0, MR, k0, k1);
  const float* b = s.brs ? s.b + std::ptrdiff_t(panel) * kNR : s.b + std::size_t(panel) * s.K * kNR;
  fma_segment<MR, NB>(acc, k0, k1, s.a + std::ptrdiff_t(i0) * s.ars, s.ars, s.acs, b, s.brs ? s.brs : kNR);
}

template <int MR, int NB>
void tile(const Product& p, int i0, int panel) {
  const int j0 = panel * kNR;
  const __mmask16 m0 = lanes(p.N - j0), m1 = NB > 1 ? lanes(p.N - j0 - 16) : __mmask16(0);
  float* c = p.c + panel * p.cps + i0 * p.ldc;
  Acc<MR> acc;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc.v[i][0] = acc.v[i][1] = _mm512_setzero_ps();
  if (p.s1.range != Range::none) run_segment<MR, NB>(acc, p.s1, i0, panel);
  if (p.rs) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 r = _mm512_set1_ps(p.rs[i0 + i]);
      acc.v[i][0] = _mm512_mul_ps(r, acc.v[i][0]);
      acc.v[i][1] = _mm512_mul_ps(r, acc.v[i][1]);
    }
  }
  if (p.s2.range != Range::none) run_segment<MR, NB>(acc, p.s2, i0, panel);
  const __m512 alpha = _mm512_set1_ps(p.alpha);
  const bool masked = p.mask && (p.mask_all || j0 + kNR - 1 > i0);
  const float* mrow = masked ? p.mask + i0 * p.ldm + j0 : nullptr;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    __m512 x0 = acc.v[i][0], x1 = acc.v[i][1];
    if (p.alpha != 1.0f) {
      x0 = _mm512_mul_ps(alpha, x0);
      x1 = _mm512_mul_ps(alpha, x1);
    }
    if (masked) {
      x0 = _mm512_mul_ps(x0, _mm512_maskz_loadu_ps(m0, mrow + i * p.ldm));
      x1 = _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m1, mrow + i * p.ldm + 16));
    }
    if (p.beta != 0.0f) {
      // Added last, so the products' own sum is not rounded against C's (larger) magnitude.
      const __m512 beta = _mm512_set1_ps(p.beta);
      x0 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, c + i * p.ldc), x0);
      x1 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, c + i * p.ldc + 16), x1);
    }
    _mm512_mask_storeu_ps(c + i * p.ldc, m0, x0);
    _mm512_mask_storeu_ps(c + i * p.ldc + 16, m1, x1);
  }
}

template <int MR>
void any_tile(const Product& p, int i0, int panel) {
  // A lower output's tile whose rows all lie left of the panel's second half needs only the first.
  if (p.lower && i0 + MR - 1 < panel * kNR + 16) tile<MR, 1>(p, i0, panel);
  else tile<MR, 2>(p, i0, panel);
}

template <int MR>
void tail_tile(const Product& p, int i0, int panel, int rows) {
  if constexpr (MR > 0) {
    if (rows == MR) return any_tile<MR>(p, i0, panel);
    tail_tile<MR - 1>(p, i0, panel, rows);
  }
}

}  // namespace

void run(const Product& p) {
  if (!tiles_active()) return run_portable(p);
  const int panels = (p.N + kNR - 1) / kNR;
  // Lines to prefetch before each micro-tile: the region spread evenly over an upper bound of
  // the tiles (a lower output has fewer; the rest go out at the end).
  // Into L2 by default; the `tile_products` tuning's prefetch_next may send them to L1 or nowhere.
  const int into = tuning::value(tuning::Knob::tile_prefetch_next);
  const std::size_t lines = p.prefetch && into != 0 ? (p.prefetch_floats + 15) / 16 : 0;
  const std::size_t tiles = std::size_t(panels) * ((p.M + kMR - 1) / kMR);
  const std::size_t per_tile = tiles ? (lines + tiles - 1) / tiles : 0;
  std::size_t next = 0;
  auto prefetch_some = [&](std::size_t count) {
    for (const std::size_t end = std::min(lines, next + count); next < end; ++next) {
      const char* line = reinterpret_cast<const char*>(p.prefetch + next * 16);
      if (into == 2) _mm_prefetch(line, _MM_HINT_T0);
      else _mm_prefetch(line, _MM_HINT_T1);
    }
  };
  for (int panel = 0; panel < panels; ++panel) {
    const int j0 = panel * kNR;
    // Tiles wholly above the diagonal of a lower output are skipped; its rows start at j0.
    int i0 = p.lower ? j0 / kMR * kMR : 0;
    for (; i0 + kMR <= p.M; i0 += kMR) {
      prefetch_some(per_tile);
      any_tile<kMR>(p, i0, panel);
    }
    if (i0 < p.M) tail_tile<kMR - 1>(p, i0, panel, p.M - i0);
  }
  prefetch_some(lines);
}

void pack(const float* src, long lds, bool transposed, int K, int N, const float* w, float* dst) {
  const int panels = (N + kNR - 1) / kNR;
  for (int panel = 0; panel < panels; ++panel) {
    const int j0 = panel * kNR, width = std::min(kNR, N - j0);
    float* out = dst + std::size_t(panel) * K * kNR;
    int k_fast = 0;
    if (transposed && width == kNR) {
      // X(k, j) = src[j * lds + k]: 16 x 16 blocks of src rows transposed in registers (a
      // strided scalar gather costs about 4x as much here, and the backward packs 3 of these
      // per chunk).
      k_fast = K / 16 * 16;
      for (int k0 = 0; k0 < k_fast; k0 += 16)
        for (int jj = 0; jj < kNR; jj += 16) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + std::size_t(j0 + jj + i) * lds + k0);
          transpose16(r);
          for (int i = 0; i < 16; ++i) {
            const __m512 x = w ? _mm512_mul_ps(_mm512_set1_ps(w[k0 + i]), r[i]) : r[i];
            _mm512_storeu_ps(out + std::size_t(k0 + i) * kNR + jj, x);
          }
        }
    }
    for (int k = k_fast; k < K; ++k) {
      float* row = out + std::size_t(k) * kNR;
      const float scale = w ? w[k] : 1.0f;
      if (transposed)
        for (int j = 0; j < width; ++j) row[j] = scale * src[std::size_t(j0 + j) * lds + k];
      else
        for (int j = 0; j < width; ++j) row[j] = scale * src[std::size_t(k) * lds + j0 + j];
      for (int j = width; j < kNR; ++j) row[j] = 0.0f;
    }
  }
}

void transpose_packed(const float* panels, int D, float* dst) {
  const std::size_t ps = std::size_t(D) * kNR;  // floats per panel
  auto at = [&](int i, int j) { return panels[std::size_t(j / kNR) * ps + std::size_t(i) * kNR + j % kNR]; };
  if (D % 16 == 0) {
    // dst(k, j) = X(j, k): the 16 x 16 block of X at rows j0.., columns k0.. is 16 rows of 16
    // contiguous floats in its panel, and lands as 16 rows of 16 contiguous floats in dst's.
    for (int j0 = 0; j0 < D; j0 += 16)
      for (int k0 = 0; k0 < D; k0 += 16) {
        __m512 r[16];
        const float* src = panels + std::size_t(k0 / kNR) * ps + std::size_t(j0) * kNR + k0 % kNR;
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + std::size_t(i) * kNR);
        transpose16(r);
        float* out = dst + std::size_t(j0 / kNR) * ps + std::size_t(k0) * kNR + j0 % kNR;
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + std::size_t(i) * kNR, r[i]);
      }
    if (D % kNR == 0) return;
    // D an odd multiple of 16: the last panel's upper half is padding.
    float* last = dst + std::size_t(D / kNR) * ps;
    for (int k = 0; k < D; ++k) std::fill(last + std::size_t(k) * kNR + 16, last + std::size_t(k + 1) * kNR, 0.0f);
    return;
  }
  for (int q = 0; q < D; q += kNR)
    for (int k = 0; k < D; ++k) {
      float* row = dst + std::size_t(q / kNR) * ps + std::size_t(k) * kNR;
      for (int jj = 0; jj < kNR; ++jj) row[jj] = q + jj < D ? at(q + jj, k) : 0.0f;
    }
}

void transpose_packed(const float* panels, int K, int N, float* dst) {
  const std::size_t src_ps = std::size_t(K) * kNR, dst_ps = std::size_t(N) * kNR;
  if (K % 16 == 0 && N % 16 == 0) {
    // The 16 x 16 block of X at rows i0.., columns j0.. lands as rows j0.., columns i0.. of X^T.
    for (int j0 = 0; j0 < N; j0 += 16)
      for (int i0 = 0; i0 < K; i0 += 16) {
        __m512 r[16];
        const float* src = panels + std::size_t(j0 / kNR) * src_ps + std::size_t(i0) * kNR + j0 % kNR;
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + std::size_t(i) * kNR);
        transpose16(r);
        float* out = dst + std::size_t(i0 / kNR) * dst_ps + std::size_t(j0) * kNR + i0 % kNR;
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + std::size_t(i) * kNR, r[i]);
      }
    if (K % kNR == 0) return;
    float* last = dst + std::size_t(K / kNR) * dst_ps;
    for (int j = 0; j < N; ++j) std::fill(last + std::size_t(j) * kNR + 16, last + std::size_t(j + 1) * kNR, 0.0f);
    return;
  }
  for (int i0 = 0; i0 < K; i0 += kNR)
    for (int j = 0; j < N; ++j) {
      float* row = dst + std::size_t(i0 / kNR) * dst_ps + std::size_t(j) * kNR;
      for (int ii = 0; ii < kNR; ++ii)
        row[ii] = i0 + ii < K ? panels[std::size_t(j / kNR) * src_ps + std::size_t(i0 + ii) * kNR + j % kNR] : 0.0f;
    }
}

void unpack(const float* panels, int K, int N, float* dst, long ldd) {
  for (int j0 = 0; j0 < N; j0 += kNR) {
    const int width = std::min(kNR, N - j0);
    const float* in = panels + std::size_t(j0 / kNR) * K * kNR;
    for (int k = 0; k < K; ++k) std::copy(in + std::size_t(k) * kNR, in + std::size_t(k) * kNR + width, dst + k * ldd + j0);
  }
}

}  // namespace lattn::cpu::tile
#else
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace lattn::cpu::tile {
namespace {

// Rows r0 .. r0 + R - 1 (R <= 4) of the group at i0, the 16 columns of one half of a panel. With
// 16 ymm registers an AVX-512-shaped tile (8 x 32) does not fit: 4 x 16 keeps 8 accumulators (the
// FMA's latency times its two ports), two panel loads and a broadcast in registers, with 2R FMAs
// per 2 + R loads.
template <int R>
void quarter_tile(const Product& p, int i0, int group_rows, int r0, int panel, int half) {
  __m256 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const auto add_segment = [&](const Segment& s) {
    int k0, k1;
    segment_range(s, i0, group_rows, k0, k1);  // the group's, as the AVX-512 tile's at these rows
    const long brs = s.brs ? s.brs : kNR;
    const float* b = (s.brs ? s.b + std::ptrdiff_t(panel) * kNR : s.b + std::size_t(panel) * s.K * kNR) + std::ptrdiff_t(half) * 16 +
                     std::ptrdiff_t(k0) * brs;
    const float* a = s.a + std::ptrdiff_t(r0) * s.ars + std::ptrdiff_t(k0) * s.acs;
    for (int k = k0; k < k1; ++k, b += brs, a += s.acs) {
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
      for (int i = 0; i < R; ++i) {
        const __m256 x = _mm256_broadcast_ss(a + std::ptrdiff_t(i) * s.ars);
        acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
      }
    }
  };
  if (p.s1.range != Range::none) add_segment(p.s1);
  if (p.rs)
    for (int i = 0; i < R; ++i) {
      const __m256 r = _mm256_set1_ps(p.rs[r0 + i]);
      acc[i][0] = _mm256_mul_ps(r, acc[i][0]);
      acc[i][1] = _mm256_mul_ps(r, acc[i][1]);
    }
  if (p.s2.range != Range::none) add_segment(p.s2);
  const int j0 = panel * kNR, first = j0 + half * 16, cols = std::min(16, p.N - first);
  const bool masked = p.mask && (p.mask_all || j0 + kNR - 1 > i0);
  for (int i = 0; i < R; ++i) {
    const int row = r0 + i;
    float* c = p.c + std::ptrdiff_t(panel) * p.cps + std::ptrdiff_t(row) * p.ldc + std::ptrdiff_t(half) * 16;
    const float* m = masked ? p.mask + std::ptrdiff_t(row) * p.ldm + first : nullptr;
    __m256 x0 = acc[i][0], x1 = acc[i][1];
    if (p.alpha != 1.0f) {
      x0 = _mm256_mul_ps(_mm256_set1_ps(p.alpha), x0);
      x1 = _mm256_mul_ps(_mm256_set1_ps(p.alpha), x1);
    }
    if (cols == 16) {
      if (m) {
        x0 = _mm256_mul_ps(x0, _mm256_loadu_ps(m));
        x1 = _mm256_mul_ps(x1, _mm256_loadu_ps(m + 8));
      }
      if (p.beta != 0.0f) {
        // Added last, so the products' own sum is not rounded against C's (larger) magnitude.
        x0 = _mm256_fmadd_ps(_mm256_set1_ps(p.beta), _mm256_loadu_ps(c), x0);
        x1 = _mm256_fmadd_ps(_mm256_set1_ps(p.beta), _mm256_loadu_ps(c + 8), x1);
      }
      _mm256_storeu_ps(c, x0);
      _mm256_storeu_ps(c + 8, x1);
      continue;
    }
    alignas(32) float x[16];
    _mm256_store_ps(x, x0);
    _mm256_store_ps(x + 8, x1);
    for (int j = 0; j < cols; ++j) {
      const float v = m ? x[j] * m[j] : x[j];
      c[j] = p.beta != 0.0f ? p.beta * c[j] + v : v;
    }
  }
}

void rows_of_group(const Product& p, int i0, int group_rows, int r0, int rows, int panel, int half) {
  switch (rows) {
    case 1: return quarter_tile<1>(p, i0, group_rows, r0, panel, half);
    case 2: return quarter_tile<2>(p, i0, group_rows, r0, panel, half);
    case 3: return quarter_tile<3>(p, i0, group_rows, r0, panel, half);
    default: return quarter_tile<4>(p, i0, group_rows, r0, panel, half);
  }
}

}  // namespace

// The AVX2 form of the products where AVX-512 is not compiled in: the same k ranges, masks and
// skipped tiles as the AVX-512 tiles, on 4 x 16 micro-tiles (the portable form at the generic
// width, which the tests force).
void run(const Product& p) {
  if (active_vec() != Vec::avx2) return run_portable(p);
  const int panels = (p.N + kNR - 1) / kNR;
  for (int panel = 0; panel < panels; ++panel) {
    const int j0 = panel * kNR;
    // Groups wholly above the diagonal of a lower output are skipped; its rows start at j0.
    for (int i0 = p.lower ? j0 : 0; i0 < p.M; i0 += kMR) {
      const int rows = std::min(kMR, p.M - i0);
      // A lower output's group whose rows all lie left of the panel's second half needs only the
      // first (the rest lies above the diagonal, never read).
      const bool both = p.N > j0 + 16 && !(p.lower && i0 + rows - 1 < j0 + 16);
      for (int half = 0; half < (both ? 2 : 1); ++half)
        for (int r0 = i0; r0 < i0 + rows; r0 += 4)
          rows_of_group(p, i0, rows, r0, std::min(4, i0 + rows - r0), panel, half);
    }
  }
}

}  // namespace lattn::cpu::tile
#endif

namespace lattn::cpu::tile {

#if !(defined(__AVX2__) && defined(__FMA__))
void run(const Product& p) { run_portable(p); }
#endif

void pack(const float* src, long lds, bool transposed, int K, int N, const float* w, float* dst) {
  for (int panel = 0; panel < (N + kNR - 1) / kNR; ++panel)
    for (int k = 0; k < K; ++k)
      for (int jj = 0; jj < kNR; ++jj) {
        const int j = panel * kNR + jj;
        const float x = j >= N ? 0.0f : transposed ? src[std::ptrdiff_t(j) * lds + k] : src[std::ptrdiff_t(k) * lds + j];
        dst[(std::size_t(panel) * K + k) * kNR + jj] = w ? w[k] * x : x;
      }
}

void unpack(const float* panels, int K, int N, float* dst, long ldd) {
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) dst[std::ptrdiff_t(k) * ldd + j] = panels[(std::size_t(j / kNR) * K + k) * kNR + j % kNR];
}

void transpose_packed(const float* panels, int K, int N, float* dst) {
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < panel_cols(K); ++i)
      dst[(std::size_t(i / kNR) * N + j) * kNR + i % kNR] =
          i < K ? panels[(std::size_t(j / kNR) * K + i) * kNR + j % kNR] : 0.0f;
}

void transpose_packed(const float* panels, int D, float* dst) {
  for (int k = 0; k < D; ++k)
    for (int j = 0; j < panel_cols(D); ++j)
      dst[(std::size_t(j / kNR) * D + k) * kNR + j % kNR] =
          j < D ? panels[(std::size_t(k / kNR) * D + j) * kNR + k % kNR] : 0.0f;
}

}  // namespace lattn::cpu::tile
#endif

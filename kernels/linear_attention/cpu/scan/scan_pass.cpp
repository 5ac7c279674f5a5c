// The scan pass of cpu/scan/scan_pass.hpp, vectorised for AVX-512 and AVX2 with a portable fallback.
//
// Why it is shaped this way: a per-token pass over the whole state does 2 FMAs per state element
// per token but also a load and a store of that element; from L2 (D = 128: 64 KiB of state) the
// loads and stores, not the FMAs, set the pace. So
//   - a block of W columns of S (W = 32 floats on AVX-512: two registers per row) is walked row by
//     row; at D = 128 the block is 16 KiB and stays in L1 for the whole pass;
//   - U tokens are applied to each row while it is in registers (U = 6 on AVX-512), so one load
//     and one store of the row serve 6 updates and 6 readouts: 24 FMAs per row against 2 loads,
//     2 stores and 12 scalar broadcasts, which leaves the FMA ports the bottleneck (U = 4 ran
//     ~20% slower at D = 32 and 64, the same at D = 128, on one core);
//   - the U tokens' column operands c_t and outputs y_t live in registers for the whole row walk
//     (U * W / 16 each: 12 + 12 zmm, with two rows and their broadcasts 30 of the 32) and y_t is
//     written once, scaled, at the end.
// Ragged column tails (D not a multiple of the width) use masked loads and stores, full blocks
// plain ones. Interleaving 3 or 4 rows instead of 2 (with U = 4 or 5 to keep the registers) ran
// within the noise of 2 rows on one core in L1 (120-140 GFLOP/s for every variant, 2026-12-02).
// W, U and the row prefetch are the `scan` tuning's choices (kernels/cpu/tuning.hpp), read per
// pass: the figures above are its defaults, measured on Zen 4; W = 16 and U = 4 or 5 are the other
// candidates, compiled here as the ragged blocks and the short last walks already needed them.
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/tuning.hpp"

namespace lattn::cpu {
namespace {

using simd::load_lanes;
using simd::store_lanes;
#if defined(__AVX512F__)
using simd::Avx512;
#endif
#if defined(__AVX2__) && defined(__FMA__)
using simd::Avx2;
#endif


// Token pointers of a group of U consecutive steps of the pass (in pass order); a: the gates.
template <int U>
struct Group {
  const float* b[U];
  const float* c[U];
  const float* r[U];
  float* y[U];
  const float* a[U];
};

template <int U>
Group<U> group_at(const ScanPass& p, int step) {
  Group<U> g;
  for (int u = 0; u < U; ++u) {
    const int t = p.reverse ? p.T - 1 - (step + u) : step + u;
    const std::size_t row = std::size_t(t) * p.row_step, col = std::size_t(t) * p.col_step;
    g.b[u] = p.upd_row + row;
    g.c[u] = p.upd_col + col;
    g.r[u] = p.read_row + row;
    g.y[u] = p.out + col;
    g.a[u] = p.gate ? p.gate + std::ptrdiff_t(t + p.gate_shift) * p.gate_stride : nullptr;
  }
  return g;
}

// How the steps of a walk decay the state: not at all, by gamma, or by a gate (per token, per
// row, per column); or by one factor per step (gamma or a scalar gate) taken out of the row walk:
// with A_u the product of the group's factors up to step u, S_u = A_u S'_u where
// S'_u = S'_{u-1} + (b_u / A_u) c_u^T, and y_u = A_u S'_u^T r_u. So the walk scales the column
// operands by 1 / A_u and the readouts by A_u once per group, and each row once, by A_{U-1}, when
// it leaves the registers: 2 vector operations per row and step instead of 3 (the multiply was a
// third of the walk's FMA-port work). A group whose A_{U-1} is under 2^-64 (strong gates: 1 / A
// would leave float's range) walks with the factors applied step by step instead. A gate per row
// (vector gates on S's rows) factors the same way row by row: b_u / A_u and r_u A_u are row
// operands, formed for the group before its walk (rows_factored).
enum class Decays { none, gamma, scalar, rows, columns, factored, rows_factored };

// What a block walk is compiled for: U steps, NB registers of columns, R rows at a time, how the
// steps decay the state, whether the block is full width, whether it prefetches the next group's
// row operands.
template <int U_, int NB_, Decays DECAY_, bool FULL_, bool PREFETCH_>
struct Walk {
  static constexpr int U = U_, NB = NB_;
  static constexpr Decays DECAY = DECAY_;
  static constexpr bool FULL = FULL_, PREFETCH = PREFETCH_;
};

// R consecutive rows of the block (row points at the first): U steps applied to them while they
// are in registers.
// A gate's factors come from memory in the loop (broadcast or vector operands of the multiply):
// held in registers they would take U * NB of the 32 the walk already fills.
template <class I, class K, int R>
inline void row_group(const Group<K::U>& g, float* row, std::ptrdiff_t ld, int i, int c0, const typename I::M* m,
                      const typename I::V (&c)[K::U][K::NB], typename I::V (&y)[K::U][K::NB], typename I::V gam) {
  using V = typename I::V;
  constexpr int U = K::U, NB = K::NB;
  V s[R][NB];
#pragma GCC unroll 4
  for (int h = 0; h < R; ++h)
#pragma GCC unroll 4
    for (int n = 0; n < NB; ++n) s[h][n] = load_lanes<I, K::FULL>(m[n], row + h * ld + n * I::L);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int h = 0; h < R; ++h) {
      const V b = I::set1(g.b[u][i + h]), r = I::set1(g.r[u][i + h]);
#pragma GCC unroll 4
      for (int n = 0; n < NB; ++n) {
        if constexpr (K::DECAY == Decays::gamma) s[h][n] = I::mul(s[h][n], gam);
        if constexpr (K::DECAY == Decays::scalar) s[h][n] = I::mul(s[h][n], I::set1(g.a[u][0]));
        if constexpr (K::DECAY == Decays::rows) s[h][n] = I::mul(s[h][n], I::set1(g.a[u][i + h]));
        if constexpr (K::DECAY == Decays::columns)
          s[h][n] = I::mul(s[h][n], load_lanes<I, K::FULL>(m[n], g.a[u] + c0 + n * I::L));
        s[h][n] = I::fma(b, c[u][n], s[h][n]);
        y[u][n] = I::fma(r, s[h][n], y[u][n]);
      }
    }
#pragma GCC unroll 4
  for (int h = 0; h < R; ++h)
#pragma GCC unroll 4
    for (int n = 0; n < NB; ++n) {
      if constexpr (K::DECAY == Decays::factored) s[h][n] = I::mul(s[h][n], gam);  // gam: A_{U-1}
      if constexpr (K::DECAY == Decays::rows_factored) s[h][n] = I::mul(s[h][n], I::set1(g.a[0][i + h]));
      store_lanes<I, K::FULL>(row + h * ld + n * I::L, m[n], s[h][n]);
    }
}

// K::U steps of the pass on one column block [c0, c0 + NB * L) (masked by m) of S.
// factor: the group's A_u (Decays::factored only). ops: the row operands the walk reads (the
// factored ones for Decays::rows_factored, with a[0] the rows' A_{U-1}), else g's.
template <class I, class K>
void block_steps(const ScanPass& p, const Group<K::U>& g, int c0, const typename I::M* m,
                 const float* factor = nullptr, const Group<K::U>* ops = nullptr) {
  const Group<K::U>& walked = ops ? *ops : g;
  using V = typename I::V;
  constexpr int U = K::U, NB = K::NB, R = I::R;
  V c[U][NB], y[U][NB];
  const V us = I::set1(p.upd_scale);
  V gam = I::set1(p.gamma);
  if constexpr (K::DECAY == Decays::factored) gam = I::set1(factor[U - 1]);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    V cs = us;
    if constexpr (K::DECAY == Decays::factored) cs = I::set1(p.upd_scale / factor[u]);
#pragma GCC unroll 4
    for (int n = 0; n < NB; ++n) {
      c[u][n] = I::mul(load_lanes<I, K::FULL>(m[n], g.c[u] + c0 + n * I::L), cs);
      y[u][n] = I::zero();
    }
  }
  // Locals: the vector stores below may alias anything, so fields of p would be reloaded.
  float* row = p.S + (c0 - p.s_col0);
  const int rows = p.rows;
  const std::ptrdiff_t ld = p.ld;
  const std::ptrdiff_t ahead = (p.reverse ? -1L : 1L) * U * p.row_step;
  const std::ptrdiff_t col_ahead = (p.reverse ? -1L : 1L) * U * p.col_step;
  // The next group's row operands, one cache line per 16 rows: the first column block of a tile
  // reads them from memory, and the row walk is too regular for the prefetchers to run ahead.
  // The later blocks find them in cache, and there the prefetches cost ~12% of the rate.
  auto prefetch_rows = [&](int i) {
    if constexpr (K::PREFETCH) {
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        _mm_prefetch(reinterpret_cast<const char*>(g.b[u] + ahead + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(g.r[u] + ahead + i), _MM_HINT_T0);
      }
    }
  };
  // The next group's column operands and outputs, this block's share of their rows: every block
  // reads its own columns of the tile's c rows from memory (no other block brings them in) and
  // writes its own columns of y (no prefetch when they are streamed). Once per group, per block.
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int n = 0; n < NB; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(g.c[u] + col_ahead + c0 + n * I::L), _MM_HINT_T0);
      if (!p.stream_out)
        _mm_prefetch(reinterpret_cast<const char*>(g.y[u] + col_ahead + c0 + n * I::L), _MM_HINT_ET0);
    }
  // Rows go R at a time: within a row each readout waits on the state after the previous
  // token's update (a chain of U dependent FMAs), and the rows' chains are independent, so
  // interleaving them hands the FMA ports work the out-of-order window did not find on its own.
  int i = 0;
  for (; i + R <= rows; i += R, row += R * ld) {
    if ((i & 15) < R) prefetch_rows(i - (i & 15));
    row_group<I, K, R>(walked, row, ld, i, c0, m, c, y, gam);
  }
  for (; i < rows; ++i, row += ld) {  // the rows left when R does not divide them
    if ((i & 15) == 0) prefetch_rows(i);
    row_group<I, K, 1>(walked, row, ld, i, c0, m, c, y, gam);
  }
  V os[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
    os[u] = I::set1(K::DECAY == Decays::factored ? p.out_scale * factor[u] : p.out_scale);
  if (K::FULL && p.stream_out) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
      for (int n = 0; n < NB; ++n) I::stream(g.y[u] + c0 + n * I::L, I::mul(y[u][n], os[u]));
    return;
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int n = 0; n < NB; ++n) store_lanes<I, K::FULL>(g.y[u] + c0 + n * I::L, m[n], I::mul(y[u][n], os[u]));
}

// Gates per row factor out of the walk for states of up to this many rows (the group's operands
// live on the stack: 2 U rows + 1 floats).
constexpr int kMaxFactoredRows = 256;

// The group's row operands with the gates per row taken out: b_u / A_u and r_u A_u, and A_{U-1}
// (ops points at them; ops.a[0] at A_{U-1}), if every row's A_{U-1} keeps 1 / A_u in float's range.
template <int U>
bool row_factors(const ScanPass& p, const Group<U>& g, float (*b)[kMaxFactoredRows], float (*r)[kMaxFactoredRows],
                 float* a, Group<U>& ops) {
  const int rows = p.rows;
  // r_u A_u going forward (A_u cumulative, left in a), then b_u / A_u going back from one division
  // per row: 1 / A_u = (1 / A_{u+1}) a_{u+1}.
  for (int u = 0; u < U; ++u) {
    const float *__restrict ru = g.r[u], *__restrict au = g.a[u];
    float *__restrict ro = r[u], *__restrict A = a;
#pragma omp simd
    for (int i = 0; i < rows; ++i) {
      A[i] = u == 0 ? au[i] : A[i] * au[i];
      ro[i] = ru[i] * A[i];
    }
    ops.r[u] = ro;
  }
  // b[u] holds 1 / A_u first, then b_u / A_u.
  {
    const float* __restrict A = a;
    float* __restrict last = b[U - 1];
#pragma omp simd
    for (int i = 0; i < rows; ++i) last[i] = 1.0f / A[i];
  }
  for (int u = U - 2; u >= 0; --u) {
    const float *__restrict next = b[u + 1], *__restrict an = g.a[u + 1];
    float* __restrict bo = b[u];
#pragma omp simd
    for (int i = 0; i < rows; ++i) bo[i] = next[i] * an[i];
  }
  for (int u = 0; u < U; ++u) {
    const float* __restrict bu = g.b[u];
    float* __restrict bo = b[u];
#pragma omp simd
    for (int i = 0; i < rows; ++i) bo[i] *= bu[i];
    ops.b[u] = bo;
  }
  float lo = 1.0f, hi = 1.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int i = 0; i < rows; ++i) {
    lo = std::min(lo, a[i]);
    hi = std::max(hi, a[i]);
  }
  ops.a[0] = a;
  return lo >= 0x1p-64f && hi <= 0x1p64f;
}

// The group's products A_u of its factors (gamma, or the scalar gates), if A_{U-1} keeps
// 1 / A_u inside float's range.
template <int U, Decays DECAY>
bool factors(const ScanPass& p, const Group<U>& g, float (&a)[U]) {
  float product = 1.0f;
  for (int u = 0; u < U; ++u) a[u] = product *= DECAY == Decays::gamma ? p.gamma : g.a[u][0];
  return product >= 0x1p-64f && product <= 0x1p64f;
}

// Calls block_steps compiled for `left` steps (1 <= left <= U), and the pass's decay (or none).
template <class I, int NB, Decays DECAY, bool FULL, bool PREFETCH, int U = I::U>
void steps(const ScanPass& p, int step, int left, bool decay, int c0, const typename I::M* m) {
  if constexpr (U > 0) {
    if (left == U) {
      const Group<U> g = group_at<U>(p, step);
      if constexpr (DECAY == Decays::gamma || DECAY == Decays::scalar) {
        float a[U];
        if (decay && U > 1 && factors<U, DECAY>(p, g, a))
          return block_steps<I, Walk<U, NB, Decays::factored, FULL, PREFETCH>>(p, g, c0, m, a);
      }
      if constexpr (DECAY == Decays::rows) {
        if (decay && U > 1 && p.rows <= kMaxFactoredRows) {
          alignas(64) float b[U][kMaxFactoredRows], r[U][kMaxFactoredRows], a[kMaxFactoredRows];
          Group<U> ops = g;
          if (row_factors<U>(p, g, b, r, a, ops))
            return block_steps<I, Walk<U, NB, Decays::rows_factored, FULL, PREFETCH>>(p, g, c0, m, nullptr, &ops);
        }
      }
      if (decay) block_steps<I, Walk<U, NB, DECAY, FULL, PREFETCH>>(p, g, c0, m);
      else block_steps<I, Walk<U, NB, Decays::none, FULL, PREFETCH>>(p, g, c0, m);
      return;
    }
    steps<I, NB, DECAY, FULL, PREFETCH, U - 1>(p, step, left, decay, c0, m);
  }
}

// u: the tokens per walk in force (tuning), 1 <= u <= I::U.
template <class I, int NB, Decays DECAY, bool FULL, bool PREFETCH>
void column_block(const ScanPass& p, int c0, int width, int u) {
  typename I::M m[NB];
  for (int n = 0; n < NB; ++n) m[n] = I::mask(width - n * I::L);
  constexpr bool decay = DECAY != Decays::none;
  int step = 0;
  if (decay && !p.decay_first && p.T > 0) {
    steps<I, NB, DECAY, FULL, PREFETCH>(p, 0, 1, false, c0, m);
    step = 1;
  }
  for (; step < p.T; step += u) steps<I, NB, DECAY, FULL, PREFETCH>(p, step, std::min(u, p.T - step), decay, c0, m);
}

// Blocks of the tuned width: I::NV registers per row (the default), or one.
template <class I, Decays DECAY, bool PREFETCH>
void column_blocks(const ScanPass& p, int col_begin, int col_end, int W, int u) {
  static_assert(I::NV == 2, "blocks are one or two registers wide");
  for (int c0 = col_begin; c0 < col_end; c0 += W) {
    const int width = std::min(W, col_end - c0);
    if (width == I::L * I::NV) column_block<I, I::NV, DECAY, true, PREFETCH>(p, c0, width, u);
    else if (width > I::L) column_block<I, I::NV, DECAY, false, PREFETCH>(p, c0, width, u);
    else if (width == I::L) column_block<I, 1, DECAY, true, PREFETCH>(p, c0, width, u);
    else column_block<I, 1, DECAY, false, PREFETCH>(p, c0, width, u);
  }
}

Decays decays_of(const ScanPass& p) {
  if (!p.gate) return p.gamma != 1.0f ? Decays::gamma : Decays::none;
  switch (p.gate_scale) {
    case GateScale::scalar: return Decays::scalar;
    case GateScale::rows: return Decays::rows;
    case GateScale::columns: return Decays::columns;
  }
  return Decays::scalar;
}

template <class I, bool PREFETCH>
void run_decays(const ScanPass& p, int col_begin, int col_end, int W, int u) {
  switch (decays_of(p)) {
    case Decays::none: return column_blocks<I, Decays::none, PREFETCH>(p, col_begin, col_end, W, u);
    case Decays::gamma: return column_blocks<I, Decays::gamma, PREFETCH>(p, col_begin, col_end, W, u);
    case Decays::scalar: return column_blocks<I, Decays::scalar, PREFETCH>(p, col_begin, col_end, W, u);
    case Decays::rows: return column_blocks<I, Decays::rows, PREFETCH>(p, col_begin, col_end, W, u);
    case Decays::columns: return column_blocks<I, Decays::columns, PREFETCH>(p, col_begin, col_end, W, u);
    case Decays::factored:
    case Decays::rows_factored: break;  // a group's choice (steps), never a pass's
  }
}

// The tuned block width and tokens per walk of this width (kernels/cpu/tuning.hpp): the block
// width must be the one the caller packed the state for, so both come from scan_column_block.
template <class I>
void run_vectorised(const ScanPass& p, int col_begin, int col_end, Vec vec) {
  const int W = scan_column_block(vec), u = std::clamp(scan_tokens_per_walk(vec), 1, I::U);
  if (p.prefetch_next_rows) run_decays<I, true>(p, col_begin, col_end, W, u);
  else run_decays<I, false>(p, col_begin, col_end, W, u);
}

// The portable form: one token at a time, the column loop left to the compiler's vectoriser.
void run_generic(const ScanPass& p, int col_begin, int col_end) {
  const Decays decays = decays_of(p);
  for (int step = 0; step < p.T; ++step) {
    const Group<1> g = group_at<1>(p, step);
    const bool decay = step > 0 || p.decay_first;
    const float* a = g.a[0];  // the gate, or null
    float* __restrict y = g.y[0];
    for (int j = col_begin; j < col_end; ++j) y[j] = 0.0f;
    for (int i = 0; i < p.rows; ++i) {
      float* __restrict row = p.S + std::size_t(i) * p.ld - p.s_col0;
      const float b = p.upd_scale * g.b[0][i], r = g.r[0][i];
      const float* __restrict c = g.c[0];
      float gamma = decay ? p.gamma : 1.0f;
      if (decay && decays == Decays::scalar) gamma = a[0];
      if (decay && decays == Decays::rows) gamma = a[i];
      if (decay && decays == Decays::columns) {
#pragma omp simd
        for (int j = col_begin; j < col_end; ++j) row[j] *= a[j];
        gamma = 1.0f;
      }
#pragma omp simd
      for (int j = col_begin; j < col_end; ++j) {
        row[j] = gamma * row[j] + b * c[j];
        y[j] += r * row[j];
      }
    }
    for (int j = col_begin; j < col_end; ++j) y[j] *= p.out_scale;
  }
}

}  // namespace

int scan_tokens_per_walk(Vec vec) { return tuning::current(vec)[tuning::Knob::scan_tokens_per_walk]; }

int scan_column_block(Vec vec) { return tuning::current(vec)[tuning::Knob::scan_column_block]; }

bool scan_prefetch_rows(Vec vec) { return tuning::current(vec)[tuning::Knob::scan_prefetch_rows] != 0; }

void run_scan_pass(const ScanPass& p, int col_begin, int col_end, Vec vec) {
  if (col_begin >= col_end || p.T <= 0) return;
  // Non-temporal stores only in whole cache lines: every output row and block must start on one.
  ScanPass pass = p;
  pass.stream_out = p.stream_out && vec != Vec::generic && reinterpret_cast<std::uintptr_t>(p.out) % 64 == 0 &&
                    p.col_step % 16 == 0 && col_begin % 16 == 0;
  switch (vec) {
#if defined(__AVX512F__)
    case Vec::avx512: run_vectorised<Avx512>(pass, col_begin, col_end, vec); break;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: run_vectorised<Avx2>(pass, col_begin, col_end, vec); break;
#endif
    default: run_generic(pass, col_begin, col_end); break;
  }
  // Streamed lines are weakly ordered: visible to other threads only after a fence.
  if (pass.stream_out) _mm_sfence();
}

}  // namespace lattn::cpu

// The delta rule's walk (cpu/scan/delta_walk.hpp), vectorised for AVX-512 and AVX2 with a portable form.
//
// Two rows at a time with their own accumulators: a walk's readouts are chains of one FMA per row
// and register, and at 3 to 4 vector operations per row register the next row's FMA would otherwise
// wait for the previous one's (latency 4, two FMAs per cycle). The stages are template arguments,
// so that each of the five kinds of walk compiles to its own loop without branches.
//
// The pair walk's readouts need no second set of accumulators: at 3 + readouts vector operations
// per row register, consecutive FMAs into one readout are further apart than the FMA's latency.
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/simd.hpp"

namespace lattn::cpu {
namespace {

template <class I, int NV, WalkDecay DEC, bool U1, int NA, bool U2, bool RB>
void walk(const DeltaWalk& w) {
  using V = typename I::V;
  constexpr std::ptrdiff_t L = I::L, W = L * NV;  // pointer offsets: n * L in ptrdiff_t
  V c1[NV], c2[NV], ac[NV];
  for (int n = 0; n < NV; ++n) {
    if constexpr (U1) c1[n] = I::loadu(w.c1 + n * L);
    if constexpr (U2) c2[n] = I::loadu(w.c2 + n * L);
    if constexpr (DEC == WalkDecay::columns) ac[n] = I::loadu(w.a_cols + n * L);
  }
  const V as = I::set1(w.a_scalar);
  V y1[2][NV], y2[2][NV], y3[2][NV];
  for (int h = 0; h < 2; ++h)
    for (int n = 0; n < NV; ++n) y1[h][n] = y2[h][n] = y3[h][n] = I::zero();

  // The operands' pointers in locals: read through w, every store to the state would make the
  // compiler load them again for the next row.
  float* const S = w.S;
  const float *__restrict b1 = w.b1, *__restrict b2 = w.b2, *__restrict a_rows = w.a_rows;
  const float *__restrict x1 = w.x1, *__restrict x2 = w.x2, *__restrict x3 = w.x3;
  auto row = [&](int h, int i) __attribute__((always_inline)) {
    float* p = S + std::size_t(i) * W;
    V r[NV];
    for (int n = 0; n < NV; ++n) r[n] = I::loadu(p + n * L);
    if constexpr (U1) {
      const V b = I::set1(b1[i]);
      for (int n = 0; n < NV; ++n) r[n] = I::fma(b, c1[n], r[n]);
    }
    if constexpr (DEC == WalkDecay::scalar)
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], as);
    if constexpr (DEC == WalkDecay::rows) {
      const V a = I::set1(a_rows[i]);
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], a);
    }
    if constexpr (DEC == WalkDecay::columns)
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], ac[n]);
    if constexpr (NA >= 1) {
      const V x = I::set1(x1[i]);
      for (int n = 0; n < NV; ++n) y1[h][n] = I::fma(x, r[n], y1[h][n]);
    }
    if constexpr (NA >= 2) {
      const V x = I::set1(x2[i]);
      for (int n = 0; n < NV; ++n) y2[h][n] = I::fma(x, r[n], y2[h][n]);
    }
    if constexpr (U2) {
      const V b = I::set1(b2[i]);
      for (int n = 0; n < NV; ++n) r[n] = I::fma(b, c2[n], r[n]);
    }
    if constexpr (RB) {
      const V x = I::set1(x3[i]);
      for (int n = 0; n < NV; ++n) y3[h][n] = I::fma(x, r[n], y3[h][n]);
    }
    for (int n = 0; n < NV; ++n) I::storeu(p + n * L, r[n]);
  };

  const int D = w.D;
  int i = 0;
  for (; i + 2 <= D; i += 2) {
    row(0, i);
    row(1, i + 1);
  }
  if (i < D) row(0, i);
  for (int n = 0; n < NV; ++n) {
    if constexpr (NA >= 1) I::storeu(w.y1 + n * L, I::add(y1[0][n], y1[1][n]));
    if constexpr (NA >= 2) I::storeu(w.y2 + n * L, I::add(y2[0][n], y2[1][n]));
    if constexpr (RB) I::storeu(w.y3 + n * L, I::add(y3[0][n], y3[1][n]));
  }
}

template <class I, int NV, WalkDecay DEC>
void shaped(const DeltaWalk& w) {
  if (w.b1 && w.x1 && w.x2 && !w.b2 && !w.x3) return walk<I, NV, DEC, true, 2, false, false>(w);
  if (w.b1 && w.x1 && !w.x2 && !w.b2 && !w.x3) return walk<I, NV, DEC, true, 1, false, false>(w);
  if (w.b1 && !w.x1 && !w.x2 && !w.b2 && !w.x3) return walk<I, NV, DEC, true, 0, false, false>(w);
  if (w.b1 && !w.x1 && !w.x2 && w.b2 && w.x3) return walk<I, NV, DEC, true, 0, true, true>(w);
  if (!w.b1 && w.x1 && !w.x2 && w.b2 && w.x3) return walk<I, NV, DEC, false, 1, true, true>(w);
  throw std::logic_error("run_delta_walk: no walk of these stages");
}

template <class I, int NV>
void decayed(const DeltaWalk& w) {
  switch (w.decay) {
    case WalkDecay::none: return shaped<I, NV, WalkDecay::none>(w);
    case WalkDecay::scalar: return shaped<I, NV, WalkDecay::scalar>(w);
    case WalkDecay::rows: return shaped<I, NV, WalkDecay::rows>(w);
    case WalkDecay::columns: return shaped<I, NV, WalkDecay::columns>(w);
  }
}

template <class I, int NV, WalkDecay DEC, int NX>
void pair_walk(const DeltaPairWalk& w) {
  using V = typename I::V;
  constexpr std::ptrdiff_t L = I::L, W = L * NV;
  V c1[NV], c2[NV], y[NX > 0 ? NX : 1][NV];
  for (int n = 0; n < NV; ++n) {
    c1[n] = I::loadu(w.c1 + n * L);
    c2[n] = I::loadu(w.c2 + n * L);
    for (int j = 0; j < NX; ++j) y[j][n] = I::zero();
  }
  const V as = I::set1(w.a_scalar);
  // The operands' pointers in locals: through w, every store to the state would make the compiler
  // load them again for the next row.
  float* const S = w.S;
  const float *__restrict b1 = w.b1, *__restrict b2 = w.b2, *__restrict a_rows = w.a_rows;
  const float* __restrict x[NX > 0 ? NX : 1];
  for (int j = 0; j < NX; ++j) x[j] = w.x[j];
  const int D = w.D;
  for (int i = 0; i < D; ++i) {
    float* p = S + std::size_t(i) * W;
    V r[NV];
    const V u1 = I::set1(b1[i]);
    for (int n = 0; n < NV; ++n) r[n] = I::fma(u1, c1[n], I::loadu(p + n * L));
    if constexpr (DEC == WalkDecay::scalar)
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], as);
    if constexpr (DEC == WalkDecay::rows) {
      const V a = I::set1(a_rows[i]);
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], a);
    }
    const V u2 = I::set1(b2[i]);
    for (int n = 0; n < NV; ++n) r[n] = I::fma(u2, c2[n], r[n]);
    for (int j = 0; j < NX; ++j) {
      const V xj = I::set1(x[j][i]);
      for (int n = 0; n < NV; ++n) y[j][n] = I::fma(xj, r[n], y[j][n]);
    }
    for (int n = 0; n < NV; ++n) I::storeu(p + n * L, r[n]);
  }
  for (int j = 0; j < NX; ++j)
    for (int n = 0; n < NV; ++n) I::storeu(w.y[j] + n * L, y[j][n]);
}

template <class I, int NV, WalkDecay DEC>
void pair_readouts(const DeltaPairWalk& w) {
  switch (w.readouts) {
    case 0: return pair_walk<I, NV, DEC, 0>(w);
    case 2: return pair_walk<I, NV, DEC, 2>(w);
    case 4: return pair_walk<I, NV, DEC, 4>(w);
    default: throw std::logic_error("run_delta_pair_walk: 0, 2 or 4 readouts");
  }
}

template <class I, int NV>
void pair_decayed(const DeltaPairWalk& w) {
  switch (w.decay) {
    case WalkDecay::none: return pair_readouts<I, NV, WalkDecay::none>(w);
    case WalkDecay::scalar: return pair_readouts<I, NV, WalkDecay::scalar>(w);
    case WalkDecay::rows: return pair_readouts<I, NV, WalkDecay::rows>(w);
    case WalkDecay::columns: break;
  }
  throw std::logic_error("run_delta_pair_walk: no decay on columns");
}

}  // namespace

void run_delta_pair_walk(const DeltaPairWalk& w, Vec vec) {
  switch (vec) {
#if defined(__AVX512F__)
    case Vec::avx512: return pair_decayed<simd::Avx512, 2>(w);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return pair_decayed<simd::Avx2, 2>(w);
#endif
    default: return pair_decayed<simd::Portable, 8>(w);
  }
}

void take_exp_gates(const float* g, int T, int width, int stride, float* buf, int first, int count) {
  const int last = std::min(T, first + count);
  for (int t = first; t < last; ++t) {
    const float* gt = g + std::size_t(t) * width;
    float* out = buf + std::size_t(t - first) * stride;
#pragma omp simd
    for (int d = 0; d < width; ++d) out[d] = exp_nonpositive(gt[d]);
    for (int d = width; d < stride; ++d) out[d] = 0.0f;
  }
}

int delta_walk_width(Vec vec) {
  switch (vec) {
    case Vec::avx512: return 32;
    case Vec::avx2: return 16;
    case Vec::generic: return 8;
  }
  return 8;
}

void run_delta_walk(const DeltaWalk& w, Vec vec) {
  switch (vec) {
#if defined(__AVX512F__)
    case Vec::avx512: return decayed<simd::Avx512, 2>(w);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return decayed<simd::Avx2, 2>(w);
#endif
    default: return decayed<simd::Portable, 8>(w);
  }
}

}  // namespace lattn::cpu

// The decode step on the CPU (cpu.hpp): AVX-512 and AVX2 with a portable form (kernels/cpu/simd.hpp),
// OpenMP over the step's value heads. The state is Dk x Dv (rows: the key dim, columns: the value
// dim); a value head reads its q/k head's rows where they lie (grouped heads, problem.hpp).
//
// A value column of the state evolves alone (docs/spec.md section 1b: the decay scales rows, the delta
// rule's read-out S'^T k and its write are per column), so the walk takes the state in strips of
// columns and runs all of the step's tokens over one strip before the next: a strip stays in the
// core's cache between the tokens and between a token's two walks, and the state is streamed from
// memory once and written back once per step. The strips are narrow (32 columns, 16 on AVX2: 16
// KiB at Dk 128, in L1) for a state in the caches, as wide as the rows (128 and 32) for a state
// streamed from memory (kernel_for). Per token and strip:
//   additive: one walk, row by row: r = a_i S_i + k_i v; y += (s q_i) r; store r.
//   delta:    a read walk, u = sum (a_i k_i) S_i and y = sum (s a_i q_i) S_i (the decay folded into
//             the row weights, S' = A S never stored), then w = v - u, o = y + s beta (k.q) w, and
//             a write walk, S_i = a_i S_i + (beta k_i) w.
//   bonus:    (RWKV-6, docs/spec.md section 1g) the additive walk reading out the row before its
//             write, y += (s q_i) S_i, and o = y + s (q . (u . k)) v.
// The per-row weights of a head's tokens are made once per work item in the thread's scratch.
// DeltaProduct (docs/spec.md section 1h: n writes per token) is the delta rule's step over the
// interleaved T n writes (kernels/linear_attention/householder.hpp): q and g spread to them in
// scratch (q zero but at each token's last write, g zero but at its first), k, v and beta read in
// place, o picked back, and the snapshots from every n-th of the interleaved ones.
// A pooled step finds each sequence's states at its slot (problem.hpp, state_offset). A bf16 state
// is widened in the first token's loads and rounded in the last token's stores (simd.hpp), once per
// step; between them, a step of several tokens keeps the strip in the thread's float32 copy (in
// the core's cache: 64 KiB at Dk = Dv = 128). Memory sees the bf16 state read once and written
// once, half the float32 state's bytes, with no pass of its own for the conversion.
// Rows go two at a time into their own accumulators, so that the FMA chains do not wait on each
// other's latency.
#include "kernels/decode/cpu.hpp"

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/householder.hpp"

namespace lattn::cpu {
namespace {

// How a token scales the state's rows: not at all, all by one factor (retnet, scalar gates), or
// each row by its own (vector gates).
enum class RowDecay { none, uniform, rows };

// How far ahead a wide strip's first walk asks for its rows (prefetchw of each row's lines): 8 rows
// of 512 bytes, one 4 KiB page, which the hardware's streamers do not cross on their own. At B 64,
// H 16, D 128, T 1, cold, on Zen 5 (scripts/ab.py, 3 rounds, docs/measurements/decode.md): 3-6%
// faster than none in each of the 8 rule x decay x state-dtype cases, 16 rows between the two.
constexpr std::size_t kPrefetchRows = 8;

// Row-weight arrays per token, each Dk long: additive k, s q, a; delta a k, s a q, a, beta k.
constexpr int kRowArrays = 4;

struct HeadStep {
  int rows_k = 0, cols_v = 0;       // the state's rows (Dk) and columns (Dv)
  int tokens = 0, extra = 0;
  float* state = nullptr;           // Dk x Dv, updated in place; a bf16 state's float32 copy
  std::uint16_t* state16 = nullptr; // a bf16 state, Dk x Dv (then `state` is used for T > 1 only)
  const float* v = nullptr;         // [tokens][Dv]
  float* o = nullptr;               // [tokens][Dv]
  float* snapshots = nullptr;       // [extra][Dk][Dv]
  const float* rows = nullptr;      // [tokens][kRowArrays][Dk]
  const float* uniform = nullptr;   // [tokens] the factor of a uniform decay
  const float* coef = nullptr;      // [tokens] delta: s beta (k . q); bonus: s (q . (u . k))
};

// One token over the strip at column c0: reads the state at `from` and writes it at `to` (each
// already at c0): the same float32 array (in place), or a bf16 state read or written in the walk's
// own loads and stores (Src, Dst: float or std::uint16_t).
template <class I, int NV, bool FULL, bool DELTA, RowDecay DEC, bool BONUS, class Src, class Dst>
void walk_token(const HeadStep& h, int c0, int t, const Src* from, Dst* to) {
  using V = typename I::V;
  using M = typename I::M;
  constexpr int L = I::L;
  // A narrow strip pairs rows into two sets of accumulators (the FMA chains' latency); a wide one
  // has NV independent chains per read-out already, and no registers to spare.
  constexpr bool kPairRows = NV <= 2;
  // Dk: the rows and the row-weight arrays' length; Dv: the columns, the stride of the state's rows
  // and of v and o.
  const std::size_t Dk = std::size_t(h.rows_k), Dv = std::size_t(h.cols_v);
  M m[NV];
  for (int n = 0; n < NV; ++n) m[n] = I::mask(h.cols_v - c0 - n * L);
  auto load = [&](const auto* p, int n) __attribute__((always_inline)) { return simd::load_lanes<I, FULL>(m[n], p + std::ptrdiff_t(n) * L); };
  auto store = [&](auto* p, int n, V x) __attribute__((always_inline)) { simd::store_lanes<I, FULL>(p + std::ptrdiff_t(n) * L, m[n], x); };
  const float* w = h.rows + std::size_t(t) * kRowArrays * Dk;
  const float *x1 = w, *x2 = w + Dk, *ar = w + 2 * std::ptrdiff_t(Dk), *bk = w + 3 * std::ptrdiff_t(Dk);
  const V au = I::set1(DEC == RowDecay::uniform ? h.uniform[t] : 1.0f);
  V vv[NV], y0[NV], y1[NV];
  for (int n = 0; n < NV; ++n) {
    vv[n] = load(h.v + std::size_t(t) * Dv + c0, n);
    y0[n] = y1[n] = I::zero();
  }
  // A wide strip (a whole row) streamed from memory: its lines kPrefetchRows rows ahead asked for
  // with write intent (the walk writes them back).
  auto prefetch_row = [&](const auto* p) __attribute__((always_inline)) {
    if constexpr (kPrefetchRows > 0 && !kPairRows) {
      const char* c = reinterpret_cast<const char*>(p);
      for (int b = 0; b < NV * L * int(sizeof(*p)); b += 64) _mm_prefetch(c + b, _MM_HINT_ET0);
    }
  };
  auto decayed = [&](V r, std::size_t i) __attribute__((always_inline)) {
    if constexpr (DEC == RowDecay::uniform) return I::mul(r, au);
    if constexpr (DEC == RowDecay::rows) return I::mul(r, I::set1(ar[i]));
    return r;
  };
  if constexpr (DELTA) {
    V u0[NV], u1[NV];
    for (int n = 0; n < NV; ++n) u0[n] = u1[n] = I::zero();
    auto read = [&](std::size_t i, V* u, V* y) __attribute__((always_inline)) {
      const V a = I::set1(x1[i]), b = I::set1(x2[i]);
      for (int n = 0; n < NV; ++n) {
        const V r = load(from + i * Dv, n);
        u[n] = I::fma(a, r, u[n]);
        y[n] = I::fma(b, r, y[n]);
      }
    };
    std::size_t i = 0;
    if constexpr (kPairRows)
      for (; i + 1 < Dk; i += 2) {
        read(i, u0, y0);
        read(i + 1, u1, y1);
      }
    for (; i < Dk; ++i) {
      if (t == 0) prefetch_row(from + (i + kPrefetchRows) * Dv);
      read(i, u0, y0);
    }
    V wv[NV];
    const V c = I::set1(h.coef[t]);
    for (int n = 0; n < NV; ++n) {
      wv[n] = I::add(vv[n], I::mul(I::set1(-1.0f), I::add(u0[n], u1[n])));
      store(h.o + std::size_t(t) * Dv + c0, n, I::fma(c, wv[n], I::add(y0[n], y1[n])));
    }
    for (std::size_t r = 0; r < Dk; ++r) {
      const V b = I::set1(bk[r]);
      for (int n = 0; n < NV; ++n) store(to + r * Dv, n, I::fma(b, wv[n], decayed(load(from + r * Dv, n), r)));
    }
  } else {
    auto write = [&](std::size_t i, V* y) __attribute__((always_inline)) {
      const V a = I::set1(x1[i]), b = I::set1(x2[i]);
      for (int n = 0; n < NV; ++n) {
        const V before = load(from + i * Dv, n);
        const V r = I::fma(a, vv[n], decayed(before, i));
        store(to + i * Dv, n, r);
        y[n] = I::fma(b, BONUS ? before : r, y[n]);
      }
    };
    std::size_t i = 0;
    if constexpr (kPairRows)
      for (; i + 1 < Dk; i += 2) {
        write(i, y0);
        write(i + 1, y1);
      }
    for (; i < Dk; ++i) {
      if (t == 0) prefetch_row(from + (i + kPrefetchRows) * Dv);
      write(i, y0);
    }
    const V c = I::set1(BONUS ? h.coef[t] : 0.0f);
    for (int n = 0; n < NV; ++n)
      store(h.o + std::size_t(t) * Dv + c0, n, BONUS ? I::fma(c, vv[n], I::add(y0[n], y1[n])) : I::add(y0[n], y1[n]));
  }
  // Slot i of the snapshots (1..extra) is the state i tokens before the step's end. Never the last
  // token's, so `to` is float32 here whenever a snapshot is taken.
  const int slot = h.tokens - 1 - t;
  if (slot >= 1 && slot <= h.extra) {
    float* out = h.snapshots + std::size_t(slot - 1) * Dk * Dv + c0;
    for (std::size_t r = 0; r < Dk; ++r)
      for (int n = 0; n < NV; ++n) store(out + r * Dv, n, load(to + r * Dv, n));
  }
}

// The step's tokens over one strip. A float32 state is stepped in place. A bf16 state is read by the
// first token's walk and written by the last one's, rounded once; between them (T > 1) the strip
// lives in the thread's float32 copy (h.state), in the core's cache.
template <class I, int NV, bool FULL, bool DELTA, RowDecay DEC, bool BONUS>
void walk_strip(const HeadStep& h, int c0) {
  using std::uint16_t;
  float* work = h.state + c0;
  if (!h.state16) {
    for (int t = 0; t < h.tokens; ++t) walk_token<I, NV, FULL, DELTA, DEC, BONUS, float, float>(h, c0, t, work, work);
    return;
  }
  uint16_t* s16 = h.state16 + c0;
  const int last = h.tokens - 1;
  if (last == 0) {
    walk_token<I, NV, FULL, DELTA, DEC, BONUS, uint16_t, uint16_t>(h, c0, 0, s16, s16);
    return;
  }
  walk_token<I, NV, FULL, DELTA, DEC, BONUS, uint16_t, float>(h, c0, 0, s16, work);
  for (int t = 1; t < last; ++t) walk_token<I, NV, FULL, DELTA, DEC, BONUS, float, float>(h, c0, t, work, work);
  walk_token<I, NV, FULL, DELTA, DEC, BONUS, float, uint16_t>(h, c0, last, work, s16);
}

using StripFn = void (*)(const HeadStep&, int);

template <class I, int NV, bool DELTA, RowDecay DEC, bool BONUS = false>
void walk_strips(const HeadStep& h, int first, int last) {
  constexpr int W = I::L * NV;
  for (int s = first; s < last; ++s) {
    const int c0 = s * W;
    if (c0 + W <= h.cols_v) walk_strip<I, NV, true, DELTA, DEC, BONUS>(h, c0);
    else walk_strip<I, NV, false, DELTA, DEC, BONUS>(h, c0);
  }
}

using StripsFn = void (*)(const HeadStep&, int, int);

template <class I, int NV>
StripsFn pick(bool delta, RowDecay decay, bool bonus) {
  if (bonus) return walk_strips<I, NV, false, RowDecay::rows, true>;  // vector gates only (op.cpp)
  switch (decay) {
    case RowDecay::none: return delta ? walk_strips<I, NV, true, RowDecay::none> : walk_strips<I, NV, false, RowDecay::none>;
    case RowDecay::uniform:
      return delta ? walk_strips<I, NV, true, RowDecay::uniform> : walk_strips<I, NV, false, RowDecay::uniform>;
    case RowDecay::rows: return delta ? walk_strips<I, NV, true, RowDecay::rows> : walk_strips<I, NV, false, RowDecay::rows>;
  }
  return nullptr;
}

struct Kernel {
  StripsFn fn;
  int width;  // columns per strip
};

// A state larger than this streams from memory (it is beyond the cores' L2 caches).
constexpr std::size_t kStreamedStateBytes = std::size_t(4) << 20;

// A streamed state is walked in strips as wide as its rows (Dv columns) where the registers allow
// (128 columns on AVX-512, 32 on AVX2): the first token's walk then reads it from memory in order,
// row after row, and a strip sits in L2 rather than L1 between the walks. A state in the caches is walked in
// narrow strips (32 columns, 16 on AVX2) that stay in L1. scripts/ab.py at B 64 and B 1 (H 16,
// D 128) chose between the two (docs/performance.md, "The decode step").
Kernel kernel_for(Vec vec, const DecodeProblem& p, bool delta, RowDecay decay) {
  const bool bonus = p.bonus;
  const bool streamed = p.state_elems() * (p.state_bf16 ? 2 : sizeof(float)) > kStreamedStateBytes;
  const int cols = p.value_dim();
  switch (vec) {
#if defined(__AVX512F__)
    case Vec::avx512:
      if (streamed && cols >= 96) return {pick<simd::Avx512, 8>(delta, decay, bonus), 128};
      return {pick<simd::Avx512, 2>(delta, decay, bonus), 32};
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2:
      if (streamed && cols >= 24) return {pick<simd::Avx2, 4>(delta, decay, bonus), 32};
      return {pick<simd::Avx2, 2>(delta, decay, bonus), 16};
#endif
    default: return {pick<simd::Portable, 8>(delta, decay, bonus), 8};
  }
}

// One value head's row weights for the step's tokens (HeadStep's rows, uniform, coef), from its q/k
// head's rows (read in place: the group's value heads find them in the caches) and its own gates and
// beta.
void make_weights(const DecodeProblem& p, const DecodeArgs<float>& a, std::size_t bh, float* rows, float* uniform,
                  float* coef) {
  const int D = p.dim, T = p.tokens;
  const float s = float(attention_scale(D));
  const float gamma = float(decay_gamma(p.decay, int(bh % std::size_t(p.heads))));
  const std::size_t key_head = p.key_head(bh);
  for (int t = 0; t < T; ++t) {
    const std::size_t key_row = (key_head * T + std::size_t(t)) * std::size_t(D);
    const float *q = a.q + key_row, *k = a.k + key_row;
    float* w = rows + std::size_t(t) * kRowArrays * D;
    float *x1 = w, *x2 = w + D, *ar = w + 2 * std::ptrdiff_t(D), *bk = w + 3 * std::ptrdiff_t(D);
    uniform[t] = p.decay == Decay::scalar ? exp_nonpositive(a.g[bh * T + t]) : gamma;
    if (p.decay == Decay::vector) {
      const float* g = a.g + (bh * T + std::size_t(t)) * std::size_t(D);
      for (int i = 0; i < D; ++i) ar[i] = exp_nonpositive(g[i]);
    } else {
      for (int i = 0; i < D; ++i) ar[i] = uniform[t];
    }
    if (!p.delta()) {
      float bonus = 0;
      const float* u = p.bonus ? a.u + (bh % std::size_t(p.heads)) * std::size_t(D) : nullptr;
      for (int i = 0; i < D; ++i) {
        x1[i] = k[i];
        x2[i] = s * q[i];
        if (u) bonus += q[i] * u[i] * k[i];
      }
      coef[t] = s * bonus;
      continue;
    }
    const float beta = a.beta[bh * T + t];
    float kq = 0;
    for (int i = 0; i < D; ++i) {
      x1[i] = ar[i] * k[i];
      x2[i] = s * ar[i] * q[i];
      bk[i] = beta * k[i];
      kq += k[i] * q[i];
    }
    coef[t] = s * beta * kq;
  }
}

std::size_t weights_floats(const DecodeProblem& p) { return std::size_t(p.tokens) * (kRowArrays * std::size_t(p.dim) + 2); }

// A thread's float32 copy of a bf16 head state, Dk x Dv, for a step of several tokens.
std::size_t widened_floats(const DecodeProblem& p) { return p.state_bf16 && p.tokens > 1 ? p.head_state_elems() : 0; }

}  // namespace

namespace {

// DeltaProduct's step as one of the delta rule over the interleaved writes, and its scratch: q, g
// and o over them, and their snapshots.
DecodeProblem interleaved(const DecodeProblem& p) {
  DecodeProblem s = p;
  s.tokens = p.tokens * p.householder;
  s.snapshots = p.extra_slots() * p.householder + 1;
  s.householder = 1;
  return s;
}
std::size_t interleaved_floats(const DecodeProblem& p) {
  const DecodeProblem s = interleaved(p);
  return s.key_elems() + s.gate_elems() + s.value_elems() + s.snapshot_elems();
}

}  // namespace

std::size_t decode_step_workspace_bytes(const DecodeProblem& p, int threads) {
  if (p.dplr()) return std::size_t(std::max(threads, 1)) * decode_dplr_thread_floats(p) * sizeof(float);
  if (p.trapezoidal()) return decode_trapezoidal_workspace_bytes(p, threads);
  if (p.householder > 1)
    return interleaved_floats(p) * sizeof(float) + decode_step_workspace_bytes(interleaved(p), threads);
  return std::size_t(std::max(threads, 1)) * (weights_floats(p) + widened_floats(p)) * sizeof(float);
}

void decode_step(const DecodeProblem& p, const DecodeArgs<float>& a, Allocator& allocator) {
  if (p.dplr()) return decode_step_dplr(p, a, allocator);  // cpu/dplr.cpp
  if (p.trapezoidal()) return decode_trapezoidal_step(p, a, allocator);
  if (p.householder > 1) {
    const DecodeProblem s = interleaved(p);
    const int n = p.householder;
    Workspace<float> scratch(allocator, interleaved_floats(p));
    float* q = scratch.data();
    float* g = q + s.key_elems();
    float* o = g + s.gate_elems();
    float* snapshots = o + s.value_elems();
    const std::size_t key_rows = p.key_elems() / std::size_t(p.dim), value_rows = p.heads_total() * p.tokens;
    interleave_rows(a.q, key_rows, std::size_t(p.dim), n, n - 1, q);
    if (a.g) interleave_rows(a.g, value_rows, std::size_t(p.gate_width()), n, 0, g);
    DecodeArgs<float> steps = a;
    steps.q = q;
    steps.g = a.g ? g : nullptr;
    steps.o = o;
    steps.snapshots = s.extra_slots() > 0 ? snapshots : nullptr;
    decode_step(s, steps, allocator);
    pick_rows(o, value_rows, std::size_t(p.value_dim()), n, n - 1, a.o);
    // Slot i (i tokens before the end) is the interleaved step's slot i n.
    const std::size_t DD = p.head_state_elems();
    for (std::size_t bh = 0; bh < p.heads_total(); ++bh)
      for (int i = 1; i <= p.extra_slots(); ++i)
        std::copy_n(snapshots + (bh * s.extra_slots() + std::size_t(i * n - 1)) * DD, DD,
                    a.snapshots + (bh * p.extra_slots() + std::size_t(i - 1)) * DD);
    return;
  }
  const RowDecay decay = p.decay == Decay::none ? RowDecay::none : p.decay == Decay::vector ? RowDecay::rows : RowDecay::uniform;
  const Kernel kernel = kernel_for(active_vec(), p, p.delta(), decay);
  const int threads = omp_get_max_threads();
  const std::size_t per_thread = weights_floats(p) + widened_floats(p), DD = p.head_state_elems();
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
  const long heads = long(p.heads_total());
  const int cols = p.value_dim();
  const int strips = (cols + kernel.width - 1) / kernel.width;
  // Few heads (a single stream): a work item is one strip of a head, so that every thread has work;
  // its row weights are then made once per strip, a few percent of the strip's own work.
  const int groups = heads >= 4L * threads ? 1 : strips;
  const long items = heads * groups;
  float* base = scratch.data();
#pragma omp parallel num_threads(threads)
  {
    float* rows = base + std::size_t(omp_get_thread_num()) * per_thread;
    float* uniform = rows + std::size_t(p.tokens) * kRowArrays * p.dim;
    float* coef = uniform + p.tokens;
    float* widened = coef + p.tokens;  // a bf16 state's float32 copy (widened_floats)
#pragma omp for schedule(static)
    for (long item = 0; item < items; ++item) {
      const std::size_t bh = std::size_t(item / groups);
      const int group = int(item % groups);
      make_weights(p, a, bh, rows, uniform, coef);
      HeadStep h;
      h.rows_k = p.dim;
      h.cols_v = cols;
      h.tokens = p.tokens;
      h.extra = p.extra_slots();
      const std::size_t at = p.state_offset(bh, a.state_index);
      h.state = p.state_bf16 ? widened : a.state + at;
      h.state16 = p.state_bf16 ? a.state_bf16 + at : nullptr;
      h.v = a.v + bh * p.tokens * std::size_t(cols);
      h.o = a.o + bh * p.tokens * std::size_t(cols);
      h.snapshots = h.extra > 0 ? a.snapshots + bh * std::size_t(h.extra) * DD : nullptr;
      h.rows = rows;
      h.uniform = uniform;
      h.coef = coef;
      const int first = groups == 1 ? 0 : group, last = groups == 1 ? strips : group + 1;
      kernel.fn(h, first, last);
    }
  }
}

}  // namespace lattn::cpu

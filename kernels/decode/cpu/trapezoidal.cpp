// The trapezoidal rule's decode step on the CPU (docs/spec.md sections 1d and 1e): per value head, R
// rows per token, S = alpha_t S + beta_t K_prev^T V_prev + gamma_t K_t^T V_t and O_t = Q_t S, the
// previous token's rows coming from k_prev, v_prev for the step's first token and leaving as
// k_last, v_last. As cpu.cpp does, the state is walked in strips of columns (one register wide)
// and all of the step's tokens run over a strip before the next, so the state is read from memory
// once and written once per step; per row of a strip the walk makes the decayed row, adds the 2 R
// rank-one writes (row weights beta_t k_prev[i], gamma_t k[i] made once per token in the thread's
// scratch, the 2 R value strips in registers) and feeds the R readouts. MIMO's R readouts and
// writes are R times the flops on the same state bytes. Float32 states in place only (op.cpp
// refuses a pool or a bf16 state for this rule). Reference: kernels/decode/reference.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/decode/cpu.hpp"

namespace lattn::cpu {
namespace {

constexpr int kMaxRank = 16;  // op.cpp's largest mimo_rank

// One value head's row weights: per token 2 R rows of Dk (beta_t times the previous token's k
// rows, then gamma_t times its own) and alpha_t.
std::size_t weight_floats(const DecodeProblem& p) {
  return std::size_t(p.tokens) * (2 * std::size_t(p.rows()) * std::size_t(p.dim) + 1);
}

void make_weights(const DecodeProblem& p, const DecodeArgs<float>& a, std::size_t bh, float* w) {
  const int Dk = p.dim, T = p.tokens, R = p.rows();
  const std::size_t RK = std::size_t(R) * Dk;
  float* alpha = w + std::size_t(T) * 2 * RK;
  const float* previous = a.k_prev + bh * RK;
  for (int t = 0; t < T; ++t) {
    const std::size_t at = bh * T + std::size_t(t);
    const double lambda = 1.0 / (1.0 + std::exp(-double(a.trap[at])));
    alpha[t] = float(std::exp(double(a.g[at])));
    const float beta = float((1.0 - lambda) * a.dt[at] * alpha[t]), gamma = float(lambda * a.dt[at]);
    const float* k = a.k + (p.key_head(bh) * T + std::size_t(t)) * RK;
    float* row = w + std::size_t(t) * 2 * RK;
    for (std::size_t e = 0; e < RK; ++e) {
      row[e] = beta * previous[e];
      row[RK + e] = gamma * k[e];
    }
    previous = k;
  }
}

// All of the step's tokens over the strip of columns [c0, c0 + L) (masked past Dv when !FULL).
template <class I, bool FULL>
void walk_strip(const DecodeProblem& p, const DecodeArgs<float>& a, std::size_t bh, const float* w, int c0) {
  using V = typename I::V;
  const int Dk = p.dim, Dv = p.value_dim(), T = p.tokens, R = p.rows(), extra = p.extra_slots();
  const std::size_t RK = std::size_t(R) * Dk, RV = std::size_t(R) * Dv, DD = p.head_state_elems();
  const typename I::M m = I::mask(Dv - c0);
  const auto load = [&](const float* x) { return simd::load_lanes<I, FULL>(m, x); };
  const auto store = [&](float* x, V value) { simd::store_lanes<I, FULL>(x, m, value); };
  const float* alpha = w + std::size_t(T) * 2 * RK;
  float* S = a.state + bh * DD + c0;
  V vv[2 * kMaxRank], y[kMaxRank];
  for (int t = 0; t < T; ++t) {
    const float* vp = t == 0 ? a.v_prev + bh * RV : a.v + (bh * T + std::size_t(t - 1)) * RV;
    const float* v = a.v + (bh * T + std::size_t(t)) * RV;
    for (int r = 0; r < R; ++r) {
      vv[r] = load(vp + std::size_t(r) * Dv + c0);
      vv[R + r] = load(v + std::size_t(r) * Dv + c0);
      y[r] = I::zero();
    }
    const float* row = w + std::size_t(t) * 2 * RK;
    const float* q = a.q + (p.key_head(bh) * T + std::size_t(t)) * RK;
    const V decay = I::set1(alpha[t]);
    const int slot = T - 1 - t;
    float* snapshot = slot >= 1 && slot <= extra ? a.snapshots + (bh * extra + std::size_t(slot - 1)) * DD + c0 : nullptr;
    for (int i = 0; i < Dk; ++i) {
      V s = I::mul(load(S + std::size_t(i) * Dv), decay);
      for (int r = 0; r < 2 * R; ++r) s = I::fma(I::set1(row[std::size_t(r) * Dk + i]), vv[r], s);
      store(S + std::size_t(i) * Dv, s);
      if (snapshot) store(snapshot + std::size_t(i) * Dv, s);
      for (int r = 0; r < R; ++r) y[r] = I::fma(I::set1(q[std::size_t(r) * Dk + i]), s, y[r]);
    }
    float* o = a.o + (bh * T + std::size_t(t)) * RV + c0;
    for (int r = 0; r < R; ++r) store(o + std::size_t(r) * Dv, y[r]);
  }
}

template <class I>
void step_head(const DecodeProblem& p, const DecodeArgs<float>& a, std::size_t bh, float* w) {
  const int Dv = p.value_dim(), T = p.tokens;
  const std::size_t RK = std::size_t(p.rows()) * p.dim, RV = std::size_t(p.rows()) * Dv;
  make_weights(p, a, bh, w);
  int c0 = 0;
  for (; c0 + I::L <= Dv; c0 += I::L) walk_strip<I, true>(p, a, bh, w, c0);
  if (c0 < Dv) walk_strip<I, false>(p, a, bh, w, c0);
  const float* k = a.k + (p.key_head(bh) * T + std::size_t(T - 1)) * RK;
  std::copy_n(k, RK, a.k_last + bh * RK);
  std::copy_n(a.v + (bh * T + std::size_t(T - 1)) * RV, RV, a.v_last + bh * RV);
}

template <class I>
void step_all(const DecodeProblem& p, const DecodeArgs<float>& a, float* scratch, int threads) {
  const long heads = long(p.heads_total());
#pragma omp parallel num_threads(threads)
  {
    float* w = scratch + std::size_t(omp_get_thread_num()) * weight_floats(p);
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads; ++bh) step_head<I>(p, a, std::size_t(bh), w);
  }
}

}  // namespace

std::size_t decode_trapezoidal_workspace_bytes(const DecodeProblem& p, int threads) {
  return std::size_t(std::max(threads, 1)) * weight_floats(p) * sizeof(float);
}

void decode_trapezoidal_step(const DecodeProblem& p, const DecodeArgs<float>& a, Allocator& allocator) {
  const int threads = omp_get_max_threads();
  Workspace<float> scratch(allocator, std::size_t(threads) * weight_floats(p));
  switch (active_vec()) {
#if defined(__AVX512F__)
    case Vec::avx512: return step_all<simd::Avx512>(p, a, scratch.data(), threads);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return step_all<simd::Avx2>(p, a, scratch.data(), threads);
#endif
    default: return step_all<simd::Portable>(p, a, scratch.data(), threads);
  }
}

}  // namespace lattn::cpu

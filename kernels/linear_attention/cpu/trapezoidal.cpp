// The trapezoidal rule on the CPU (kernels/linear_attention/trapezoidal.hpp has the algebra, shared
// with the CUDA adapter; docs/kernels.md, "The trapezoidal rule"): the inner row computes the
// decayed causal sum over R rows per token, and this file the per-token rest, in three passes over
// the tokens, each parallel over (sequence, head):
//   prepare: c_t, the inner v' = (c_t / s) v (s: the inner readout's scale Dk^-1/2, which the
//            trapezoidal rule does not have, undone through v and h0), and the inner log-gates
//            (g_t on a token's first row, 0 on the others);
//   forward: hT = s hT', and each token's R x R correction of its rows' readout;
//   backward: dh0, dv and dc_t from the inner gradients, the correction's gradients (dq and dk
//            added into shared q/k rows one value head at a time), and dt's, trap's and g's from
//            dc_t and the correction's dmu_{t+1}.
// Reference: kernels/linear_attention/reference_trapezoidal.cpp; tests: tests/kernels/test_trapezoidal_cpu.cpp.
#include "kernels/linear_attention/cpu/trapezoidal.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"

namespace lattn::cpu {
namespace {

// The few vector operations of the per-token passes (contiguous rows of Dk or Dv floats).
template <class I>
struct Rows {
  static float dot(const float* a, const float* b, int n) {
    typename I::V acc = I::zero();
    int i = 0;
    for (; i + I::L <= n; i += I::L) acc = I::fma(I::loadu(a + i), I::loadu(b + i), acc);
    float lanes[I::L];
    I::storeu(lanes, acc);
    float sum = 0;
    for (int l = 0; l < I::L; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
  }
  // y += a x
  static void axpy(float* y, float a, const float* x, int n) {
    const typename I::V va = I::set1(a);
    int i = 0;
    for (; i + I::L <= n; i += I::L) I::storeu(y + i, I::fma(va, I::loadu(x + i), I::loadu(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
  }
  // y = a x (in place when y == x)
  static void scale(float* y, float a, const float* x, int n) {
    const typename I::V va = I::set1(a);
    int i = 0;
    for (; i + I::L <= n; i += I::L) I::storeu(y + i, I::mul(va, I::loadu(x + i)));
    for (; i < n; ++i) y[i] = a * x[i];
  }
};

// Token t's weights in a sequence of T tokens (mu_{t+1} 0 for the last token).
using Weights = TrapezoidalWeights<double>;
Weights weights_at(const float* dt, const float* trap, int t, int T) {
  const bool last = t + 1 >= T;
  return trapezoidal_weights<double>(dt[t], trap[t], last ? 0.0 : dt[t + 1], last ? 0.0 : trap[t + 1], last);
}

struct Sizes {
  int R, Dk, Dv;
  float s;
};

Sizes sizes_of(const Problem& p) { return {p.rows(), p.dim, p.value_dim(), float(attention_scale(p.dim))}; }

// v' = (c_t / s) v and, for R > 1, the inner log-gates; h0' = h0 / s.
template <class I>
void prepare(const Problem& p, const float* v, const float* g, const float* dt, const float* trap, const float* h0,
             float* v_inner, float* g_inner, float* h0_inner) {
  const Sizes z = sizes_of(p);
  const long slices = long(p.slices());
#pragma omp parallel for schedule(static)
  for (long index = 0; index < slices; ++index) {
    const HeadSlice h = p.slice(std::size_t(index));
    for (int t = 0; t < h.seq; ++t) {
      const float c = float(weights_at(dt + h.beta, trap + h.beta, t, h.seq).c / z.s);
      const std::size_t row = h.value + std::size_t(t) * z.R * z.Dv;
      Rows<I>::scale(v_inner + row, c, v + row, z.R * z.Dv);
      if (g_inner)
        for (int r = 0; r < z.R; ++r) g_inner[(h.gate + std::size_t(t)) * z.R + r] = r == 0 ? g[h.gate + t] : 0.0f;
    }
    Rows<I>::scale(h0_inner + h.state, 1.0f / z.s, h0 + h.state, int(p.head_state_elems()));
  }
}

// Token t's R x R products A[r][r'] = q_r . k_r' (and B[r][r'] = dO_r . v_r' where dO is given) and
// weights w[r][r'] = c_t [r' > r] - mu_{t+1} of the readout's correction.
template <class I>
void token_products(const Sizes& z, const float* q, const float* k, const float* dO, const float* v, const Weights& w,
                    double* A, double* B, double* W) {
  for (std::ptrdiff_t r = 0; r < z.R; ++r)
    for (std::ptrdiff_t r2 = 0; r2 < z.R; ++r2) {
      A[r * z.R + r2] = Rows<I>::dot(q + r * z.Dk, k + r2 * z.Dk, z.Dk);
      if (B) B[r * z.R + r2] = Rows<I>::dot(dO + r * z.Dv, v + r2 * z.Dv, z.Dv);
      W[r * z.R + r2] = trapezoidal_correction_weight(w, int(r), int(r2));
    }
}

template <class I>
void finish_forward(const Problem& p, const ForwardArgs<float>& a) {
  const Sizes z = sizes_of(p);
  const long slices = long(p.slices());
#pragma omp parallel
  {
    std::vector<double> A(std::size_t(z.R) * z.R), W(A.size());
#pragma omp for schedule(static)
    for (long index = 0; index < slices; ++index) {
      const HeadSlice h = p.slice(std::size_t(index));
      Rows<I>::scale(a.hT + h.state, z.s, a.hT + h.state, int(p.head_state_elems()));
      for (int t = 0; t < h.seq; ++t) {
        const std::size_t rk = h.key + std::size_t(t) * z.R * z.Dk, rv = h.value + std::size_t(t) * z.R * z.Dv;
        const Weights w = weights_at(a.dt + h.beta, a.trap + h.beta, t, h.seq);
        token_products<I>(z, a.q + rk, a.k + rk, nullptr, nullptr, w, A.data(), nullptr, W.data());
        for (int r = 0; r < z.R; ++r)
          for (int r2 = 0; r2 < z.R; ++r2)
            Rows<I>::axpy(a.o + rv + std::size_t(r) * z.Dv, float(W[r * z.R + r2] * A[r * z.R + r2]),
                          a.v + rv + std::size_t(r2) * z.Dv, z.Dv);
      }
    }
  }
}

template <class I>
void finish_backward(const Problem& p, const BackwardArgs<float>& a, const float* dg_inner) {
  const Sizes z = sizes_of(p);
  const int G = p.group();
  const long groups = long(p.slices()) / G;
#pragma omp parallel
  {
    std::vector<double> A(std::size_t(z.R) * z.R), B(A.size()), W(A.size());
#pragma omp for schedule(static)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {  // one after another: they share dq and dk rows
        const HeadSlice h = p.slice(std::size_t(group) * G + member);
        const float *dt = a.dt + h.beta, *trap = a.trap + h.beta;
        Rows<I>::scale(a.dh0 + h.state, 1.0f / z.s, a.dh0 + h.state, int(p.head_state_elems()));
        double dmu = 0;  // dL/dmu_t through token t - 1 (mu_0 reaches nothing)
        for (int t = 0; t < h.seq; ++t) {
          const std::size_t rk = h.key + std::size_t(t) * z.R * z.Dk, rv = h.value + std::size_t(t) * z.R * z.Dv;
          const float *q = a.q + rk, *k = a.k + rk, *v = a.v + rv, *dO = a.dO + rv;
          float *dq = a.dq + rk, *dk = a.dk + rk, *dv = a.dv + rv;
          const Weights w = weights_at(dt, trap, t, h.seq);
          // The inner gradient of v' = (c_t / s) v: dc_t from it, then dv in place.
          double dc = Rows<I>::dot(v, dv, z.R * z.Dv) / z.s;
          Rows<I>::scale(dv, float(w.c / z.s), dv, z.R * z.Dv);
          token_products<I>(z, q, k, dO, v, w, A.data(), B.data(), W.data());
          double all = 0;
          for (int r = 0; r < z.R; ++r)
            for (int r2 = 0; r2 < z.R; ++r2) {
              const std::size_t e = std::size_t(r) * z.R + r2;
              const double ab = A[e] * B[e];
              all += ab;
              if (r2 > r) dc += ab;
              Rows<I>::axpy(dq + std::size_t(r) * z.Dk, float(W[e] * B[e]), k + std::size_t(r2) * z.Dk, z.Dk);
              Rows<I>::axpy(dk + std::size_t(r2) * z.Dk, float(W[e] * B[e]), q + std::size_t(r) * z.Dk, z.Dk);
              Rows<I>::axpy(dv + std::size_t(r2) * z.Dv, float(W[e] * A[e]), dO + std::size_t(r) * z.Dv, z.Dv);
            }
          const TrapezoidalInputGrads<double> d = trapezoidal_input_grads<double>(w.lambda, dt[t], dc, dmu);
          a.ddt[h.beta + std::size_t(t)] = float(d.ddt);
          a.dtrap[h.beta + std::size_t(t)] = float(d.dtrap);
          if (dg_inner) a.dg[h.gate + std::size_t(t)] = dg_inner[(h.gate + std::size_t(t)) * z.R];
          dmu = dc - all;
        }
      }
  }
}

template <class I>
void forward(const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep, const CpuVariant& inner) {
  const Problem in = trapezoidal_inner(p);
  const bool multi = p.rows() > 1;
  Workspace<float> v_inner(m, p.value_elems()), h0_inner(m, p.state_elems()), g_inner(m, multi ? in.gate_elems() : 0);
  prepare<I>(p, a.v, a.g, a.dt, a.trap, a.h0, v_inner.data(), g_inner.data(), h0_inner.data());
  inner.forward(in, {a.q, a.k, v_inner.data(), h0_inner.data(), a.o, a.hT, multi ? g_inner.data() : a.g}, m, keep);
  finish_forward<I>(p, a);
}

template <class I>
void backward(const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept, const CpuVariant& inner) {
  const Problem in = trapezoidal_inner(p);
  const bool multi = p.rows() > 1;
  const float s = float(attention_scale(p.dim));
  Workspace<float> v_inner(m, p.value_elems()), h0_inner(m, p.state_elems()), g_inner(m, multi ? in.gate_elems() : 0);
  Workspace<float> dhT_inner(m, p.state_elems()), dg_inner(m, multi ? in.gate_elems() : 0);
  prepare<I>(p, a.v, a.g, a.dt, a.trap, a.h0, v_inner.data(), g_inner.data(), h0_inner.data());
  Rows<I>::scale(dhT_inner.data(), s, a.dhT, int(p.state_elems()));
  inner.backward(in,
                 {a.q, a.k, v_inner.data(), h0_inner.data(), a.dO, dhT_inner.data(), a.dq, a.dk, a.dv, a.dh0,
                  multi ? g_inner.data() : a.g, multi ? dg_inner.data() : a.dg},
                 m, kept);
  finish_backward<I>(p, a, multi ? dg_inner.data() : nullptr);
}

template <class F>
void on_lanes(F&& run) {
  switch (active_vec()) {
#if defined(__AVX512F__)
    case Vec::avx512: return run(simd::Avx512{});
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return run(simd::Avx2{});
#endif
    default: return run(simd::Portable{});
  }
}

std::size_t floats_bytes(std::size_t floats) { return floats * sizeof(float); }

}  // namespace

CpuVariant trapezoidal_variant(const std::string& name, const CpuVariant& inner) {
  CpuVariant row;
  row.name = name;
  row.takes = {{Rule::trapezoidal}, {Decay::scalar}, nullptr, true};
  row.forward = [inner](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep) {
    on_lanes([&](auto lanes) { forward<decltype(lanes)>(p, a, m, keep, inner); });
  };
  row.backward = [inner](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept) {
    on_lanes([&](auto lanes) { backward<decltype(lanes)>(p, a, m, kept, inner); });
  };
  // What the passes hold while the inner row runs, then the inner row's own peak.
  row.forward_workspace_bytes = [inner](const Problem& p, bool keep) {
    const Problem in = trapezoidal_inner(p);
    const std::size_t gates = p.rows() > 1 ? in.gate_elems() : 0;
    return floats_bytes(p.value_elems() + p.state_elems() + gates) + inner.forward_workspace_bytes(in, keep);
  };
  row.backward_workspace_bytes = [inner](const Problem& p, bool kept) {
    const Problem in = trapezoidal_inner(p);
    const std::size_t gates = p.rows() > 1 ? in.gate_elems() : 0;
    return floats_bytes(p.value_elems() + 2 * p.state_elems() + 2 * gates) + inner.backward_workspace_bytes(in, kept);
  };
  if (inner.kept_states_bytes)
    row.kept_states_bytes = [inner](const Problem& p) { return inner.kept_states_bytes(trapezoidal_inner(p)); };
  return row;
}

}  // namespace lattn::cpu

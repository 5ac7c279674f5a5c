// The decode step in float64, written as docs/spec.md section 1b states it: S' = A_t S, then the rule's
// write (dplr, section 1f: u = S^T b read before the decay, then S' + a u^T + k v^T; DeltaProduct,
// section 1h: the token's n delta-rule writes in turn), then o_t = s S^T q_t, with the Dk x Dv state
// and grouped heads of section 1c. Slow and plain on purpose: the kernels are checked against it, and
// tests/kernels/test_decode.cpp checks it against the linear-attention op's own reference. The bonus
// form (RWKV-6, docs/spec.md section 1g) reads o_t from the state before the token's decay and write,
// plus s (q_t . (u . k_t)) v_t.
#include "kernels/decode/reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lattn::reference {

namespace {

// The trapezoidal rule's step (docs/spec.md section 1e), R rows per token: S = alpha S +
// beta K_prev^T V_prev + gamma K_t^T V_t, O_t = Q_t S (no scale), the previous rows starting at
// k_prev, v_prev and ending as k_last, v_last.
void trapezoidal_step(const DecodeProblem& p, const DecodeArgs<double, double>& a) {
  const int Dk = p.dim, Dv = p.value_dim(), T = p.tokens, R = p.rows(), extra = p.extra_slots();
  const std::size_t DD = p.head_state_elems(), RK = std::size_t(R) * Dk, RV = std::size_t(R) * Dv;
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    double* S = a.state + bh * DD;
    const double *kp = a.k_prev + bh * RK, *vp = a.v_prev + bh * RV;
    for (int t = 0; t < T; ++t) {
      const double *q = a.q + (p.key_head(bh) * T + std::size_t(t)) * RK, *k = a.k + (p.key_head(bh) * T + std::size_t(t)) * RK;
      const double* v = a.v + (bh * T + std::size_t(t)) * RV;
      const std::size_t at = bh * T + std::size_t(t);
      const double alpha = std::exp(a.g[at]), lambda = 1.0 / (1.0 + std::exp(-a.trap[at]));
      const double gamma = lambda * a.dt[at], beta = (1.0 - lambda) * a.dt[at] * alpha;
      for (std::size_t e = 0; e < DD; ++e) S[e] *= alpha;
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < Dk; ++i)
          for (int j = 0; j < Dv; ++j)
            S[std::size_t(i) * Dv + j] += beta * kp[std::size_t(r) * Dk + i] * vp[std::size_t(r) * Dv + j] +
                                          gamma * k[std::size_t(r) * Dk + i] * v[std::size_t(r) * Dv + j];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < Dv; ++j) {
          double sum = 0;
          for (int i = 0; i < Dk; ++i) sum += S[std::size_t(i) * Dv + j] * q[std::size_t(r) * Dk + i];
          a.o[(at * R + std::size_t(r)) * Dv + j] = sum;
        }
      const int slot = T - 1 - t;
      if (slot >= 1 && slot <= extra) std::copy_n(S, DD, a.snapshots + (bh * extra + std::size_t(slot - 1)) * DD);
      kp = k, vp = v;
    }
    std::copy_n(kp, RK, a.k_last + bh * RK);
    std::copy_n(vp, RV, a.v_last + bh * RV);
  }
}

}  // namespace

void decode_step(const DecodeProblem& p, const DecodeArgs<double, double>& a) {
  if (p.trapezoidal()) return trapezoidal_step(p, a);
  const int Dk = p.dim, Dv = p.value_dim(), T = p.tokens, extra = p.extra_slots();
  const double scale = attention_scale(Dk);
  const std::size_t DD = p.head_state_elems();
  std::vector<double> decay(std::size_t(Dk), 1.0), u(std::size_t(Dv), 0.0);
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    const int head = int(bh % std::size_t(p.heads));
    double* S = a.state + bh * DD;
    for (int t = 0; t < T; ++t) {
      // q, k of the value head's q/k head; v, o, the gates and beta of the value head itself.
      const std::size_t key_row = (p.key_head(bh) * T + std::size_t(t)) * std::size_t(Dk);
      const std::size_t value_row = (bh * T + std::size_t(t)) * std::size_t(Dv);
      const std::size_t gate_row = (bh * T + std::size_t(t)) * std::size_t(Dk);
      const double* q = a.q + key_row;
      for (int i = 0; i < Dk; ++i) {
        if (p.decay == Decay::retnet) decay[i] = decay_gamma(p.decay, head);
        if (p.decay == Decay::scalar) decay[i] = std::exp(a.g[bh * T + t]);
        if (p.decay == Decay::vector) decay[i] = std::exp(a.g[gate_row + i]);
      }
      if (p.dplr()) {  // u = S^T b, read before the decay (docs/spec.md section 1f)
        const double* b = a.b + (bh * T + std::size_t(t)) * std::size_t(Dk);
        for (int j = 0; j < Dv; ++j) {
          double sum = 0;
          for (int i = 0; i < Dk; ++i) sum += S[std::size_t(i) * Dv + j] * b[i];
          u[j] = sum;
        }
      }
      if (p.bonus) {  // o_t from the state before the token, plus the bonus (docs/spec.md section 1g)
        const double* k = a.k + key_row, *v = a.v + value_row;
        const double* uh = a.u + std::size_t(head) * Dk;
        double bonus = 0;
        for (int i = 0; i < Dk; ++i) bonus += q[i] * uh[i] * k[i];
        for (int j = 0; j < Dv; ++j) {
          double sum = bonus * v[j];
          for (int i = 0; i < Dk; ++i) sum += S[std::size_t(i) * Dv + j] * q[i];
          a.o[value_row + j] = scale * sum;
        }
      }
      for (int i = 0; i < Dk; ++i)
        for (int j = 0; j < Dv; ++j) S[std::size_t(i) * Dv + j] *= decay[i];
      // DeltaProduct's writes of the token in turn (one for every other rule): k, v, beta row t n + w.
      const int n = p.householder;
      for (int w = 0; w < n; ++w) {
        const std::size_t write = std::size_t(t) * n + std::size_t(w);
        const double* k = a.k + (p.key_head(bh) * T * n + write) * std::size_t(Dk);
        const double* v = a.v + (bh * T * n + write) * std::size_t(Dv);
        if (p.dplr()) {  // S = A S + a u^T + k v^T
          const double* lo = a.a + (bh * T + std::size_t(t)) * std::size_t(Dk);
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) S[std::size_t(i) * Dv + j] += lo[i] * u[j] + k[i] * v[j];
        } else if (p.delta()) {
          // u = S'^T k: what the state predicts for k; the write moves it towards v by beta.
          for (int j = 0; j < Dv; ++j) {
            double sum = 0;
            for (int i = 0; i < Dk; ++i) sum += S[std::size_t(i) * Dv + j] * k[i];
            u[j] = sum;
          }
          const double beta = a.beta[bh * T * n + write];
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) S[std::size_t(i) * Dv + j] += beta * k[i] * (v[j] - u[j]);
        } else {
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) S[std::size_t(i) * Dv + j] += k[i] * v[j];
        }
      }
      for (int j = 0; j < Dv && !p.bonus; ++j) {
        double sum = 0;
        for (int i = 0; i < Dk; ++i) sum += S[std::size_t(i) * Dv + j] * q[i];
        a.o[value_row + j] = scale * sum;
      }
      // Slot i (1..extra) is the state i tokens before the step's end: after token T - 1 - i.
      const int slot = T - 1 - t;
      if (slot >= 1 && slot <= extra) {
        double* out = a.snapshots + (bh * extra + std::size_t(slot - 1)) * DD;
        for (std::size_t e = 0; e < DD; ++e) out[e] = S[e];
      }
    }
  }
}

}  // namespace lattn::reference

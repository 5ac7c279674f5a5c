// The decode step in float64, written as docs/spec.md section 1b states it: S' = A_t S, then the rule's
// write, then o_t = s S^T q_t, with the Dk x Dv state and grouped heads of section 1c. Slow and plain
// on purpose: the kernels are checked against it, and tests/kernels/test_decode.cpp checks it against the
// linear-attention op's own reference. The bonus form (RWKV-6, docs/spec.md section 1e) reads o_t from
// the state before the token's decay and write, plus s (q_t . (u . k_t)) v_t.
#include "kernels/decode/reference.hpp"

#include <cmath>
#include <vector>

namespace lattn::reference {

void decode_step(const DecodeProblem& p, const DecodeArgs<double, double>& a) {
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
      if (p.bonus) {
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
        if (p.delta()) {
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

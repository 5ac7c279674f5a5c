// The decode step in float64, written as docs/spec.md section 1b states it: S' = A_t S, then the rule's
// write, then o_t = s S^T q_t. Slow and plain on purpose: the kernels are checked against it, and
// tests/test_decode.cpp checks it against the linear-attention op's own reference.
#include "kernels/decode/reference.hpp"

#include <cmath>
#include <vector>

namespace lattn::reference {

void decode_step(const DecodeProblem& p, const DecodeArgs<double, double>& a) {
  const int D = p.dim, T = p.tokens, extra = p.extra_slots();
  const double scale = attention_scale(D);
  const std::size_t DD = p.head_state_elems();
  std::vector<double> decay(std::size_t(D), 1.0), u(std::size_t(D), 0.0);
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    const int head = int(bh % std::size_t(p.heads));
    double* S = a.state + bh * DD;
    for (int t = 0; t < T; ++t) {
      const std::size_t row = (bh * T + t) * std::size_t(D);
      const double *q = a.q + row, *k = a.k + row, *v = a.v + row;
      for (int i = 0; i < D; ++i) {
        if (p.decay == Decay::retnet) decay[i] = decay_gamma(p.decay, head);
        if (p.decay == Decay::scalar) decay[i] = std::exp(a.g[bh * T + t]);
        if (p.decay == Decay::vector) decay[i] = std::exp(a.g[row + i]);
      }
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) S[std::size_t(i) * D + j] *= decay[i];
      if (p.delta()) {
        // u = S'^T k: what the state predicts for k; the write moves it towards v by beta.
        for (int j = 0; j < D; ++j) {
          double sum = 0;
          for (int i = 0; i < D; ++i) sum += S[std::size_t(i) * D + j] * k[i];
          u[j] = sum;
        }
        const double beta = a.beta[bh * T + t];
        for (int i = 0; i < D; ++i)
          for (int j = 0; j < D; ++j) S[std::size_t(i) * D + j] += beta * k[i] * (v[j] - u[j]);
      } else {
        for (int i = 0; i < D; ++i)
          for (int j = 0; j < D; ++j) S[std::size_t(i) * D + j] += k[i] * v[j];
      }
      for (int j = 0; j < D; ++j) {
        double sum = 0;
        for (int i = 0; i < D; ++i) sum += S[std::size_t(i) * D + j] * q[i];
        a.o[row + j] = scale * sum;
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

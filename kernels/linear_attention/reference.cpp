// Float64 scan form of causal linear attention (SPEC section 1), written for clarity: it is the
// reference every backend is checked against, so it follows the recurrences literally.
//
//   S_t  = gamma S_{t-1} + k_t v_t^T,   o_t = s S_t^T q_t
//   G_t  = gamma G_{t+1} + s q_t do_t^T (G_T = dhT + s q_T do_T^T)
//   dq_t = s S_t do_t,  dk_t = G_t v_t,  dv_t = G_t^T k_t,  dh0 = gamma G_1
//
// The outer loops poll the run's stop request (core/cancel.hpp) once per token: at seq 262144 the
// float64 pass takes tens of seconds, and a SIGTERM must not wait for it. A stopped pass leaves
// its outputs unfinished and throws Interrupted once out of the OpenMP region.
#include "kernels/linear_attention/reference.hpp"

#include <algorithm>
#include <vector>

#include "core/cancel.hpp"

namespace lattn::reference {

void forward(const Problem& p, const ForwardArgs<double>& a) {
  const int T = p.seq, D = p.dim;
  const double s = attention_scale(D);
  const long heads_total = long(p.heads_total());
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < heads_total; ++bh) {
    const double gamma = decay_gamma(p.decay, int(bh % p.heads));
    const double* q = a.q + bh * p.head_token_elems();
    const double* k = a.k + bh * p.head_token_elems();
    const double* v = a.v + bh * p.head_token_elems();
    double* o = a.o + bh * p.head_token_elems();
    double* S = a.hT + bh * p.head_state_elems();
    std::copy_n(a.h0 + bh * p.head_state_elems(), p.head_state_elems(), S);
    for (int t = 0; t < T && !stop_requested(); ++t) {
      const double* qt = q + std::size_t(t) * D;
      const double* kt = k + std::size_t(t) * D;
      const double* vt = v + std::size_t(t) * D;
      double* ot = o + std::size_t(t) * D;
      std::fill_n(ot, D, 0.0);
      for (int i = 0; i < D; ++i) {
        double* row = S + std::size_t(i) * D;
        for (int j = 0; j < D; ++j) {
          row[j] = gamma * row[j] + kt[i] * vt[j];
          ot[j] += qt[i] * row[j];
        }
      }
      for (int j = 0; j < D; ++j) ot[j] *= s;
    }
  }
  throw_if_stop_requested();
}

void backward(const Problem& p, const BackwardArgs<double>& a) {
  const int T = p.seq, D = p.dim;
  const double s = attention_scale(D);
  const long heads_total = long(p.heads_total());
#pragma omp parallel
  {
    std::vector<double> S(p.head_state_elems());
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const double gamma = decay_gamma(p.decay, int(bh % p.heads));
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const double *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      double *dq = a.dq + tok, *dk = a.dk + tok, *dv = a.dv + tok;

      std::copy_n(a.h0 + st, p.head_state_elems(), S.begin());
      for (int t = 0; t < T && !stop_requested(); ++t) {
        const std::size_t r = std::size_t(t) * D;
        for (int i = 0; i < D; ++i) {
          double* row = S.data() + std::size_t(i) * D;
          double acc = 0;
          for (int j = 0; j < D; ++j) {
            row[j] = gamma * row[j] + k[r + i] * v[r + j];
            acc += row[j] * dO[r + j];
          }
          dq[r + i] = s * acc;
        }
      }

      double* G = a.dh0 + st;  // G lives in dh0's storage and becomes dh0 at the end
      std::copy_n(a.dhT + st, p.head_state_elems(), G);
      for (int t = T - 1; t >= 0 && !stop_requested(); --t) {
        const std::size_t r = std::size_t(t) * D;
        const double carry = t == T - 1 ? 1.0 : gamma;
        std::fill_n(dv + r, D, 0.0);
        for (int i = 0; i < D; ++i) {
          double* row = G + std::size_t(i) * D;
          double acc = 0;
          for (int j = 0; j < D; ++j) {
            row[j] = carry * row[j] + s * q[r + i] * dO[r + j];
            acc += row[j] * v[r + j];
            dv[r + j] += row[j] * k[r + i];
          }
          dk[r + i] = acc;
        }
      }
      for (std::size_t e = 0; e < p.head_state_elems(); ++e) G[e] *= gamma;
    }
  }
  throw_if_stop_requested();
}

}  // namespace lattn::reference

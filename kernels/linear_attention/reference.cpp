// Float64 scan form of causal linear attention (docs/spec.md sections 1 and 1b, both rules), written
// for clarity: it is the reference every backend is checked against, so it follows the
// recurrences literally. With A_t the decay before token t (gamma for retnet, exp(g_t) for scalar
// gates, diag(exp(g_t)) for vector gates, 1 for none), S'_t = A_t S_{t-1} and tokens t = 0 .. T-1:
//
//   additive: S_t = S'_t + k_t v_t^T
//   delta:    S_t = S'_t + k_t w_t^T,  w_t = beta_t (v_t - u_t),  u_t = S'_t^T k_t
//   S_{-1} = h0,   o_t = s S_t^T q_t,   hT = S_{T-1}
//
// Backward, G_t = dL/dS_t and P_t = dL/dS'_t:
//   G_t  = s q_t do_t^T + A_{t+1} P_{t+1}   (G_{T-1} = dhT + s q_{T-1} do_{T-1}^T),  dh0 = A_0 P_0
//   additive: P_t = G_t,  dk_t = G_t v_t,  dv_t = G_t^T k_t
//   delta:    dw_t = G_t^T k_t,  dv_t = beta_t dw_t,  dbeta_t = dw_t . (v_t - u_t),
//             dk_t = G_t w_t - beta_t S'_t dw_t,  P_t = G_t - beta_t k_t dw_t^T
//   dq_t = s S_t do_t,  dg_t[i] = sum_j P_t[i][j] S'_t[i][j]  (vector gates; scalar gates sum over i)
// (docs/kernels.md derives the delta rule's lines; tests/test_reference.cpp holds all of them to
// central finite differences.)
//
// dg needs the state before each token while G runs in reverse. The states are not stored per
// token: the forward keeps one every L = ceil(sqrt(T)) tokens, and the reverse sweep recomputes a
// segment of L states from its checkpoint before walking it, so memory is O(sqrt(T) D^2) per
// thread and the work about three forward passes.
//
// The loops poll the run's stop request (core/cancel.hpp) once per token: at seq 262144 the
// float64 pass takes tens of seconds, and a SIGTERM must not wait for it. A stopped pass leaves
// its outputs unfinished and throws Interrupted once out of the OpenMP region.
#include "kernels/linear_attention/reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"

namespace lattn::reference {
namespace {

// A_t's factor for state row i of one head.
struct Decays {
  Decay decay;
  double gamma;     // retnet's (1 for none)
  const double* g;  // this head's log-gates: [T] scalar, [T][D] vector
  int D;

  double operator()(int t, int i) const {
    switch (decay) {
      case Decay::scalar: return std::exp(g[t]);
      case Decay::vector: return std::exp(g[std::size_t(t) * D + i]);
      default: return gamma;
    }
  }
};

Decays head_decays(const Problem& p, const double* g, long bh) {
  return {p.decay, decay_gamma(p.decay, int(bh % p.heads)), g ? g + bh * p.head_gate_elems() : nullptr, p.dim};
}

// S <- A_t S + k_t w_t^T for one token (S is D x D): w = v (additive), or w_t = beta_t (v_t -
// (A_t S)^T k_t) (delta; beta null for additive). `w` (D doubles) receives w_t.
void step(double* S, const Decays& A, int t, const double* kt, const double* vt, const double* beta, double* w,
          int D) {
  for (int i = 0; i < D; ++i) {
    const double a = A(t, i);
    double* row = S + std::size_t(i) * D;
    for (int j = 0; j < D; ++j) row[j] *= a;
  }
  for (int j = 0; j < D; ++j) w[j] = beta ? 0.0 : vt[j];
  if (beta) {  // u = S'^T k, summed row by row (the rows are contiguous), then w = beta (v - u)
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) w[j] += S[std::size_t(i) * D + j] * kt[i];
    for (int j = 0; j < D; ++j) w[j] = beta[t] * (vt[j] - w[j]);
  }
  for (int i = 0; i < D; ++i) {
    double* row = S + std::size_t(i) * D;
    for (int j = 0; j < D; ++j) row[j] += kt[i] * w[j];
  }
}

}  // namespace

void forward(const Problem& p, const ForwardArgs<double>& a) {
  const int T = p.seq, D = p.dim;
  const double s = attention_scale(D);
  const long heads_total = long(p.heads_total());
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < heads_total; ++bh) {
    const Decays A = head_decays(p, a.g, bh);
    const double* q = a.q + bh * p.head_token_elems();
    const double* k = a.k + bh * p.head_token_elems();
    const double* v = a.v + bh * p.head_token_elems();
    double* o = a.o + bh * p.head_token_elems();
    const double* beta = a.beta ? a.beta + bh * T : nullptr;
    double* S = a.hT + bh * p.head_state_elems();
    std::vector<double> w(D);
    std::copy_n(a.h0 + bh * p.head_state_elems(), p.head_state_elems(), S);
    for (int t = 0; t < T && !stop_requested(); ++t) {
      const std::size_t r = std::size_t(t) * D;
      step(S, A, t, k + r, v + r, beta, w.data(), D);
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (int i = 0; i < D; ++i) acc += q[r + i] * S[std::size_t(i) * D + j];
        o[r + j] = s * acc;
      }
    }
  }
  throw_if_stop_requested();
}

void backward(const Problem& p, const BackwardArgs<double>& a) {
  const int T = p.seq, D = p.dim;
  const std::size_t DD = p.head_state_elems();
  const double s = attention_scale(D);
  const int L = int(std::ceil(std::sqrt(double(T))));
  const int segments = (T + L - 1) / L;
  const long heads_total = long(p.heads_total());
#pragma omp parallel
  {
    std::vector<double> checkpoints(std::size_t(segments) * DD);  // S_{t0 - 1} of each segment
    std::vector<double> states(std::size_t(L + 1) * DD);           // S_{t0 - 1} .. S_{t1 - 1}
    std::vector<double> w(D), dw(D), e(D), decayed(DD);
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const Decays A = head_decays(p, a.g, bh);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * DD;
      const double *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      const double* beta = a.beta ? a.beta + bh * T : nullptr;
      double *dq = a.dq + tok, *dk = a.dk + tok, *dv = a.dv + tok;
      double* dg = a.dg ? a.dg + bh * p.head_gate_elems() : nullptr;
      if (dg) std::fill_n(dg, p.head_gate_elems(), 0.0);

      std::vector<double> S(a.h0 + st, a.h0 + st + DD);
      for (int t = 0; t < T && !stop_requested(); ++t) {
        if (t % L == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + std::ptrdiff_t(t / L) * DD);
        step(S.data(), A, t, k + std::size_t(t) * D, v + std::size_t(t) * D, beta, w.data(), D);
      }

      double* G = a.dh0 + st;  // P_{t+1}, then G_t, in dh0's storage; dh0 = A_0 P_0 at the end
      std::copy_n(a.dhT + st, DD, G);
      for (int seg = segments - 1; seg >= 0 && !stop_requested(); --seg) {
        const int t0 = seg * L, t1 = std::min(T, t0 + L);
        std::copy_n(checkpoints.begin() + std::ptrdiff_t(seg) * DD, DD, states.begin());
        for (int t = t0; t < t1; ++t) {
          double* next = states.data() + std::size_t(t - t0 + 1) * DD;
          std::copy_n(next - DD, DD, next);
          step(next, A, t, k + std::size_t(t) * D, v + std::size_t(t) * D, beta, w.data(), D);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const std::size_t r = std::size_t(t) * D;
          const double* before = states.data() + std::size_t(t - t0) * DD;  // S_{t-1}
          const double* after = before + DD;                                 // S_t
          for (int i = 0; i < D; ++i) {  // S'_t, and G_t from P_{t+1}
            const double carry = t == T - 1 ? 1.0 : A(t + 1, i), a_t = A(t, i);
            for (int j = 0; j < D; ++j) {
              const std::size_t e = std::size_t(i) * D + j;
              decayed[e] = a_t * before[e];
              G[e] = carry * G[e] + s * q[r + i] * dO[r + j];
            }
          }
          for (int i = 0; i < D; ++i) {
            double acc = 0;
            for (int j = 0; j < D; ++j) acc += after[std::size_t(i) * D + j] * dO[r + j];
            dq[r + i] = s * acc;
          }
          // w_t (v for additive), u_t = S'^T k_t (into e) and dw_t = G_t^T k_t, summed row by row.
          std::fill(e.begin(), e.end(), 0.0);
          std::fill(dw.begin(), dw.end(), 0.0);
          for (int i = 0; i < D; ++i)
            for (int j = 0; j < D; ++j) {
              e[j] += decayed[std::size_t(i) * D + j] * k[r + i];
              dw[j] += G[std::size_t(i) * D + j] * k[r + i];
            }
          for (int j = 0; j < D; ++j) {
            e[j] = v[r + j] - e[j];  // v_t - u_t
            w[j] = beta ? beta[t] * e[j] : v[r + j];
            dv[r + j] = beta ? beta[t] * dw[j] : dw[j];
          }
          if (beta) {
            double db = 0;
            for (int j = 0; j < D; ++j) db += dw[j] * e[j];
            a.dbeta[bh * T + t] = db;
          }
          for (int i = 0; i < D; ++i) {
            double acc = 0;
            for (int j = 0; j < D; ++j) {
              acc += G[std::size_t(i) * D + j] * w[j];
              if (beta) acc -= beta[t] * decayed[std::size_t(i) * D + j] * dw[j];
            }
            dk[r + i] = acc;
          }
          if (beta)  // P_t = G_t - beta_t k_t dw_t^T
            for (int i = 0; i < D; ++i)
              for (int j = 0; j < D; ++j) G[std::size_t(i) * D + j] -= beta[t] * k[r + i] * dw[j];
          if (dg)
            for (int i = 0; i < D; ++i) {
              double acc = 0;
              for (int j = 0; j < D; ++j) acc += G[std::size_t(i) * D + j] * decayed[std::size_t(i) * D + j];
              if (p.decay == Decay::vector) dg[r + i] = acc;
              else dg[t] += acc;
            }
        }
      }
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) G[std::size_t(i) * D + j] *= A(0, i);
    }
  }
  throw_if_stop_requested();
}

}  // namespace lattn::reference

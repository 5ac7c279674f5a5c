// Float64 scan form of causal linear attention (SPEC sections 1 and 1b, additive rule), written
// for clarity: it is the reference every backend is checked against, so it follows the
// recurrences literally. With A_t the decay before token t (gamma for retnet, exp(g_t) for scalar
// gates, diag(exp(g_t)) for vector gates, 1 for none) and tokens t = 0 .. T-1:
//
//   S_t  = A_t S_{t-1} + k_t v_t^T  (S_{-1} = h0),   o_t = s S_t^T q_t,   hT = S_{T-1}
//   G_t  = dL/dS_t = s q_t do_t^T + A_{t+1} G_{t+1}   (G_{T-1} = dhT + s q_{T-1} do_{T-1}^T)
//   dq_t = s S_t do_t,  dk_t = G_t v_t,  dv_t = G_t^T k_t,  dh0 = A_0 G_0
//   dg_t[i] = sum_j G_t[i][j] (A_t S_{t-1})[i][j]    (vector gates; scalar gates sum over i too)
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

// S <- A_t S + k_t v_t^T for one token (S is D x D).
void step(double* S, const Decays& A, int t, const double* kt, const double* vt, int D) {
  for (int i = 0; i < D; ++i) {
    const double a = A(t, i);
    double* row = S + std::size_t(i) * D;
    for (int j = 0; j < D; ++j) row[j] = a * row[j] + kt[i] * vt[j];
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
    double* S = a.hT + bh * p.head_state_elems();
    std::copy_n(a.h0 + bh * p.head_state_elems(), p.head_state_elems(), S);
    for (int t = 0; t < T && !stop_requested(); ++t) {
      const std::size_t r = std::size_t(t) * D;
      step(S, A, t, k + r, v + r, D);
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
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const Decays A = head_decays(p, a.g, bh);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * DD;
      const double *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      double *dq = a.dq + tok, *dk = a.dk + tok, *dv = a.dv + tok;
      double* dg = a.dg ? a.dg + bh * p.head_gate_elems() : nullptr;
      if (dg) std::fill_n(dg, p.head_gate_elems(), 0.0);

      std::vector<double> S(a.h0 + st, a.h0 + st + DD);
      for (int t = 0; t < T && !stop_requested(); ++t) {
        if (t % L == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + std::ptrdiff_t(t / L) * DD);
        step(S.data(), A, t, k + std::size_t(t) * D, v + std::size_t(t) * D, D);
      }

      double* G = a.dh0 + st;  // G lives in dh0's storage and becomes dh0 at the end
      std::copy_n(a.dhT + st, DD, G);
      for (int seg = segments - 1; seg >= 0 && !stop_requested(); --seg) {
        const int t0 = seg * L, t1 = std::min(T, t0 + L);
        std::copy_n(checkpoints.begin() + std::ptrdiff_t(seg) * DD, DD, states.begin());
        for (int t = t0; t < t1; ++t) {
          double* next = states.data() + std::size_t(t - t0 + 1) * DD;
          std::copy_n(next - DD, DD, next);
          step(next, A, t, k + std::size_t(t) * D, v + std::size_t(t) * D, D);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const std::size_t r = std::size_t(t) * D;
          const double* before = states.data() + std::size_t(t - t0) * DD;  // S_{t-1}
          const double* after = before + DD;                                 // S_t
          std::fill_n(dv + r, D, 0.0);
          for (int i = 0; i < D; ++i) {
            const double carry = t == T - 1 ? 1.0 : A(t + 1, i);
            const double a_t = A(t, i);
            double* row = G + std::size_t(i) * D;
            double acc_k = 0, acc_q = 0, acc_g = 0;
            for (int j = 0; j < D; ++j) {
              row[j] = carry * row[j] + s * q[r + i] * dO[r + j];
              acc_k += row[j] * v[r + j];
              dv[r + j] += row[j] * k[r + i];
              acc_q += after[std::size_t(i) * D + j] * dO[r + j];
              acc_g += row[j] * a_t * before[std::size_t(i) * D + j];
            }
            dk[r + i] = acc_k;
            dq[r + i] = s * acc_q;
            if (p.decay == Decay::vector) dg[r + i] = acc_g;
            if (p.decay == Decay::scalar) dg[t] += acc_g;
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

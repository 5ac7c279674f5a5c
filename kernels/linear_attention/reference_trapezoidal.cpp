// Float64 scan form of the trapezoidal rule (Mamba-3, docs/spec.md section 1e), written for clarity:
// the ground truth every trapezoidal kernel is checked against. Per (sequence, value head), tokens
// t = 0 .. T-1, each with R rows (the MIMO rank; 1 is SISO): Q_t, K_t (R x Dk), V_t (R x Dv), and
//
//   alpha_t = exp(g_t),  lambda_t = sigmoid(trap_t),  gamma_t = lambda_t dt_t,
//   beta_t  = (1 - lambda_t) dt_t alpha_t
//   S_t = alpha_t S_{t-1} + beta_t K_{t-1}^T V_{t-1} + gamma_t K_t^T V_t      (K_{-1} V_{-1} = 0)
//   S_{-1} = h0,  O_t = Q_t S_t (R x Dv, no scale),  hT = S_{T-1}
//
// Backward, G_t = dL/dS_t:
//   G_t  = Q_t^T dO_t + alpha_{t+1} G_{t+1}   (G_{T-1} = dhT + Q^T dO),   dh0 = alpha_0 G_0
//   E_t  = gamma_t G_t + beta_{t+1} G_{t+1}   (the weight K_t^T V_t has in S_t and S_{t+1})
//   dQ_t = dO_t S_t^T,  dK_t = V_t E_t^T,  dV_t = K_t E_t
//   with dgamma_t = <G_t, K_t^T V_t>, dbeta_t = <G_t, K_{t-1}^T V_{t-1}>, dalpha_t = <G_t, S_{t-1}>:
//   dg_t    = alpha_t dalpha_t + beta_t dbeta_t
//   ddt_t   = lambda_t dgamma_t + (1 - lambda_t) alpha_t dbeta_t
//   dtrap_t = lambda_t (1 - lambda_t) dt_t (dgamma_t - alpha_t dbeta_t)
// (tests/kernels/test_trapezoidal.cpp holds every line to central finite differences.)
//
// As reference.cpp does for the other rules, the backward keeps one state every L = ceil(sqrt(T))
// tokens and recomputes a segment of states from its checkpoint before walking it in reverse:
// memory O(sqrt(T) Dk Dv) per thread. Shapes (grouped heads, Dk x Dv, packed documents) come from
// Problem::slice; a packed document starts from its own h0 with no previous token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"
#include "kernels/linear_attention/reference.hpp"

namespace lattn::reference {
namespace {

struct Weights {
  double alpha, lambda, gamma, beta;
};

Weights weights_at(const double* g, const double* dt, const double* trap, int t) {
  const double alpha = std::exp(g[t]), lambda = 1.0 / (1.0 + std::exp(-trap[t]));
  return {alpha, lambda, lambda * dt[t], (1.0 - lambda) * dt[t] * alpha};
}

// S += w K^T V over the R rows of one token (K: R x Dk, V: R x Dv).
void add_write(double* S, double w, const double* K, const double* V, int R, int Dk, int Dv) {
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < Dk; ++i) {
      const double ki = w * K[std::size_t(r) * Dk + i];
      double* row = S + std::size_t(i) * Dv;
      for (int j = 0; j < Dv; ++j) row[j] += ki * V[std::size_t(r) * Dv + j];
    }
}

// S_t from S_{t-1} in place: token t's rows at K, V; the previous token's at Kp, Vp (null at t = 0).
void step(double* S, const Weights& w, const double* Kp, const double* Vp, const double* K, const double* V, int R,
          int Dk, int Dv) {
  for (std::size_t e = 0; e < std::size_t(Dk) * Dv; ++e) S[e] *= w.alpha;
  if (Kp) add_write(S, w.beta, Kp, Vp, R, Dk, Dv);
  add_write(S, w.gamma, K, V, R, Dk, Dv);
}

// <G, K^T V> over the R rows of one token.
double write_inner(const double* G, const double* K, const double* V, int R, int Dk, int Dv) {
  double sum = 0;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < Dk; ++i) {
      double acc = 0;
      for (int j = 0; j < Dv; ++j) acc += G[std::size_t(i) * Dv + j] * V[std::size_t(r) * Dv + j];
      sum += K[std::size_t(r) * Dk + i] * acc;
    }
  return sum;
}

}  // namespace

void trapezoidal_forward(const Problem& p, const ForwardArgs<double>& a) {
  const int Dk = p.dim, Dv = p.value_dim(), R = p.rows();
  const long slices = long(p.slices());
#pragma omp parallel for schedule(static)
  for (long index = 0; index < slices; ++index) {
    const HeadSlice h = p.slice(std::size_t(index));
    const double *q = a.q + h.key, *k = a.k + h.key, *v = a.v + h.value;
    const double *g = a.g + h.gate, *dt = a.dt + h.beta, *trap = a.trap + h.beta;
    double* o = a.o + h.value;
    double* S = a.hT + h.state;
    std::copy_n(a.h0 + h.state, p.head_state_elems(), S);
    for (int t = 0; t < h.seq && !stop_requested(); ++t) {
      const std::size_t rk = std::size_t(t) * R * Dk, rv = std::size_t(t) * R * Dv;
      step(S, weights_at(g, dt, trap, t), t ? k + rk - std::size_t(R) * Dk : nullptr,
           t ? v + rv - std::size_t(R) * Dv : nullptr, k + rk, v + rv, R, Dk, Dv);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < Dv; ++j) {
          double acc = 0;
          for (int i = 0; i < Dk; ++i) acc += q[rk + std::size_t(r) * Dk + i] * S[std::size_t(i) * Dv + j];
          o[rv + std::size_t(r) * Dv + j] = acc;
        }
    }
  }
  throw_if_stop_requested();
}

void trapezoidal_backward(const Problem& p, const BackwardArgs<double>& a) {
  const int Dk = p.dim, Dv = p.value_dim(), R = p.rows(), G = p.group();
  const std::size_t DD = p.head_state_elems(), RK = std::size_t(R) * Dk, RV = std::size_t(R) * Dv;
  const Segments segmented = sqrt_segments(p);
  const int L = segmented.length, segments = segmented.count;
  // Work items are (sequence, q/k head): its value heads run one after another on one thread,
  // adding their dq and dk into the shared rows.
  const long groups = long(p.slices()) / G;
#pragma omp parallel
  {
    std::vector<double> checkpoints(std::size_t(segments) * DD);  // S_{t0 - 1} of each segment
    std::vector<double> states(std::size_t(L + 1) * DD);           // S_{t0 - 1} .. S_{t1 - 1}
    std::vector<double> current(DD), next(DD), E(DD);               // G_t, G_{t+1}, E_t
#pragma omp for schedule(static)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {
        const HeadSlice h = p.slice(std::size_t(group) * G + member);
        const int T = h.seq;
        const double *q = a.q + h.key, *k = a.k + h.key, *v = a.v + h.value, *dO = a.dO + h.value;
        const double *g = a.g + h.gate, *dt = a.dt + h.beta, *trap = a.trap + h.beta;
        double *dq = a.dq + h.key, *dk = a.dk + h.key, *dv = a.dv + h.value;
        if (member == 0) {
          std::fill_n(dq, std::size_t(T) * RK, 0.0);
          std::fill_n(dk, std::size_t(T) * RK, 0.0);
        }
        const auto previous = [&](const double* x, std::size_t width, int t) { return t ? x + (t - 1) * width : nullptr; };
        const auto advance = [&](double* S, int t) {
          step(S, weights_at(g, dt, trap, t), previous(k, RK, t), previous(v, RV, t), k + t * RK, v + t * RV, R, Dk, Dv);
        };

        std::vector<double> S(a.h0 + h.state, a.h0 + h.state + DD);
        for (int t = 0; t < T && !stop_requested(); ++t) {
          if (t % L == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + std::ptrdiff_t(t / L) * DD);
          advance(S.data(), t);
        }

        std::fill(next.begin(), next.end(), 0.0);  // G_{t+1}; zero past the end
        const int segs = (T + L - 1) / L;
        for (int seg = segs - 1; seg >= 0 && !stop_requested(); --seg) {
          const int t0 = seg * L, t1 = std::min(T, t0 + L);
          std::copy_n(checkpoints.begin() + std::ptrdiff_t(seg) * DD, DD, states.begin());
          for (int t = t0; t < t1; ++t) {
            double* after = states.data() + std::size_t(t - t0 + 1) * DD;
            std::copy_n(after - DD, DD, after);
            advance(after, t);
          }
          for (int t = t1 - 1; t >= t0; --t) {
            const Weights w = weights_at(g, dt, trap, t);
            const bool last = t == T - 1;
            const Weights later = last ? Weights{0, 0, 0, 0} : weights_at(g, dt, trap, t + 1);
            const double* before = states.data() + std::size_t(t - t0) * DD;  // S_{t-1}
            const double* after = before + DD;                                 // S_t
            const double *qt = q + t * RK, *kt = k + t * RK, *vt = v + t * RV, *dOt = dO + t * RV;
            for (std::size_t e = 0; e < DD; ++e) current[e] = last ? a.dhT[h.state + e] : later.alpha * next[e];
            for (int r = 0; r < R; ++r)
              for (int i = 0; i < Dk; ++i)
                for (int j = 0; j < Dv; ++j)
                  current[std::size_t(i) * Dv + j] += qt[std::size_t(r) * Dk + i] * dOt[std::size_t(r) * Dv + j];
            for (std::size_t e = 0; e < DD; ++e) E[e] = w.gamma * current[e] + later.beta * next[e];
            for (int r = 0; r < R; ++r) {
              for (int i = 0; i < Dk; ++i) {
                double sq = 0, sk = 0;
                for (int j = 0; j < Dv; ++j) {
                  sq += dOt[std::size_t(r) * Dv + j] * after[std::size_t(i) * Dv + j];
                  sk += vt[std::size_t(r) * Dv + j] * E[std::size_t(i) * Dv + j];
                }
                dq[t * RK + std::size_t(r) * Dk + i] += sq;
                dk[t * RK + std::size_t(r) * Dk + i] += sk;
              }
              for (int j = 0; j < Dv; ++j) {
                double acc = 0;
                for (int i = 0; i < Dk; ++i) acc += kt[std::size_t(r) * Dk + i] * E[std::size_t(i) * Dv + j];
                dv[t * RV + std::size_t(r) * Dv + j] = acc;
              }
            }
            const double dgamma = write_inner(current.data(), kt, vt, R, Dk, Dv);
            const double dbeta = t ? write_inner(current.data(), kt - RK, vt - RV, R, Dk, Dv) : 0.0;
            double dalpha = 0;
            for (std::size_t e = 0; e < DD; ++e) dalpha += current[e] * before[e];
            a.dg[h.gate + std::size_t(t)] = w.alpha * dalpha + w.beta * dbeta;
            a.ddt[h.beta + std::size_t(t)] = w.lambda * dgamma + (1.0 - w.lambda) * w.alpha * dbeta;
            a.dtrap[h.beta + std::size_t(t)] = w.lambda * (1.0 - w.lambda) * dt[t] * (dgamma - w.alpha * dbeta);
            std::swap(current, next);
          }
        }
        const double alpha0 = T > 0 ? std::exp(g[0]) : 1.0;
        for (std::size_t e = 0; e < DD; ++e) a.dh0[h.state + e] = T > 0 ? alpha0 * next[e] : a.dhT[h.state + e];
      }
  }
  throw_if_stop_requested();
}

}  // namespace lattn::reference

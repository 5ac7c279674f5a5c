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
// (docs/kernels.md derives the delta rule's lines; tests/kernels/test_reference.cpp holds all of them to
// central finite differences.)
//
// The bonus form (RWKV-6, docs/spec.md section 1g; additive rule) reads the state before the token:
//   o_t = s S_{t-1}^T q_t + s (q_t . (u . k_t)) v_t,  hT = S_{T-1} as above
// so G_t = A_{t+1} P_{t+1} + s q_{t+1} do_{t+1}^T (G_{T-1} = dhT), dh0 = A_0 P_0 + s q_0 do_0^T,
// dq_t = s S_{t-1} do_t + c_t (u . k_t), and with c_t = s (do_t . v_t) the bonus adds
// dk_t += c_t (u . q_t), dv_t += s (q_t . (u . k_t)) do_t, du += c_t (q_t . k_t) (summed over every
// sequence and token of the value head).
//
// DeltaProduct (docs/spec.md section 1h: householder n > 1) is the delta rule over the interleaved
// seq * n steps of householder.hpp: q, g and dO spread to them, the outputs and dq, dg picked back.
//
// dg needs the state before each token while G runs in reverse. The states are not stored per
// token: the forward keeps one every L = ceil(sqrt(T)) tokens, and the reverse sweep recomputes a
// segment of L states from its checkpoint before walking it, so memory is O(sqrt(T) D^2) per
// thread and the work about three forward passes.
//
// Shapes (docs/spec.md section 1c): S is Dk x Dv; q/k rows are those of the value head's q/k head
// (shared heads' dq and dk are the sums over the value heads they serve); a packed batch's
// documents each start from their own h0 (Problem::slice gives every pair's rows).
//
// The loops poll the run's stop request (core/cancel.hpp) once per token: at seq 262144 the
// float64 pass takes tens of seconds, and a SIGTERM must not wait for it. A stopped pass leaves
// its outputs unfinished and throws Interrupted once out of the OpenMP region.
#include "kernels/linear_attention/reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"
#include "kernels/linear_attention/householder.hpp"

namespace lattn::reference {
namespace {

// A_t's factor for state row i of one head.
struct Decays {
  Decay decay;
  double gamma;     // retnet's (1 for none)
  const double* g;  // this head's log-gates: [T] scalar, [T][Dk] vector
  int Dk;

  double operator()(int t, int i) const {
    switch (decay) {
      case Decay::scalar: return std::exp(g[t]);
      case Decay::vector: return std::exp(g[std::size_t(t) * Dk + i]);
      default: return gamma;
    }
  }
};

Decays head_decays(const Problem& p, const double* g, const HeadSlice& h) {
  return {p.decay, decay_gamma(p.decay, h.head), g ? g + h.gate : nullptr, p.dim};
}

// S <- A_t S + k_t w_t^T for one token (S is Dk x Dv): w = v (additive), or w_t = beta_t (v_t -
// (A_t S)^T k_t) (delta; beta null for additive). `w` (Dv doubles) receives w_t.
void step(double* S, const Decays& A, int t, const double* kt, const double* vt, const double* beta, double* w,
          int Dk, int Dv) {
  for (int i = 0; i < Dk; ++i) {
    const double a = A(t, i);
    double* row = S + std::size_t(i) * Dv;
    for (int j = 0; j < Dv; ++j) row[j] *= a;
  }
  for (int j = 0; j < Dv; ++j) w[j] = beta ? 0.0 : vt[j];
  if (beta) {  // u = S'^T k, summed row by row (the rows are contiguous), then w = beta (v - u)
    for (int i = 0; i < Dk; ++i)
      for (int j = 0; j < Dv; ++j) w[j] += S[std::size_t(i) * Dv + j] * kt[i];
    for (int j = 0; j < Dv; ++j) w[j] = beta[t] * (vt[j] - w[j]);
  }
  for (int i = 0; i < Dk; ++i) {
    double* row = S + std::size_t(i) * Dv;
    for (int j = 0; j < Dv; ++j) row[j] += kt[i] * w[j];
  }
}

}  // namespace

void forward(const Problem& p, const ForwardArgs<double>& a) {
  if (p.dplr()) return dplr_forward(p, a);  // reference_dplr.cpp
  if (p.trapezoidal()) return trapezoidal_forward(p, a);
  if (p.householder > 1) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    const std::size_t key_rows = p.key_elems() / p.dim, value_rows = p.heads_total() * p.seq;
    std::vector<double> q(s.key_elems()), g(s.gate_elems()), o(s.value_elems());
    interleave_rows(a.q, key_rows, p.dim, n, n - 1, q.data());
    if (a.g) interleave_rows(a.g, value_rows, W, n, 0, g.data());
    forward(s, {q.data(), a.k, a.v, a.h0, o.data(), a.hT, a.g ? g.data() : nullptr, a.beta});
    pick_rows(o.data(), value_rows, p.value_dim(), n, n - 1, a.o);
    return;
  }
  const int Dk = p.dim, Dv = p.value_dim();
  const double s = attention_scale(Dk);
  const long slices = long(p.slices());
#pragma omp parallel for schedule(static)
  for (long index = 0; index < slices; ++index) {
    const HeadSlice h = p.slice(std::size_t(index));
    const Decays A = head_decays(p, a.g, h);
    const double* q = a.q + h.key;
    const double* k = a.k + h.key;
    const double* v = a.v + h.value;
    double* o = a.o + h.value;
    const double* beta = a.beta ? a.beta + h.beta : nullptr;
    double* S = a.hT + h.state;
    std::vector<double> w(Dv);
    const double* u = p.bonus ? a.u + std::size_t(h.head) * Dk : nullptr;
    std::copy_n(a.h0 + h.state, p.head_state_elems(), S);
    for (int t = 0; t < h.seq && !stop_requested(); ++t) {
      const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
      if (u) {  // o_t from S_{t-1}, and the current token's bonus
        double bonus = 0;
        for (int i = 0; i < Dk; ++i) bonus += q[rk + i] * u[i] * k[rk + i];
        for (int j = 0; j < Dv; ++j) {
          double acc = bonus * v[rv + j];
          for (int i = 0; i < Dk; ++i) acc += q[rk + i] * S[std::size_t(i) * Dv + j];
          o[rv + j] = s * acc;
        }
        step(S, A, t, k + rk, v + rv, beta, w.data(), Dk, Dv);
        continue;
      }
      step(S, A, t, k + rk, v + rv, beta, w.data(), Dk, Dv);
      for (int j = 0; j < Dv; ++j) {
        double acc = 0;
        for (int i = 0; i < Dk; ++i) acc += q[rk + i] * S[std::size_t(i) * Dv + j];
        o[rv + j] = s * acc;
      }
    }
  }
  throw_if_stop_requested();
}

Segments sqrt_segments(const Problem& p) {
  int longest = 1;
  for (std::size_t i = 0; i < std::size_t(p.sequences()); ++i) longest = std::max(longest, p.slice(i * p.heads).seq);
  const int length = int(std::ceil(std::sqrt(double(longest))));
  return {length, (longest + length - 1) / length};
}

void backward(const Problem& p, const BackwardArgs<double>& a) {
  if (p.dplr()) return dplr_backward(p, a);  // reference_dplr.cpp
  if (p.trapezoidal()) return trapezoidal_backward(p, a);
  if (p.householder > 1) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    const std::size_t key_rows = p.key_elems() / p.dim, value_rows = p.heads_total() * p.seq;
    std::vector<double> q(s.key_elems()), g(s.gate_elems()), dO(s.value_elems()), dq(s.key_elems()),
        dg(s.gate_elems());
    interleave_rows(a.q, key_rows, p.dim, n, n - 1, q.data());
    interleave_rows(a.dO, value_rows, p.value_dim(), n, n - 1, dO.data());
    if (a.g) interleave_rows(a.g, value_rows, W, n, 0, g.data());
    backward(s, {q.data(), a.k, a.v, a.h0, dO.data(), a.dhT, dq.data(), a.dk, a.dv, a.dh0, a.g ? g.data() : nullptr,
                 a.dg ? dg.data() : nullptr, a.beta, a.dbeta});
    pick_rows(dq.data(), key_rows, p.dim, n, n - 1, a.dq);
    if (a.dg) pick_rows(dg.data(), value_rows, W, n, 0, a.dg);
    return;
  }
  const int Dk = p.dim, Dv = p.value_dim(), G = p.group();
  const std::size_t DD = p.head_state_elems();
  const double s = attention_scale(Dk);
  const Segments segmented = sqrt_segments(p);
  const int L = segmented.length, segments = segmented.count;
  // Work items are (sequence, q/k head): the value heads a q/k head serves run one after another
  // on one thread, adding their dq and dk into its rows.
  const long groups = long(p.slices()) / G;
#pragma omp parallel
  {
    std::vector<double> checkpoints(std::size_t(segments) * DD);  // S_{t0 - 1} of each segment
    std::vector<double> states(std::size_t(L + 1) * DD);           // S_{t0 - 1} .. S_{t1 - 1}
    std::vector<double> w(Dv), dw(Dv), e(Dv), decayed(DD);
#pragma omp for schedule(static)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {
      const HeadSlice h = p.slice(std::size_t(group) * G + member);
      const int T = h.seq;
      const Decays A = head_decays(p, a.g, h);
      const double *q = a.q + h.key, *k = a.k + h.key, *v = a.v + h.value, *dO = a.dO + h.value;
      const double* beta = a.beta ? a.beta + h.beta : nullptr;
      double *dq = a.dq + h.key, *dk = a.dk + h.key, *dv = a.dv + h.value;
      if (member == 0) {
        std::fill_n(dq, std::size_t(T) * Dk, 0.0);
        std::fill_n(dk, std::size_t(T) * Dk, 0.0);
      }
      double* dg = a.dg ? a.dg + h.gate : nullptr;
      if (dg) std::fill_n(dg, std::size_t(T) * p.gate_width(), 0.0);

      std::vector<double> S(a.h0 + h.state, a.h0 + h.state + DD);
      for (int t = 0; t < T && !stop_requested(); ++t) {
        if (t % L == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + std::ptrdiff_t(t / L) * DD);
        step(S.data(), A, t, k + std::size_t(t) * Dk, v + std::size_t(t) * Dv, beta, w.data(), Dk, Dv);
      }

      double* Gs = a.dh0 + h.state;  // P_{t+1}, then G_t, in dh0's storage; dh0 = A_0 P_0 at the end
      std::copy_n(a.dhT + h.state, DD, Gs);
      const int segs = (T + L - 1) / L;
      for (int seg = segs - 1; seg >= 0 && !stop_requested(); --seg) {
        const int t0 = seg * L, t1 = std::min(T, t0 + L);
        std::copy_n(checkpoints.begin() + std::ptrdiff_t(seg) * DD, DD, states.begin());
        for (int t = t0; t < t1; ++t) {
          double* next = states.data() + std::size_t(t - t0 + 1) * DD;
          std::copy_n(next - DD, DD, next);
          step(next, A, t, k + std::size_t(t) * Dk, v + std::size_t(t) * Dv, beta, w.data(), Dk, Dv);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
          const double* before = states.data() + std::size_t(t - t0) * DD;  // S_{t-1}
          const double* after = before + DD;                                 // S_t
          // The readout of token r (t, or t + 1 for the bonus form, none past the end).
          const int r = p.bonus ? t + 1 : t;
          for (int i = 0; i < Dk; ++i) {  // S'_t, and G_t from P_{t+1}
            const double carry = t == T - 1 ? 1.0 : A(t + 1, i), a_t = A(t, i);
            const double qr = r < T ? s * q[std::size_t(r) * Dk + i] : 0.0;
            for (int j = 0; j < Dv; ++j) {
              const std::size_t at = std::size_t(i) * Dv + j;
              decayed[at] = a_t * before[at];
              Gs[at] = carry * Gs[at] + (r < T ? qr * dO[std::size_t(r) * Dv + j] : 0.0);
            }
          }
          const double* read = p.bonus ? before : after;  // the state o_t reads
          for (int i = 0; i < Dk; ++i) {
            double acc = 0;
            for (int j = 0; j < Dv; ++j) acc += read[std::size_t(i) * Dv + j] * dO[rv + j];
            dq[rk + i] += s * acc;
          }
          if (p.bonus) {
            const double* u = a.u + std::size_t(h.head) * Dk;
            double c = 0, bonus = 0;
            for (int j = 0; j < Dv; ++j) c += s * dO[rv + j] * v[rv + j];
            for (int i = 0; i < Dk; ++i) {
              bonus += q[rk + i] * u[i] * k[rk + i];
              dq[rk + i] += c * u[i] * k[rk + i];
              dk[rk + i] += c * u[i] * q[rk + i];
            }
            for (int j = 0; j < Dv; ++j) dv[rv + j] = s * bonus * dO[rv + j];  // the rest is added below
          }
          // w_t (v for additive), u_t = S'^T k_t (into e) and dw_t = G_t^T k_t, summed row by row.
          std::fill(e.begin(), e.end(), 0.0);
          std::fill(dw.begin(), dw.end(), 0.0);
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) {
              e[j] += decayed[std::size_t(i) * Dv + j] * k[rk + i];
              dw[j] += Gs[std::size_t(i) * Dv + j] * k[rk + i];
            }
          for (int j = 0; j < Dv; ++j) {
            e[j] = v[rv + j] - e[j];  // v_t - u_t
            w[j] = beta ? beta[t] * e[j] : v[rv + j];
            dv[rv + j] = (beta ? beta[t] * dw[j] : dw[j]) + (p.bonus ? dv[rv + j] : 0.0);
          }
          if (beta) {
            double db = 0;
            for (int j = 0; j < Dv; ++j) db += dw[j] * e[j];
            a.dbeta[h.beta + std::size_t(t)] = db;
          }
          for (int i = 0; i < Dk; ++i) {
            double acc = 0;
            for (int j = 0; j < Dv; ++j) {
              acc += Gs[std::size_t(i) * Dv + j] * w[j];
              if (beta) acc -= beta[t] * decayed[std::size_t(i) * Dv + j] * dw[j];
            }
            dk[rk + i] += acc;
          }
          if (beta)  // P_t = G_t - beta_t k_t dw_t^T
            for (int i = 0; i < Dk; ++i)
              for (int j = 0; j < Dv; ++j) Gs[std::size_t(i) * Dv + j] -= beta[t] * k[rk + i] * dw[j];
          if (dg)
            for (int i = 0; i < Dk; ++i) {
              double acc = 0;
              for (int j = 0; j < Dv; ++j) acc += Gs[std::size_t(i) * Dv + j] * decayed[std::size_t(i) * Dv + j];
              if (p.decay == Decay::vector) dg[rk + i] = acc;
              else dg[t] += acc;
            }
        }
      }
      for (int i = 0; i < Dk; ++i)
        for (int j = 0; j < Dv; ++j)
          Gs[std::size_t(i) * Dv + j] = Gs[std::size_t(i) * Dv + j] * A(0, i) +
                                        (p.bonus && T > 0 ? s * q[i] * dO[j] : 0.0);  // o_0 reads h0
    }
  }
  throw_if_stop_requested();
  if (!p.bonus) return;
  // du per value head, summed over its sequences and tokens (one head per thread: no shared sums).
#pragma omp parallel for schedule(static)
  for (int head = 0; head < p.heads; ++head) {
    double* du = a.du + std::size_t(head) * Dk;
    std::fill_n(du, Dk, 0.0);
    for (int n = 0; n < p.sequences(); ++n) {
      const HeadSlice h = p.slice(std::size_t(n) * p.heads + head);
      for (int t = 0; t < h.seq; ++t) {
        const std::size_t rk = h.key + std::size_t(t) * Dk, rv = h.value + std::size_t(t) * Dv;
        double c = 0;
        for (int j = 0; j < Dv; ++j) c += s * a.dO[rv + j] * a.v[rv + j];
        for (int i = 0; i < Dk; ++i) du[i] += c * a.q[rk + i] * a.k[rk + i];
      }
    }
  }
}

}  // namespace lattn::reference

// Float64 scan form of the diagonal-plus-low-rank rule (`rule: dplr`, docs/spec.md section 1f), written
// for clarity: the ground truth its CPU kernels (cpu/scan/scan_dplr.cpp, cpu/chunked/chunked_dplr.cpp)
// are checked against. reference.cpp's forward and backward hand a dplr problem to these. With A_t
// the decay before token t (diag(exp(g_t)) for vector gates, exp(g_t) for scalar ones, gamma for
// retnet, 1 for none), tokens t = 0 .. T-1 and S_{-1} = h0:
//
//   u_t = S_{t-1}^T b_t                         (the read along b: Dv)
//   S_t = A_t S_{t-1} + a_t u_t^T + k_t v_t^T   (= (A_t + a_t b_t^T) S_{t-1} + k_t v_t^T)
//   o_t = s S_t^T q_t,   hT = S_{T-1}
//
// Backward, G_t = dL/dS_t:
//   G_t  = s q_t do_t^T + A_{t+1} G_{t+1} + b_{t+1} z_{t+1}^T   (no carried term for t = T-1, whose
//          G starts from dhT),   z_t = G_t^T a_t,   dh0 = A_0 G_0 + b_0 z_0^T
//   dq_t = s S_t do_t,  dk_t = G_t v_t,  dv_t = G_t^T k_t,  da_t = G_t u_t,  db_t = S_{t-1} z_t
//   dg_t[i] = A_t[i] sum_j G_t[i][j] S_{t-1}[i][j]   (vector gates; scalar gates sum over i too)
// (tests/kernels/test_dplr.cpp holds every line to central finite differences.)
//
// The reverse sweep needs S_{t-1} at every token; as reference.cpp does, the forward keeps one state
// every L = ceil(sqrt(T)) tokens and each segment's states are recomputed before it is walked, so
// memory is O(sqrt(T) Dk Dv) per thread. Shapes (docs/spec.md section 1c): a, b and g are per value
// head, q and k per q/k head (their gradients summed over the value heads a q/k head serves).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"
#include "kernels/linear_attention/reference.hpp"

namespace lattn::reference {
namespace {

// A_t's factor for key channel i of one value head.
struct DplrDecays {
  Decay decay;
  double gamma;
  const double* g;
  int Dk;
  double operator()(int t, int i) const {
    switch (decay) {
      case Decay::scalar: return std::exp(g[t]);
      case Decay::vector: return std::exp(g[std::size_t(t) * Dk + i]);
      default: return gamma;
    }
  }
};

// One value head's inputs.
struct DplrHead {
  const double *q, *k, *v, *a, *b;
  DplrDecays A;
  int T;
};

DplrHead dplr_head(const Problem& p, const double* q, const double* k, const double* v, const double* a,
                   const double* b, const double* g, const HeadSlice& h) {
  const std::size_t low = p.low_rank_offset(h);
  return {q + h.key, k + h.key, v + h.value, a + low, b + low,
          {p.decay, decay_gamma(p.decay, h.head), g ? g + h.gate : nullptr, p.dim}, h.seq};
}

// S <- A_t S + a_t u^T + k_t v_t^T with u = S^T b_t (into u, Dv doubles).
void dplr_step(double* S, const DplrHead& x, int t, double* u, int Dk, int Dv) {
  const double *at = x.a + std::size_t(t) * Dk, *bt = x.b + std::size_t(t) * Dk;
  const double *kt = x.k + std::size_t(t) * Dk, *vt = x.v + std::size_t(t) * Dv;
  std::fill_n(u, Dv, 0.0);
  for (int i = 0; i < Dk; ++i)
    for (int j = 0; j < Dv; ++j) u[j] += bt[i] * S[std::size_t(i) * Dv + j];
  for (int i = 0; i < Dk; ++i) {
    const double decay = x.A(t, i);
    double* row = S + std::size_t(i) * Dv;
    for (int j = 0; j < Dv; ++j) row[j] = decay * row[j] + at[i] * u[j] + kt[i] * vt[j];
  }
}

}  // namespace

void dplr_forward(const Problem& p, const ForwardArgs<double>& args) {
  const int Dk = p.dim, Dv = p.value_dim();
  const double s = attention_scale(Dk);
  const long slices = long(p.slices());
#pragma omp parallel for schedule(static)
  for (long index = 0; index < slices; ++index) {
    const HeadSlice h = p.slice(std::size_t(index));
    const DplrHead x = dplr_head(p, args.q, args.k, args.v, args.a, args.b, args.g, h);
    double* o = args.o + h.value;
    double* S = args.hT + h.state;
    std::vector<double> u(Dv);
    std::copy_n(args.h0 + h.state, p.head_state_elems(), S);
    for (int t = 0; t < x.T && !stop_requested(); ++t) {
      dplr_step(S, x, t, u.data(), Dk, Dv);
      const double* qt = x.q + std::size_t(t) * Dk;
      for (int j = 0; j < Dv; ++j) {
        double acc = 0;
        for (int i = 0; i < Dk; ++i) acc += qt[i] * S[std::size_t(i) * Dv + j];
        o[std::size_t(t) * Dv + j] = s * acc;
      }
    }
  }
  throw_if_stop_requested();
}

void dplr_backward(const Problem& p, const BackwardArgs<double>& args) {
  const int Dk = p.dim, Dv = p.value_dim(), G = p.group();
  const std::size_t DD = p.head_state_elems();
  const double s = attention_scale(Dk);
  const Segments segmented = sqrt_segments(p);
  const int L = segmented.length, segments = segmented.count;
  // Work items are (sequence, q/k head), so that one thread adds a q/k head's dq and dk.
  const long groups = long(p.slices()) / G;
#pragma omp parallel
  {
    std::vector<double> checkpoints(std::size_t(segments) * DD);  // S_{t0 - 1} of each segment
    std::vector<double> states(std::size_t(L + 1) * DD);           // S_{t0 - 1} .. S_{t1 - 1}
    std::vector<double> u(Dv), z(Dv);
#pragma omp for schedule(static)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {
        const HeadSlice h = p.slice(std::size_t(group) * G + member);
        const DplrHead x = dplr_head(p, args.q, args.k, args.v, args.a, args.b, args.g, h);
        const int T = x.T;
        const std::size_t low = p.low_rank_offset(h);
        const double* dO = args.dO + h.value;
        double *dq = args.dq + h.key, *dk = args.dk + h.key, *dv = args.dv + h.value;
        double *da = args.da + low, *db = args.db + low;
        double* dg = args.dg ? args.dg + h.gate : nullptr;
        if (member == 0) {
          std::fill_n(dq, std::size_t(T) * Dk, 0.0);
          std::fill_n(dk, std::size_t(T) * Dk, 0.0);
        }
        if (dg) std::fill_n(dg, std::size_t(T) * p.gate_width(), 0.0);

        std::vector<double> S(args.h0 + h.state, args.h0 + h.state + DD);
        for (int t = 0; t < T && !stop_requested(); ++t) {
          if (t % L == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + std::ptrdiff_t(t / L) * DD);
          dplr_step(S.data(), x, t, u.data(), Dk, Dv);
        }

        // G_t in dh0's storage: dhT first, then each token's s q_t do_t^T added before it is used;
        // carrying it to token t - 1 (A_t G_t + b_t z_t^T) ends, after token 0, as dh0.
        double* Gs = args.dh0 + h.state;
        std::copy_n(args.dhT + h.state, DD, Gs);
        const int segs = (T + L - 1) / L;
        for (int seg = segs - 1; seg >= 0 && !stop_requested(); --seg) {
          const int t0 = seg * L, t1 = std::min(T, t0 + L);
          std::copy_n(checkpoints.begin() + std::ptrdiff_t(seg) * DD, DD, states.begin());
          for (int t = t0; t < t1; ++t) {
            double* next = states.data() + std::size_t(t - t0 + 1) * DD;
            std::copy_n(next - DD, DD, next);
            dplr_step(next, x, t, u.data(), Dk, Dv);
          }
          for (int t = t1 - 1; t >= t0; --t) {
            const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
            const double* before = states.data() + std::size_t(t - t0) * DD;  // S_{t-1}
            const double* after = before + DD;                                 // S_t
            const double *qt = x.q + rk, *kt = x.k + rk, *vt = x.v + rv, *at = x.a + rk, *bt = x.b + rk;
            for (int i = 0; i < Dk; ++i)
              for (int j = 0; j < Dv; ++j) Gs[std::size_t(i) * Dv + j] += s * qt[i] * dO[rv + j];
            std::fill(u.begin(), u.end(), 0.0);
            std::fill(z.begin(), z.end(), 0.0);
            for (int i = 0; i < Dk; ++i)
              for (int j = 0; j < Dv; ++j) {
                u[j] += bt[i] * before[std::size_t(i) * Dv + j];
                z[j] += at[i] * Gs[std::size_t(i) * Dv + j];
              }
            for (int j = 0; j < Dv; ++j) {
              double acc = 0;
              for (int i = 0; i < Dk; ++i) acc += Gs[std::size_t(i) * Dv + j] * kt[i];
              dv[rv + j] = acc;
            }
            for (int i = 0; i < Dk; ++i) {
              const std::size_t row = std::size_t(i) * Dv;
              double dqi = 0, dki = 0, dai = 0, dbi = 0, dgi = 0;
              for (int j = 0; j < Dv; ++j) {
                dqi += after[row + j] * dO[rv + j];
                dki += Gs[row + j] * vt[j];
                dai += Gs[row + j] * u[j];
                dbi += before[row + j] * z[j];
                dgi += Gs[row + j] * before[row + j];
              }
              dq[rk + i] += s * dqi;
              dk[rk + i] += dki;
              da[rk + i] = dai;
              db[rk + i] = dbi;
              if (p.decay == Decay::vector) dg[rk + i] = x.A(t, i) * dgi;
              else if (dg) dg[t] += x.A(t, i) * dgi;
            }
            // G_{t-1} without its own s q do^T: A_t G_t + b_t z_t^T (dh0 after token 0).
            for (int i = 0; i < Dk; ++i) {
              const double decay = x.A(t, i);
              for (int j = 0; j < Dv; ++j) {
                double& gij = Gs[std::size_t(i) * Dv + j];
                gij = decay * gij + bt[i] * z[j];
              }
            }
          }
        }
      }
  }
  throw_if_stop_requested();
}

}  // namespace lattn::reference

// Float64 sliding-window softmax attention, written literally: a loop over each query's window
// (O(T * W), so the layer's reference stays quick at seq 8192). The token loops poll the run's
// stop request (core/cancel.hpp), as the linear attention's reference does.
#include "kernels/sliding_window/reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"

namespace lattn::reference {
namespace {

using Vec = std::vector<double>;

int window_start(int t, int window) { return std::max(0, t - window + 1); }

// Scaled scores of query t over its window, softmaxed in place; returns the log-sum-exp.
double window_probabilities(const double* q, const double* k, int t, int window, int D, double s, Vec& p) {
  const int lo = window_start(t, window), n = t - lo + 1;
  p.assign(std::size_t(n), 0.0);
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) {
    double dot = 0;
    for (int j = 0; j < D; ++j) dot += q[std::size_t(t) * D + j] * k[std::size_t(lo + i) * D + j];
    p[std::size_t(i)] = s * dot;
    m = std::max(m, p[std::size_t(i)]);
  }
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - m));
  for (double& x : p) x /= sum;
  return m + std::log(sum);
}

}  // namespace

void sliding_window_forward(const Problem& p, int window, const double* q, const double* k, const double* v, double* o,
                            double* lse) {
  const int T = p.seq, D = p.dim;
  const double s = attention_scale(D);
  const long heads_total = long(p.heads_total());
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < heads_total; ++bh) {
    const std::size_t head = std::size_t(bh) * p.head_token_elems();
    Vec prob;
    for (int t = 0; t < T && !stop_requested(); ++t) {
      const double l = window_probabilities(q + head, k + head, t, window, D, s, prob);
      if (lse) lse[std::size_t(bh) * T + t] = l;
      const int lo = window_start(t, window);
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (std::size_t i = 0; i < prob.size(); ++i) acc += prob[i] * v[head + (lo + i) * D + j];
        o[head + std::size_t(t) * D + j] = acc;
      }
    }
  }
  throw_if_stop_requested();
}

void sliding_window_backward(const Problem& p, int window, const double* q, const double* k, const double* v,
                             const double* dO, double* dq, double* dk, double* dv) {
  const int T = p.seq, D = p.dim;
  const double s = attention_scale(D);
  const long heads_total = long(p.heads_total());
  std::fill_n(dq, p.token_elems(), 0.0);
  std::fill_n(dk, p.token_elems(), 0.0);
  std::fill_n(dv, p.token_elems(), 0.0);
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < heads_total; ++bh) {
    const std::size_t head = std::size_t(bh) * p.head_token_elems();
    Vec prob, dprob;
    for (int t = 0; t < T && !stop_requested(); ++t) {
      window_probabilities(q + head, k + head, t, window, D, s, prob);
      const int lo = window_start(t, window);
      const double* dot = dO + head + std::size_t(t) * D;
      dprob.assign(prob.size(), 0.0);
      double delta = 0;  // sum_tau p_tau dp_tau, the softmax's Jacobian term
      for (std::size_t i = 0; i < prob.size(); ++i) {
        for (int j = 0; j < D; ++j) dprob[i] += dot[j] * v[head + (lo + i) * D + j];
        delta += prob[i] * dprob[i];
      }
      for (std::size_t i = 0; i < prob.size(); ++i) {
        const double dscore = prob[i] * (dprob[i] - delta) * s;
        const std::size_t key = head + (lo + i) * D, query = head + std::size_t(t) * D;
        for (int j = 0; j < D; ++j) {
          dq[query + j] += dscore * k[key + j];
          dk[key + j] += dscore * q[query + j];
          dv[key + j] += prob[i] * dot[j];
        }
      }
    }
  }
  throw_if_stop_requested();
}

}  // namespace lattn::reference

// The float64 reference itself: its forward against the closed (non-recurrent) form of causal
// linear attention, and its gradients against central finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/linear_attention/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

struct Tensors {
  std::vector<double> q, k, v, h0, dO, dhT, g, beta;  // beta: the delta rule's (empty: additive)
  const double* gates() const { return g.empty() ? nullptr : g.data(); }
  const double* betas() const { return beta.empty() ? nullptr : beta.data(); }
};

// Log-gates as docs/spec.md section 3 draws them: logsigmoid(z) / gate_norm.
Tensors random_tensors(const Problem& p, std::uint64_t seed, double gate_norm = 16) {
  std::mt19937_64 rng(seed);
  Tensors t{random_vector(p.token_elems(), rng), random_vector(p.token_elems(), rng), random_vector(p.token_elems(), rng),
            random_vector(p.state_elems(), rng), random_vector(p.token_elems(), rng), random_vector(p.state_elems(), rng),
            random_vector(p.gate_elems(), rng), {}};
  for (double& z : t.g) z = -std::log1p(std::exp(-z)) / gate_norm;
  return t;
}

double loss(const Problem& p, const Tensors& t) {
  std::vector<double> o(p.token_elems()), hT(p.state_elems());
  reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates(), t.betas()});
  double l = 0;
  for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * t.dO[i];
  for (std::size_t i = 0; i < hT.size(); ++i) l += hT[i] * t.dhT[i];
  return l;
}

}  // namespace

TEST_CASE("reference forward equals the closed form of causal linear attention", "[reference]") {
  for (Decay decay : {Decay::none, Decay::retnet}) {
    const Problem p{2, 3, 7, 4, 64, decay};
    const Tensors t = random_tensors(p, 11);
    std::vector<double> o(p.token_elems()), hT(p.state_elems());
    reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data()});
    const double s = attention_scale(p.dim);
    double worst = 0;
    for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
      const double g = decay_gamma(decay, int(bh % p.heads));
      const double* q = t.q.data() + bh * p.head_token_elems();
      const double* k = t.k.data() + bh * p.head_token_elems();
      const double* v = t.v.data() + bh * p.head_token_elems();
      const double* h0 = t.h0.data() + bh * p.head_state_elems();
      for (int i = 0; i < p.seq; ++i)
        for (int j = 0; j < p.dim; ++j) {
          // o_i = s (gamma^(i+1) h0^T q_i + sum_{tau <= i} gamma^(i - tau) (q_i . k_tau) v_tau)
          double expected = 0;
          for (int a = 0; a < p.dim; ++a) expected += std::pow(g, i + 1) * h0[a * p.dim + j] * q[i * p.dim + a];
          for (int tau = 0; tau <= i; ++tau) {
            double qk = 0;
            for (int a = 0; a < p.dim; ++a) qk += q[i * p.dim + a] * k[tau * p.dim + a];
            expected += std::pow(g, i - tau) * qk * v[tau * p.dim + j];
          }
          expected *= s;
          worst = std::max(worst, std::abs(expected - o[bh * p.head_token_elems() + i * p.dim + j]));
        }
    }
    CHECK(worst < 1e-12);
  }
}

TEST_CASE("reference forward with gates equals the closed form of gated linear attention", "[reference][gated]") {
  // o_i = s (prod_{tau <= i} A_tau h0)^T q_i + s sum_{tau <= i} (q_i . (prod_{tau < u <= i} A_u) k_tau) v_tau
  for (Decay decay : {Decay::scalar, Decay::vector}) {
    const Problem p{1, 2, 9, 4, 64, decay};
    const Tensors t = random_tensors(p, 13, 1.0);
    std::vector<double> o(p.token_elems()), hT(p.state_elems());
    reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates()});
    const double s = attention_scale(p.dim);
    double worst = 0;
    for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
      const double* g = t.g.data() + bh * p.head_gate_elems();
      // Sum of the log-gates of tokens (from, to], channel a.
      auto log_decay = [&](int from, int to, int a) {
        double sum = 0;
        for (int u = from + 1; u <= to; ++u) sum += decay == Decay::scalar ? g[u] : g[u * p.dim + a];
        return sum;
      };
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      for (int i = 0; i < p.seq; ++i)
        for (int j = 0; j < p.dim; ++j) {
          double expected = 0;
          for (int a = 0; a < p.dim; ++a) {
            expected += std::exp(log_decay(-1, i, a)) * t.h0[st + a * p.dim + j] * t.q[tok + i * p.dim + a];
            for (int tau = 0; tau <= i; ++tau)
              expected += std::exp(log_decay(tau, i, a)) * t.q[tok + i * p.dim + a] * t.k[tok + tau * p.dim + a] *
                          t.v[tok + tau * p.dim + j];
          }
          worst = std::max(worst, std::abs(s * expected - o[tok + i * p.dim + j]));
        }
    }
    INFO(to_string(decay));
    CHECK(worst < 1e-12);
  }
}

namespace {

// The largest error of `grad` against central differences of `objective` over each element of
// `x` (relative where the derivative exceeds 1, absolute below).
template <class Objective>
double worst_fd_error(std::vector<double>& x, const std::vector<double>& grad, Objective objective) {
  const double eps = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = objective();
    x[i] = saved - eps;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * eps);
    worst = std::max(worst, std::abs(numeric - grad[i]) / std::max(1.0, std::abs(numeric)));
  }
  return worst;
}

}  // namespace

TEST_CASE("reference gradients match central finite differences", "[reference][grad]") {
  struct Shape {
    Problem p;
    double gate_norm;
  };
  // Gated: weak (16) and strong (1) gates, scalar and vector, T past one sqrt(T) segment of the
  // reference's checkpoints (T 5: segments of 3) and ragged.
  const std::vector<Shape> shapes = {{{1, 2, 5, 3, 64, Decay::none}, 16},   {{1, 2, 5, 3, 64, Decay::retnet}, 16},
                                     {{1, 2, 5, 3, 64, Decay::scalar}, 16}, {{1, 2, 7, 3, 64, Decay::scalar}, 1},
                                     {{1, 2, 5, 3, 64, Decay::vector}, 16}, {{2, 1, 11, 4, 64, Decay::vector}, 1}};
  for (const auto& [p, gate_norm] : shapes) {
    INFO(test::describe(p) << " gate_norm " << gate_norm);
    Tensors t = random_tensors(p, 5, gate_norm);
    std::vector<double> dq(p.token_elems()), dk(p.token_elems()), dv(p.token_elems()), dh0(p.state_elems());
    std::vector<double> dg(p.gate_elems());
    reference::backward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), dq.data(),
                            dk.data(), dv.data(), dh0.data(), t.gates(), dg.empty() ? nullptr : dg.data()});
    auto check_gradient = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      const double worst = worst_fd_error(x, grad, [&] { return loss(p, t); });
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    check_gradient(t.q, dq, "dq");
    check_gradient(t.k, dk, "dk");
    check_gradient(t.v, dv, "dv");
    check_gradient(t.h0, dh0, "dh0");
    if (gated(p.decay)) check_gradient(t.g, dg, "dg");
  }
}

namespace {

// The delta rule's inputs as docs/spec.md section 3 draws them (keys L2-normalised, beta = sigmoid(z')), or
// with every beta set to `fixed_beta` when it is positive.
Tensors delta_tensors(const Problem& p, std::uint64_t seed, double gate_norm, double fixed_beta = 0) {
  Tensors t = random_tensors(p, seed, gate_norm);
  std::mt19937_64 rng(seed + 100);
  t.beta = random_vector(p.beta_elems(), rng);
  for (double& b : t.beta) b = fixed_beta > 0 ? fixed_beta : 1.0 / (1.0 + std::exp(-b));
  for (std::size_t r = 0; r < t.k.size(); r += std::size_t(p.dim)) {
    double norm = 0;
    for (int d = 0; d < p.dim; ++d) norm += t.k[r + d] * t.k[r + d];
    for (int d = 0; d < p.dim; ++d) t.k[r + d] /= std::sqrt(norm);
  }
  return t;
}

}  // namespace

TEST_CASE("delta rule reference: a full write maps the key to its value", "[reference][delta]") {
  // beta = 1 and a unit key: S_t^T k_t = S'^T k + (k . k) (v - S'^T k) = v_t, whatever the state
  // and the decay (an independent check of the forward's update).
  for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
    Problem p{1, 2, 6, 5, 64, decay};
    p.rule = Rule::delta;
    const Tensors t = delta_tensors(p, 17, 1.0, 1.0);
    for (int T = 1; T <= p.seq; ++T) {
      Problem prefix = p;
      prefix.seq = T;
      Tensors u = t;  // the first T tokens of each head
      auto cut = [&](std::vector<double>& x, std::size_t per_token) {
        std::vector<double> out;
        for (std::size_t bh = 0; bh < p.heads_total(); ++bh)
          out.insert(out.end(), x.begin() + std::ptrdiff_t(bh * p.seq * per_token),
                     x.begin() + std::ptrdiff_t((bh * p.seq + T) * per_token));
        x = out;
      };
      for (auto* x : {&u.q, &u.k, &u.v, &u.dO}) cut(*x, std::size_t(p.dim));
      cut(u.g, std::size_t(p.gate_width()));
      cut(u.beta, 1);
      std::vector<double> o(prefix.token_elems()), hT(prefix.state_elems());
      reference::forward(prefix, {u.q.data(), u.k.data(), u.v.data(), u.h0.data(), o.data(), hT.data(), u.gates(), u.betas()});
      double worst = 0;
      for (std::size_t bh = 0; bh < p.heads_total(); ++bh)
        for (int j = 0; j < p.dim; ++j) {
          double read = 0;
          for (int i = 0; i < p.dim; ++i)
            read += hT[bh * prefix.head_state_elems() + i * p.dim + j] * u.k[(bh * T + T - 1) * p.dim + i];
          worst = std::max(worst, std::abs(read - u.v[(bh * T + T - 1) * p.dim + j]));
        }
      INFO(to_string(decay) << " T " << T);
      CHECK(worst < 1e-12);
    }
  }
}

TEST_CASE("delta rule reference gradients match central finite differences", "[reference][grad][delta]") {
  struct Shape {
    Problem p;
    double gate_norm;
    double beta;  // 0: drawn; else every beta
  };
  std::vector<Shape> shapes;
  for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
    shapes.push_back({{1, 2, 5, 3, 64, decay}, 16, 0});
    shapes.push_back({{2, 1, 11, 4, 64, decay}, 1, 0});     // strong gates, past one checkpoint segment
    shapes.push_back({{1, 1, 7, 1, 64, decay}, 16, 0});     // D = 1
    shapes.push_back({{1, 1, 6, 3, 64, decay}, 1, 1e-4});   // beta near 0
    shapes.push_back({{1, 1, 6, 3, 64, decay}, 1, 0.9999}); // beta near 1
  }
  double worst_all = 0;
  for (auto [p, gate_norm, fixed_beta] : shapes) {
    p.rule = Rule::delta;
    INFO(test::describe(p) << " delta gate_norm " << gate_norm << " beta " << fixed_beta);
    Tensors t = delta_tensors(p, 5, gate_norm, fixed_beta);
    std::vector<double> dq(p.token_elems()), dk(p.token_elems()), dv(p.token_elems()), dh0(p.state_elems());
    std::vector<double> dg(p.gate_elems()), dbeta(p.beta_elems());
    reference::backward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), dq.data(),
                            dk.data(), dv.data(), dh0.data(), t.gates(), dg.empty() ? nullptr : dg.data(), t.betas(),
                            dbeta.data()});
    auto check_gradient = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      const double worst = worst_fd_error(x, grad, [&] { return loss(p, t); });
      worst_all = std::max(worst_all, worst);
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    // k is perturbed off the unit sphere: the gradient is the rule's, for whatever keys it is given.
    check_gradient(t.q, dq, "dq");
    check_gradient(t.k, dk, "dk");
    check_gradient(t.v, dv, "dv");
    check_gradient(t.h0, dh0, "dh0");
    check_gradient(t.beta, dbeta, "dbeta");
    if (gated(p.decay)) check_gradient(t.g, dg, "dg");
  }
  WARN("delta rule: worst finite-difference error " << worst_all);
}

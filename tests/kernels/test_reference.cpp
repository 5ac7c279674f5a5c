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
      const double worst = test::worst_fd_error(x, grad, [&] { return loss(p, t); });
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
      const double worst = test::worst_fd_error(x, grad, [&] { return loss(p, t); });
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

namespace {

// RWKV-6's bonus form (docs/spec.md section 1g): the tensors of random_tensors and a bonus u
// [H][Dk] ~ N(0, 1); the loss of section 1's backward.
struct BonusTensors {
  Tensors t;
  std::vector<double> u;
};

BonusTensors bonus_tensors(const Problem& p, std::uint64_t seed, double gate_norm) {
  std::mt19937_64 rng(seed + 200);
  return {random_tensors(p, seed, gate_norm), random_vector(std::size_t(p.heads) * p.dim, rng)};
}

double bonus_loss(const Problem& p, const BonusTensors& b) {
  const Tensors& t = b.t;
  std::vector<double> o(p.token_elems()), hT(p.state_elems());
  ForwardArgs<double> args{t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates()};
  args.u = b.u.data();
  reference::forward(p, args);
  double l = 0;
  for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * t.dO[i];
  for (std::size_t i = 0; i < hT.size(); ++i) l += hT[i] * t.dhT[i];
  return l;
}

}  // namespace

TEST_CASE("bonus reference forward equals the closed form of RWKV-6", "[reference][bonus]") {
  // o_i = s (prod_{tau < i} A_tau h0)^T q_i + s sum_{tau < i} (q_i . (prod_{tau < r < i} A_r) k_tau) v_tau
  //       + s (q_i . (u . k_i)) v_i;  hT as GLA's (prod_{tau <= T-1} A_tau h0 + ...).
  Problem p{1, 2, 9, 4, 64, Decay::vector};
  p.bonus = true;
  const BonusTensors b = bonus_tensors(p, 19, 1.0);
  const Tensors& t = b.t;
  std::vector<double> o(p.token_elems()), hT(p.state_elems());
  ForwardArgs<double> args{t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates()};
  args.u = b.u.data();
  reference::forward(p, args);
  const double s = attention_scale(p.dim);
  double worst = 0;
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    const double* g = t.g.data() + bh * p.head_gate_elems();
    const double* u = b.u.data() + (bh % p.heads) * p.dim;
    auto log_decay = [&](int from, int to, int a) {  // gates of tokens (from, to]
      double sum = 0;
      for (int r = from + 1; r <= to; ++r) sum += g[r * p.dim + a];
      return sum;
    };
    const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
    for (int i = 0; i <= p.seq; ++i)  // i = seq: hT's columns, against the same sums
      for (int j = 0; j < p.dim; ++j) {
        if (i == p.seq) {
          for (int a = 0; a < p.dim; ++a) {
            double expected = std::exp(log_decay(-1, p.seq - 1, a)) * t.h0[st + a * p.dim + j];
            for (int tau = 0; tau < p.seq; ++tau)
              expected += std::exp(log_decay(tau, p.seq - 1, a)) * t.k[tok + tau * p.dim + a] * t.v[tok + tau * p.dim + j];
            worst = std::max(worst, std::abs(expected - hT[st + a * p.dim + j]));
          }
          continue;
        }
        double expected = 0, bonus = 0;
        for (int a = 0; a < p.dim; ++a) {
          const double qa = t.q[tok + i * p.dim + a];
          expected += std::exp(log_decay(-1, i - 1, a)) * t.h0[st + a * p.dim + j] * qa;
          for (int tau = 0; tau < i; ++tau)
            expected += std::exp(log_decay(tau, i - 1, a)) * qa * t.k[tok + tau * p.dim + a] * t.v[tok + tau * p.dim + j];
          bonus += qa * u[a] * t.k[tok + i * p.dim + a];
        }
        expected += bonus * t.v[tok + i * p.dim + j];
        worst = std::max(worst, std::abs(s * expected - o[tok + i * p.dim + j]));
      }
  }
  CHECK(worst < 1e-12);
}

TEST_CASE("bonus reference gradients match central finite differences", "[reference][grad][bonus]") {
  struct Shape {
    Problem p;
    double gate_norm;
  };
  // Weak and strong gates, T past one checkpoint segment, T 1 (o_0 reads h0 only), two sequences
  // of one head (du sums over them).
  const std::vector<Shape> shapes = {{{1, 2, 5, 3, 64, Decay::vector}, 16},
                                     {{2, 1, 11, 4, 64, Decay::vector}, 1},
                                     {{1, 2, 1, 3, 64, Decay::vector}, 1}};
  for (auto [p, gate_norm] : shapes) {
    p.bonus = true;
    INFO(test::describe(p) << " bonus gate_norm " << gate_norm);
    BonusTensors b = bonus_tensors(p, 5, gate_norm);
    Tensors& t = b.t;
    std::vector<double> dq(p.token_elems()), dk(p.token_elems()), dv(p.token_elems()), dh0(p.state_elems());
    std::vector<double> dg(p.gate_elems()), du(p.bonus_elems());
    BackwardArgs<double> grads{t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), dq.data(),
                               dk.data(), dv.data(), dh0.data(), t.gates(), dg.data()};
    grads.u = b.u.data(), grads.du = du.data();
    reference::backward(p, grads);
    auto check_gradient = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      const double worst = test::worst_fd_error(x, grad, [&] { return bonus_loss(p, b); });
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    check_gradient(t.q, dq, "dq");
    check_gradient(t.k, dk, "dk");
    check_gradient(t.v, dv, "dv");
    check_gradient(t.h0, dh0, "dh0");
    check_gradient(t.g, dg, "dg");
    check_gradient(b.u, du, "du");
  }
}

namespace {

// DeltaProduct's inputs (docs/spec.md section 1h): q, dO and the gates per token, k (unit rows), v
// and beta per write, n writes per token; h0 and dhT as ever.
Tensors product_tensors(const Problem& p, std::uint64_t seed, double gate_norm) {
  Problem steps = p;
  steps.seq = p.seq * p.householder;
  steps.householder = 1;
  Tensors t = delta_tensors(steps, seed, gate_norm);  // k, v, beta (and unused q, dO, g) per write
  std::mt19937_64 rng(seed + 300);
  t.q = random_vector(p.token_elems(), rng);
  t.dO = random_vector(p.token_elems(), rng);
  t.g = random_vector(p.gate_elems(), rng);
  for (double& z : t.g) z = -std::log1p(std::exp(-z)) / gate_norm;
  return t;
}

}  // namespace

TEST_CASE("DeltaProduct reference: the writes of each token in turn, read after the last", "[reference][delta][householder]") {
  // Per token: S <- A_t S, then for j = 0 .. n-1: S <- S + beta_j k_j (v_j - S^T k_j)^T; o_t = s S^T q_t.
  for (Decay decay : {Decay::none, Decay::scalar, Decay::vector})
    for (int n : {1, 2, 3}) {
      Problem p{1, 2, 6, 4, 64, decay, Rule::delta};
      p.householder = n;
      const Tensors t = product_tensors(p, 23, 1.0);
      std::vector<double> o(p.token_elems()), hT(p.state_elems());
      reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates(), t.betas()});
      const int D = p.dim;
      const double s = attention_scale(D);
      double worst = 0;
      for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
        std::vector<double> S(t.h0.begin() + std::ptrdiff_t(bh * D * D), t.h0.begin() + std::ptrdiff_t((bh + 1) * D * D));
        for (int tok = 0; tok < p.seq; ++tok) {
          for (int i = 0; i < D; ++i) {
            const double a = decay == Decay::none     ? 1.0
                             : decay == Decay::scalar ? std::exp(t.g[bh * p.seq + tok])
                                                      : std::exp(t.g[(bh * p.seq + tok) * D + i]);
            for (int j = 0; j < D; ++j) S[i * D + j] *= a;
          }
          for (int w = 0; w < n; ++w) {
            const std::size_t row = bh * p.seq * n + std::size_t(tok) * n + w;
            const double* k = t.k.data() + row * D;
            const double* v = t.v.data() + row * D;
            std::vector<double> err(D);
            for (int j = 0; j < D; ++j) {
              double read = 0;
              for (int i = 0; i < D; ++i) read += S[i * D + j] * k[i];
              err[j] = v[j] - read;
            }
            for (int i = 0; i < D; ++i)
              for (int j = 0; j < D; ++j) S[i * D + j] += t.beta[row] * k[i] * err[j];
          }
          for (int j = 0; j < D; ++j) {
            double read = 0;
            for (int i = 0; i < D; ++i) read += S[i * D + j] * t.q[(bh * p.seq + tok) * D + i];
            worst = std::max(worst, std::abs(s * read - o[(bh * p.seq + tok) * D + j]));
          }
        }
        for (int e = 0; e < D * D; ++e) worst = std::max(worst, std::abs(S[e] - hT[bh * D * D + e]));
      }
      INFO(to_string(decay) << " householder " << n);
      CHECK(worst < 1e-12);
    }
}

TEST_CASE("DeltaProduct reference gradients match central finite differences", "[reference][grad][delta][householder]") {
  for (Decay decay : {Decay::none, Decay::scalar, Decay::vector})
    for (const auto& [shape, gate_norm] : {std::pair{Problem{1, 2, 4, 3, 64, decay, Rule::delta}, 16.0},
                                            std::pair{Problem{2, 1, 5, 4, 64, decay, Rule::delta}, 1.0}}) {
      Problem p = shape;
      p.householder = 2;
      INFO(test::describe(p) << " householder 2 gate_norm " << gate_norm);
      Tensors t = product_tensors(p, 7, gate_norm);
      const std::size_t n = std::size_t(p.householder);
      std::vector<double> dq(p.token_elems()), dk(p.token_elems() * n), dv(p.token_elems() * n),
          dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.beta_elems() * n);
      reference::backward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), dq.data(),
                              dk.data(), dv.data(), dh0.data(), t.gates(), dg.empty() ? nullptr : dg.data(), t.betas(),
                              dbeta.data()});
      auto check_gradient = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
        const double worst = test::worst_fd_error(x, grad, [&] { return loss(p, t); });
        INFO(name << " worst " << worst);
        CHECK(worst < 1e-7);
      };
      check_gradient(t.q, dq, "dq");
      check_gradient(t.k, dk, "dk");
      check_gradient(t.v, dv, "dv");
      check_gradient(t.h0, dh0, "dh0");
      check_gradient(t.beta, dbeta, "dbeta");
      if (gated(decay)) check_gradient(t.g, dg, "dg");
    }
}

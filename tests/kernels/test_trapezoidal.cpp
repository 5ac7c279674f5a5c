// The trapezoidal rule's float64 reference (kernels/linear_attention/reference_trapezoidal.cpp,
// docs/spec.md section 1e): its forward against the closed form Mamba-3's authors write their
// chunked reference in (a decayed causal sum with per-key weights and a diagonal correction), packed
// documents against separate sequences, and every gradient against central finite differences, for
// MIMO ranks 1, 2 and 4.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/linear_attention/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

struct Inputs {
  std::vector<double> q, k, v, h0, dO, dhT, g, dt, trap;
};

std::vector<double> normals(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = normal(rng);
  return x;
}

// g = logsigmoid(z) / gate_norm, dt = softplus(z'), trap ~ N(0, 2): strong and one-sided lambdas too.
Inputs draw(const Problem& p, std::uint64_t seed, double gate_norm) {
  std::mt19937_64 rng(seed);
  Inputs in{normals(p.key_elems(), rng),   normals(p.key_elems(), rng),   normals(p.value_elems(), rng),
            normals(p.state_elems(), rng), normals(p.value_elems(), rng), normals(p.state_elems(), rng),
            normals(p.gate_elems(), rng),  normals(p.beta_elems(), rng),  normals(p.beta_elems(), rng, 2.0)};
  for (double& z : in.g) z = -std::log1p(std::exp(-z)) / gate_norm;
  for (double& z : in.dt) z = std::log1p(std::exp(z));
  return in;
}

Problem trapezoidal(int batch, int heads, int seq, int dim, int rank) {
  Problem p{batch, heads, seq, dim, 64, Decay::scalar, Rule::trapezoidal};
  p.rank = rank;
  return p;
}

struct Outputs {
  std::vector<double> o, hT;
};

Outputs run_forward(const Problem& p, const Inputs& in) {
  Outputs out{std::vector<double>(p.value_elems()), std::vector<double>(p.state_elems())};
  ForwardArgs<double> a{in.q.data(), in.k.data(), in.v.data(), in.h0.data(), out.o.data(), out.hT.data(), in.g.data()};
  a.dt = in.dt.data();
  a.trap = in.trap.data();
  reference::forward(p, a);
  return out;
}

double loss(const Problem& p, const Inputs& in) {
  const Outputs out = run_forward(p, in);
  double l = 0;
  for (std::size_t i = 0; i < out.o.size(); ++i) l += out.o[i] * in.dO[i];
  for (std::size_t i = 0; i < out.hT.size(); ++i) l += out.hT[i] * in.dhT[i];
  return l;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("trapezoidal reference forward equals the authors' closed form", "[reference][trapezoidal]") {
  // With G_t = g_0 + .. + g_t, mu_t = (1 - lambda_t) dt_t (0 past the end) and
  // c_s = lambda_s dt_s + mu_{s+1}, row r of token t reads
  //   O_t[r] = exp(G_t) q_{t,r} h0 + sum_{s <= t} exp(G_t - G_s) c_s sum_r' (q_{t,r} . k_{s,r'}) v_{s,r'}
  //            - mu_{t+1} sum_r' (q_{t,r} . k_{t,r'}) v_{t,r'}
  // (mamba3_siso_fwd_ref's quadratic form, the scale and QK_dot terms).
  for (int rank : {1, 2, 4}) {
    Problem p = trapezoidal(2, 2, 9, 3, rank);
    p.dim_v = 5;
    const Inputs in = draw(p, 21, 1.0);
    const Outputs out = run_forward(p, in);
    const int Dk = p.dim, Dv = p.value_dim(), R = rank, T = p.seq;
    double worst = 0;
    for (std::size_t index = 0; index < p.slices(); ++index) {
      const HeadSlice h = p.slice(index);
      const double *q = &in.q[h.key], *k = &in.k[h.key], *v = &in.v[h.value], *h0 = &in.h0[h.state];
      const double *g = &in.g[h.gate], *dt = &in.dt[h.beta], *trap = &in.trap[h.beta];
      const auto mu = [&](int t) { return t < T ? (1 - sigmoid(trap[t])) * dt[t] : 0.0; };
      std::vector<double> G(T);
      for (int t = 0; t < T; ++t) G[t] = g[t] + (t ? G[t - 1] : 0.0);
      const auto dot = [&](int t, int r, int s, int r2) {
        double sum = 0;
        for (int i = 0; i < Dk; ++i) sum += q[(t * R + r) * Dk + i] * k[(s * R + r2) * Dk + i];
        return sum;
      };
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < R; ++r)
          for (int j = 0; j < Dv; ++j) {
            double expected = 0;
            for (int i = 0; i < Dk; ++i) expected += std::exp(G[t]) * q[(t * R + r) * Dk + i] * h0[i * Dv + j];
            for (int s = 0; s <= t; ++s) {
              const double c = sigmoid(trap[s]) * dt[s] + mu(s + 1);
              for (int r2 = 0; r2 < R; ++r2) expected += std::exp(G[t] - G[s]) * c * dot(t, r, s, r2) * v[(s * R + r2) * Dv + j];
            }
            for (int r2 = 0; r2 < R; ++r2) expected -= mu(t + 1) * dot(t, r, t, r2) * v[(t * R + r2) * Dv + j];
            worst = std::max(worst, std::abs(expected - out.o[h.value + std::size_t((t * R + r) * Dv + j)]));
          }
    }
    INFO("rank " << rank);
    CHECK(worst < 1e-12);
  }
}

TEST_CASE("trapezoidal reference: packed documents start with no previous token", "[reference][trapezoidal]") {
  // Each document of a packed row equals the same tokens run alone as one sequence: the previous
  // token's write does not cross a document boundary, and each starts from its own h0.
  for (int rank : {1, 2}) {
    Problem packed = trapezoidal(1, 2, 12, 3, rank);
    packed.heads_k = 1;
    packed.cu_seqlens = {0, 5, 6, 12};
    const Inputs in = draw(packed, 33, 1.0);
    const Outputs out = run_forward(packed, in);
    double worst = 0;
    for (std::size_t n = 0; n + 1 < packed.cu_seqlens.size(); ++n) {
      const int start = packed.cu_seqlens[n], length = packed.cu_seqlens[n + 1] - start;
      Problem alone = trapezoidal(1, 2, length, 3, rank);
      alone.heads_k = 1;
      Inputs part;
      const auto cut = [&](const std::vector<double>& x, std::size_t rows_of, std::size_t width) {
        std::vector<double> y;
        for (std::size_t head = 0; head < rows_of; ++head) {
          const std::size_t from = (head * packed.seq + start) * width;
          y.insert(y.end(), x.begin() + std::ptrdiff_t(from), x.begin() + std::ptrdiff_t(from + length * width));
        }
        return y;
      };
      const std::size_t R = std::size_t(rank), DD = std::size_t(9);
      part.q = cut(in.q, 1, R * 3), part.k = cut(in.k, 1, R * 3), part.v = cut(in.v, 2, R * 3);
      part.g = cut(in.g, 2, 1), part.dt = cut(in.dt, 2, 1), part.trap = cut(in.trap, 2, 1);
      part.h0.assign(in.h0.begin() + std::ptrdiff_t(n * 2 * DD), in.h0.begin() + std::ptrdiff_t((n + 1) * 2 * DD));
      const Outputs own = run_forward(alone, part);
      const std::vector<double> packed_o = cut(out.o, 2, R * 3);
      for (std::size_t i = 0; i < own.o.size(); ++i) worst = std::max(worst, std::abs(own.o[i] - packed_o[i]));
      for (std::size_t i = 0; i < own.hT.size(); ++i)
        worst = std::max(worst, std::abs(own.hT[i] - out.hT[n * 2 * DD + i]));
    }
    INFO("rank " << rank);
    CHECK(worst < 1e-13);
  }
}

TEST_CASE("trapezoidal reference gradients match central finite differences", "[reference][grad][trapezoidal]") {
  struct Shape {
    Problem p;
    double gate_norm;
  };
  std::vector<Shape> shapes;
  for (int rank : {1, 2, 4}) {
    shapes.push_back({trapezoidal(1, 2, 5, 3, rank), 16});
    shapes.push_back({trapezoidal(2, 1, 11, 4, rank), 1});  // strong gates, past one checkpoint segment
    Problem grouped = trapezoidal(1, 4, 7, 3, rank);        // two q/k heads of two value heads, Dv 2
    grouped.heads_k = 2;
    grouped.dim_v = 2;
    shapes.push_back({grouped, 1});
    Problem packed = trapezoidal(1, 2, 9, 2, rank);  // documents of 4, 1 and 4 tokens
    packed.cu_seqlens = {0, 4, 5, 9};
    shapes.push_back({packed, 1});
  }
  double worst_all = 0;
  for (const auto& [p, gate_norm] : shapes) {
    INFO(test::describe(p) << " rank " << p.rank << " gate_norm " << gate_norm << " heads_k " << p.qk_heads()
                           << " dim_v " << p.value_dim() << " documents " << p.sequences());
    Inputs in = draw(p, 5, gate_norm);
    std::vector<double> dq(p.key_elems()), dk(p.key_elems()), dv(p.value_elems()), dh0(p.state_elems());
    std::vector<double> dg(p.gate_elems()), ddt(p.beta_elems()), dtrap(p.beta_elems());
    BackwardArgs<double> a{in.q.data(), in.k.data(), in.v.data(), in.h0.data(), in.dO.data(), in.dhT.data(),
                           dq.data(),   dk.data(),   dv.data(),   dh0.data(),   in.g.data(),  dg.data()};
    a.dt = in.dt.data(), a.trap = in.trap.data(), a.ddt = ddt.data(), a.dtrap = dtrap.data();
    reference::backward(p, a);
    const auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      const double worst = test::worst_fd_error(x, grad, [&] { return loss(p, in); });
      worst_all = std::max(worst_all, worst);
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    check(in.q, dq, "dq");
    check(in.k, dk, "dk");
    check(in.v, dv, "dv");
    check(in.h0, dh0, "dh0");
    check(in.g, dg, "dg");
    check(in.dt, ddt, "ddt");
    check(in.trap, dtrap, "dtrap");
  }
  WARN("trapezoidal rule: worst finite-difference error " << worst_all);
}

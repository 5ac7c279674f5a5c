// The layer suite: the float64 reference's gradients against central finite differences, and the
// CPU layer's thread split (its correctness on every shape is the test table's, test_ops.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/layer/hybrid/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng, double stddev = 1.0) {
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

struct Params {
  std::vector<double> x, wq, wk, wv, wo, g, beta, dOut;
};

Params random_params(const LayerProblem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double w = 1.0 / std::sqrt(double(p.model_dim()));
  Params t{random_vector(p.token_elems(), rng),      random_vector(p.weight_elems(), rng, w),
           random_vector(p.weight_elems(), rng, w),  random_vector(p.weight_elems(), rng, w),
           random_vector(p.weight_elems(), rng, w),  random_vector(p.model_dim(), rng),
           random_vector(std::size_t(p.linear.heads), rng), random_vector(p.token_elems(), rng)};
  for (double& g : t.g) g = 1.0 + 0.3 * g;  // away from 1, so that dg is not just the norm's output
  return t;
}

double loss(const LayerProblem& p, const Params& t) {
  std::vector<double> out(p.token_elems());
  reference::layer_forward(p, {t.x.data(), t.wq.data(), t.wk.data(), t.wv.data(), t.wo.data(), t.g.data(),
                               t.beta.data(), out.data()});
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * t.dOut[i];
  return l;
}

}  // namespace

TEST_CASE("layer reference gradients match central finite differences", "[layer][reference][grad]") {
  // Shapes: a window shorter than T with two heads, retnet decay, and a window over T.
  const std::vector<LayerProblem> shapes = {
      {{1, 2, 7, 3, 64, Decay::none}, 3, false},
      {{2, 2, 6, 2, 64, Decay::retnet}, 2, false},
      {{1, 1, 5, 4, 64, Decay::none}, 9, false},
  };
  for (const LayerProblem& p : shapes) {
    INFO(test::describe(p.linear) << " W" << p.window);
    Params t = random_params(p, 21);
    std::vector<double> out(p.token_elems()), dx(p.token_elems()), dwq(p.weight_elems()), dwk(p.weight_elems()),
        dwv(p.weight_elems()), dwo(p.weight_elems()), dg(p.model_dim()), dbeta(std::size_t(p.linear.heads));
    reference::layer_forward_backward(p, {t.x.data(), t.wq.data(), t.wk.data(), t.wv.data(), t.wo.data(), t.g.data(),
                                          t.beta.data(), t.dOut.data(), out.data(), dx.data(), dwq.data(), dwk.data(),
                                          dwv.data(), dwo.data(), dg.data(), dbeta.data()});
    const double eps = 1e-6;
    auto check_gradient = [&](std::vector<double>& param, const std::vector<double>& grad, const char* name) {
      double worst = 0;
      for (std::size_t i = 0; i < param.size(); ++i) {
        const double saved = param[i];
        param[i] = saved + eps;
        const double plus = loss(p, t);
        param[i] = saved - eps;
        const double minus = loss(p, t);
        param[i] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        worst = std::max(worst, std::abs(numeric - grad[i]) / std::max(1.0, std::abs(numeric)));
      }
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    check_gradient(t.x, dx, "dx");
    check_gradient(t.wq, dwq, "dwq");
    check_gradient(t.wk, dwk, "dwk");
    check_gradient(t.wv, dwv, "dwv");
    check_gradient(t.wo, dwo, "dwo");
    check_gradient(t.g, dg, "dg");
    check_gradient(t.beta, dbeta, "dbeta");
  }
}

TEST_CASE("the CPU layer gives the same answer on one thread and on several", "[layer][threads]") {
  const LayerProblem p{{1, 1, 200, 8, 32, Decay::none}, 20, true};  // one head: the window's segments split it
  for (int threads : {1, 2, 3}) {
    INFO("threads " << threads);
    CHECK(test::run_cpu_case(test::layer_case(p, Mode::fwd_bwd), threads, 5).rel_err < 1e-5);
  }
}

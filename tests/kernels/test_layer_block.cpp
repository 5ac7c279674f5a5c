// The modern layer block (docs/spec.md section 2b, kernels/layer/block/block.hpp): the float64 reference's
// gradients of every input and weight against central finite differences of its own forward, for
// Gated DeltaNet, KDA, Mamba2 and Mamba-3 blocks and the kernel suite's gates inside the hybrid block;
// the Mamba-3 block's forward against its authors' recurrent (step) form written out here. (The
// CPU float32 block is held to this reference by the test table, tests/op_table.hpp.) And the
// float32 elementwise functions (block/elementwise.hpp) against their float64 forms, point by point.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/layer/block/elementwise.hpp"
#include "kernels/layer/block/mamba3.hpp"
#include "kernels/layer/block/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

using Tensors = std::map<std::string, std::vector<double>>;

// The op's inputs for the case (docs/spec.md section 2b's initialisation), widened, with the norm weight
// moved away from 1 so that its gradient is not just the norm's output.
Tensors inputs_of(const Case& c) {
  const TensorSet set = make_case_inputs(c, 5);
  Tensors t;
  for (const Tensor& tensor : set.tensors()) t[tensor.name] = widened(set, tensor.name);
  for (std::size_t i = 0; i < t["g"].size(); ++i) t["g"][i] = 1.0 + 0.1 * double(i % 7);
  // Mamba-3's biases, norm weights and skip start at 1: moved apart, so that each channel and head is its own.
  for (const char* name : {"b_bias", "c_bias", "b_norm", "c_norm", "d_skip"})
    if (auto it = t.find(name); it != t.end())
      for (std::size_t i = 0; i < it->second.size(); ++i) it->second[i] = 1.0 + 0.1 * double(int(i % 5) - 2) + 0.03 * double(i % 3);
  return t;
}

BlockArgs<double> bind(Tensors& t) {
  return block::bind_args<double>([&](const char* name) -> double* {
    auto it = t.find(name);
    return it == t.end() ? nullptr : it->second.data();
  });
}

double loss(const LayerProblem& p, Tensors t) {  // a copy: `out` is written
  t["out"].assign(p.token_elems(), 0.0);
  BlockArgs<double> a = bind(t);
  a.dOut = nullptr;
  reference::block_forward(p, a);
  double l = 0;
  for (std::size_t i = 0; i < t["out"].size(); ++i) l += t["out"][i] * t["dOut"][i];
  return l;
}

}  // namespace

TEST_CASE("the block reference's gradients match central finite differences", "[layer][block][reference][grad]") {
  std::vector<LayerProblem> shapes = test::block_test_shapes();
  for (const LayerProblem& p : test::mamba3_test_shapes()) shapes.push_back(p);
  for (const LayerProblem& shape : shapes) {
    LayerProblem p = shape;
    p.linear.seq = std::min(p.linear.seq, 9);  // a few tokens keep the differences quick
    p.linear.chunk = 4;
    const Case c = test::layer_case(p, Mode::fwd_bwd);
    INFO(test::describe(c));
    Tensors t = inputs_of(c);
    // Every gradient the case has, from the reference.
    std::vector<std::string> inputs;
    for (const TensorSpec& spec : c.op->tensors) {
      if (!spec.in(c)) continue;
      if (spec.role == Role::input) inputs.push_back(spec.name);
      if (spec.role == Role::gradient || spec.role == Role::output) {
        std::size_t n = 1;
        for (std::size_t d : spec.shape(c)) n *= d;
        t[spec.name].assign(n, 0.0);
      }
    }
    reference::block_forward_backward(p, bind(t));
    std::mt19937_64 rng(3);
    int compared = 0;
    for (const std::string& name : inputs) {
      const std::vector<double>& grad = t.at("d" + name);
      double scale = 0;
      for (double g : grad) scale = std::max(scale, std::abs(g));
      std::uniform_int_distribution<std::size_t> pick(0, grad.size() - 1);
      for (int trial = 0; trial < 6; ++trial) {
        const std::size_t i = pick(rng);
        const double h = 1e-5 * std::max(1.0, std::abs(t[name][i]));
        Tensors plus = t, minus = t;
        plus[name][i] += h;
        minus[name][i] -= h;
        const double numeric = (loss(p, plus) - loss(p, minus)) / (2 * h);
        INFO(name << "[" << i << "]: analytic " << grad[i] << ", numeric " << numeric);
        CHECK(std::abs(numeric - grad[i]) <= 1e-6 * scale + 1e-9);
        ++compared;
      }
    }
    CHECK(compared >= 6 * 7);  // x and at least six weights per shape
  }
}

// The authors' recurrent form of the Mamba-3 block (state-spaces/mamba: Mamba3.forward's in_proj
// split, norms, dt and A, then tests/ops/triton/test_mamba3_siso.py's mamba3_siso_step_ref token by
// token: the angle state advanced by pi tanh(angle) dt, q and k biased then rotated, the state decayed
// and written with the previous and the current token, out = S q + D v, gated by silu(z)), in plain
// loops; the reference's block (the chunk-free unrolled kernel inside) must give the same out.
TEST_CASE("the Mamba-3 block reference matches the authors' step form", "[layer][block][reference][mamba3]") {
  for (const LayerProblem& shape : test::mamba3_test_shapes()) {
    const LayerProblem& p = shape;
    const Case c = test::layer_case(p, Mode::fwd);
    INFO(test::describe(c));
    Tensors t = inputs_of(c);
    t["out"].assign(p.token_elems(), 0.0);
    BlockArgs<double> a = bind(t);
    a.dOut = nullptr;
    reference::block_forward(p, a);

    const int B = p.linear.batch, H = p.linear.heads, T = p.linear.seq, Dh = p.linear.dim, M = H * Dh;
    const int G = p.block.bc_groups, nA = block::mamba3::rope_angles(Dh, p.block.rope_fraction);
    const double pi = 3.14159265358979323846;
    // x row times a [M][n] weight's column j.
    auto project = [&](const double* x, const std::vector<double>& w, int n, int j) {
      double sum = 0;
      for (int i = 0; i < M; ++i) sum += x[i] * w[std::size_t(i) * n + j];
      return sum;
    };
    auto rotated = [&](std::vector<double> u, const std::vector<double>& angle) {
      for (int i = 0; i < nA; ++i) {
        const double u0 = u[2 * i], u1 = u[2 * i + 1];
        u[2 * i] = u0 * std::cos(angle[i]) - u1 * std::sin(angle[i]);
        u[2 * i + 1] = u0 * std::sin(angle[i]) + u1 * std::cos(angle[i]);
      }
      return u;
    };
    std::vector<double> y(p.token_elems(), 0.0);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int gi = h / (H / G);
        std::vector<double> S(std::size_t(Dh) * Dh, 0.0), k_prev(Dh, 0.0), v_prev(Dh, 0.0), angle(nA, 0.0);
        for (int t_ = 0; t_ < T; ++t_) {
          const double* x = t["x"].data() + (std::size_t(b) * T + t_) * M;
          const double dt = std::log1p(std::exp(project(x, t["wa"], H, h) + t["dt_bias"][h]));
          const double dd_a = project(x, t["wda"], H, h);
          const double A = -std::max(dd_a >= 0 ? 1 + dd_a : 1 / (1 - dd_a), 1e-4);
          const double lambda = 1 / (1 + std::exp(-project(x, t["wtrap"], H, h)));
          for (int i = 0; i < nA; ++i) angle[i] += pi * std::tanh(project(x, t["wangle"], nA, i)) * dt;
          std::vector<double> kq[2];
          const char* weight[2] = {"wk", "wq"};
          const char* norm[2] = {"b_norm", "c_norm"};
          const char* bias[2] = {"b_bias", "c_bias"};
          for (int which = 0; which < 2; ++which) {
            std::vector<double> u(Dh);
            double squares = 0;
            for (int j = 0; j < Dh; ++j) {
              u[j] = project(x, t[weight[which]], G * Dh, gi * Dh + j);
              squares += u[j] * u[j];
            }
            const double r = 1 / std::sqrt(squares / Dh + 1e-5);
            for (int j = 0; j < Dh; ++j) u[j] = u[j] * r * t[norm[which]][j] + t[bias[which]][std::size_t(h) * Dh + j];
            kq[which] = rotated(u, angle);
          }
          std::vector<double> v(Dh), z(Dh);
          for (int j = 0; j < Dh; ++j) {
            v[j] = project(x, t["wv"], M, h * Dh + j);
            z[j] = project(x, t["wz"], M, h * Dh + j);
          }
          const double alpha = std::exp(A * dt), beta = (1 - lambda) * dt * alpha, gamma = lambda * dt;
          for (int i = 0; i < Dh; ++i)
            for (int j = 0; j < Dh; ++j)
              S[std::size_t(i) * Dh + j] =
                  alpha * S[std::size_t(i) * Dh + j] + beta * k_prev[i] * v_prev[j] + gamma * kq[0][i] * v[j];
          for (int j = 0; j < Dh; ++j) {
            double o = t["d_skip"][h] * v[j];
            for (int i = 0; i < Dh; ++i) o += S[std::size_t(i) * Dh + j] * kq[1][i];
            y[(std::size_t(b) * T + t_) * M + std::size_t(h) * Dh + j] = o * z[j] / (1 + std::exp(-z[j]));
          }
          k_prev = kq[0];
          v_prev = v;
        }
      }
    double worst = 0, size = 0;
    for (std::size_t row = 0; row < p.rows(); ++row)
      for (int j = 0; j < M; ++j) {
        double out = 0;
        for (int i = 0; i < M; ++i) out += y[row * M + i] * t["wo"][std::size_t(i) * M + j];
        worst = std::max(worst, std::abs(out - t["out"][row * M + j]));
        size = std::max(size, std::abs(out));
      }
    INFO("largest |out| " << size << ", largest difference " << worst);
    CHECK(size > 0.1);
    CHECK(worst <= 1e-10 * size);
  }
}

// The float32 forms run on exp_nonpositive and a log1p series: each within a few float32 ulps of
// the float64 form across the range the block's pre-activations take (and far past it, where exp
// underflows and softplus(z) must become z or 0 without a NaN).
TEST_CASE("the block's float32 elementwise functions match their float64 forms", "[layer][block]") {
  double worst[4] = {};
  for (int i = -80000; i <= 80000; ++i) {
    const float z = float(i) * 1e-3f;
    const double zd = z;
    const double got[4] = {block::sigmoid(z), block::softplus(z), block::silu(z), block::silu_grad(z)};
    const double want[4] = {block::sigmoid(zd), block::softplus(zd), block::silu(zd), block::silu_grad(zd)};
    for (int f = 0; f < 4; ++f) {
      REQUIRE(std::isfinite(got[f]));
      // Relative to the value, with an absolute floor where the value itself vanishes (sigmoid and
      // softplus of large negative z); silu_grad = s (1 + z (1 - s)) crosses zero near z = -1.28 by
      // cancellation, so its error is relative to the size of its terms.
      const double s = want[0], size = f == 3 ? s * (1.0 + std::fabs(zd) * (1.0 - s)) : std::fabs(want[f]);
      const double err = std::fabs(got[f] - want[f]) / std::max(size, 1e-6);
      worst[f] = std::max(worst[f], err);
    }
  }
  INFO("worst relative error: sigmoid " << worst[0] << ", softplus " << worst[1] << ", silu " << worst[2]
                                        << ", silu_grad " << worst[3]);
  for (double w : worst) CHECK(w < 1e-6);
}

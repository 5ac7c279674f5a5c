// The modern layer block (docs/spec.md section 2b, kernels/layer/block/block.hpp): the float64 reference's
// gradients of every input and weight against central finite differences of its own forward, for
// Gated DeltaNet, KDA and Mamba2 blocks, RWKV-7's time mixing (rule dplr, block/rwkv7.hpp) and the
// kernel suite's gates inside the hybrid block. (The
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
  for (const LayerProblem& p : test::rwkv7_test_shapes()) shapes.push_back(p);
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

// The modern layer block (docs/spec.md section 2b, kernels/layer/block/block.hpp): the float64 reference's
// gradients of every input and weight against central finite differences of its own forward, for
// Gated DeltaNet, KDA, Mamba2 and Mamba-3 blocks, RWKV-7's time mixing (rule dplr, block/rwkv7.hpp)
// and the kernel suite's gates inside the hybrid block; the Mamba-3 block's forward against its
// authors' recurrent (step) form written out here. (The
// CPU float32 block is held to this reference by the test table, tests/op_table.hpp.) And the
// float32 elementwise functions (block/elementwise.hpp) against their float64 forms, point by point;
// and RWKV-7's block against RWKV-7's recurrence written in its own naming.
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
  for (const LayerProblem& p : test::rwkv7_test_shapes()) shapes.push_back(p);
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

// RWKV-7's time mixing against its recurrence as RWKV-LM writes it (RWKV_Tmix_x070, first layer):
// the state V x K, the decay exp(-exp(w')) with w' = -softplus(-z) - 0.5, read along a = -kk and
// written along b = kk * alpha, the readout S r unscaled, the group norm with eps 64e-5. Written
// here in double with plain loops, independently of block/rwkv7.hpp's mapping onto the dplr rule.
TEST_CASE("RWKV-7's block equals RWKV-7's own recurrence", "[layer][block][rwkv7]") {
  for (const LayerProblem& p : test::rwkv7_test_shapes()) {
    const Case c = test::layer_case(p, Mode::fwd);
    INFO(test::describe(c));
    Tensors t = inputs_of(c);
    t["out"].assign(p.token_elems(), 0.0);
    BlockArgs<double> a = bind(t);
    a.dOut = nullptr;
    reference::block_forward(p, a);

    const int B = p.linear.batch, Tn = p.linear.seq, H = p.linear.heads, N = p.linear.dim, C = H * N;
    const int rw = p.block.decay_rank, ra = p.block.iclr_rank, rg = p.block.out_gate_rank;
    auto at = [&](const char* name, std::size_t i) { return t.at(name)[i]; };
    auto sig = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
    // y = x W for W [in][out] row-major.
    auto project = [&](const std::vector<double>& x, const char* w, int in, int out) {
      std::vector<double> y(std::size_t(out), 0.0);
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) y[std::size_t(o)] += x[std::size_t(i)] * at(w, std::size_t(i) * out + o);
      return y;
    };
    std::vector<double> mine(p.token_elems(), 0.0);
    for (int b = 0; b < B; ++b) {
      std::vector<double> state(std::size_t(H) * N * N, 0.0);  // [h][value i][key j]
      for (int tok = 0; tok < Tn; ++tok) {
        const std::size_t row = std::size_t(b) * Tn + tok;
        std::vector<std::vector<double>> xs(6, std::vector<double>(std::size_t(C)));
        for (int m = 0; m < 6; ++m)
          for (int ch = 0; ch < C; ++ch) {
            const double x = at("x", row * C + ch), prev = tok ? at("x", (row - 1) * C + ch) : 0.0;
            xs[std::size_t(m)][std::size_t(ch)] = x + (prev - x) * at("mix", std::size_t(m) * C + ch);
          }
        std::vector<double> r = project(xs[0], "wq", C, C), k = project(xs[2], "wk", C, C), v = project(xs[3], "wv", C, C);
        std::vector<double> hw = project(xs[1], "w1", C, rw), ha = project(xs[4], "a1", C, ra), hg = project(xs[5], "g1", C, rg);
        for (double& h : hw) h = std::tanh(h);
        for (double& h : hg) h = sig(h);
        std::vector<double> zw = project(hw, "w2", rw, C), za = project(ha, "a2", ra, C), gate = project(hg, "g2", rg, C);
        std::vector<double> decay(p.model_dim()), alpha(p.model_dim()), kk(p.model_dim());
        for (int ch = 0; ch < C; ++ch) {
          const double z = at("w0", ch) + zw[std::size_t(ch)];
          const double w_prime = -std::log1p(std::exp(-z)) - 0.5;  // -softplus(-z) - 0.5
          decay[std::size_t(ch)] = std::exp(-std::exp(w_prime));
          alpha[std::size_t(ch)] = sig(at("a0", ch) + za[std::size_t(ch)]);
          kk[std::size_t(ch)] = k[std::size_t(ch)] * at("k_k", ch);
        }
        for (int h = 0; h < H; ++h) {
          double norm = 0;
          for (int j = 0; j < N; ++j) norm += kk[std::size_t(h * N + j)] * kk[std::size_t(h * N + j)];
          for (int j = 0; j < N; ++j) kk[std::size_t(h * N + j)] /= std::max(std::sqrt(norm), 1e-12);
        }
        for (int ch = 0; ch < C; ++ch) k[std::size_t(ch)] *= 1.0 + (alpha[std::size_t(ch)] - 1.0) * at("k_a", ch);
        for (int h = 0; h < H; ++h) {
          double* S = state.data() + std::size_t(h) * N * N;
          const std::size_t c0 = std::size_t(h) * N;
          std::vector<double> y(std::size_t(N), 0.0);
          for (int i = 0; i < N; ++i) {
            double sa = 0;  // read along RWKV's a = -kk
            for (int j = 0; j < N; ++j) sa += -kk[c0 + j] * S[i * N + j];
            for (int j = 0; j < N; ++j)  // written along RWKV's b = kk * alpha
              S[i * N + j] = S[i * N + j] * decay[c0 + j] + k[c0 + j] * v[c0 + i] + sa * kk[c0 + j] * alpha[c0 + j];
            for (int j = 0; j < N; ++j) y[std::size_t(i)] += S[i * N + j] * r[c0 + j];
          }
          double mean = 0, var = 0, bonus = 0;
          for (int i = 0; i < N; ++i) mean += y[std::size_t(i)] / N;
          for (int i = 0; i < N; ++i) var += (y[std::size_t(i)] - mean) * (y[std::size_t(i)] - mean) / N;
          for (int j = 0; j < N; ++j) bonus += r[c0 + j] * k[c0 + j] * at("r_k", c0 + j);
          std::vector<double> u(std::size_t(C), 0.0);
          for (int i = 0; i < N; ++i) {
            const double normed = (y[std::size_t(i)] - mean) / std::sqrt(var + 64e-5) * at("g", c0 + i) + at("ln_b", c0 + i);
            u[c0 + i] = (normed + bonus * v[c0 + i]) * gate[c0 + i];
          }
          // out = u Wo: this head's share of every output channel.
          for (int o = 0; o < C; ++o) {
            double share = 0;
            for (int i = 0; i < N; ++i) share += u[c0 + i] * at("wo", (c0 + i) * C + o);
            mine[row * C + o] += share;
          }
        }
      }
    }
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      worst = std::max(worst, std::abs(t["out"][i] - mine[i]));
      scale = std::max(scale, std::abs(mine[i]));
    }
    INFO("largest difference " << worst << " against outputs up to " << scale);
    CHECK(scale > 0.1);
    CHECK(worst <= 1e-10 * scale);
  }
}

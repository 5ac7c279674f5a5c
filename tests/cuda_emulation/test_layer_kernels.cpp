// The CUDA layer's own kernels (kernels/layer/hybrid/cuda/kernels.cu), run in the emulation: the layout changes
// between rows [B*T][ld] and heads [B][H][T][Dh] (exact copies and sums, so held exactly), and the
// RMSNorm-and-gate forward and backward against a float64 implementation of what they compute
// (the steps of kernels/layer/hybrid/reference.cpp and kernels/layer/hybrid/cpu.cpp), intermediate rows and
// per-row sums included. Shapes: Dh below, at and above 32 and not a multiple of it, B*H*T not a
// multiple of a block's 8 warps, M not a multiple of 32 columns, B*T under 8 and over 256.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/run/check.hpp"
#include "kernels/layer/hybrid/cuda/kernels.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "core/random.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

struct Shape {
  int B, T, H, Dh;
};

const std::vector<Shape> kShapes = {{1, 1, 1, 1},  {2, 37, 3, 20}, {3, 7, 5, 40}, {2, 33, 2, 32},
                                    {1, 300, 1, 70}, {2, 150, 2, 3}, {1, 5, 4, 64}, {2, 9, 1, 100}};

LayerProblem layer_of(const Shape& s) {
  LayerProblem p;
  p.linear = Problem{s.B, s.H, s.T, s.Dh, 16, Decay::none};
  p.window = 4;
  return p;
}

std::string describe(const Shape& s) {
  return "B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " H" + std::to_string(s.H) + " Dh" + std::to_string(s.Dh);
}

std::vector<float> normal(std::size_t n, std::uint64_t stream, double stddev = 1.0, std::uint64_t seed = 21) {
  std::vector<float> v(n);
  fill_normal(v, seed, stream, stddev);
  return v;
}

// ||got - want|| <= 1e-5 max(||want||, scale) (float32 arithmetic on O(100)-term sums). `scale`
// is the size of the terms an output is the difference of, where they can cancel: at Dh = 1,
// dLin = r g sig dY (1 - r^2 Lin^2) is that term times eps / (Lin^2 + eps).
void expect_close(const char* name, const std::vector<float>& got, const std::vector<double>& want, double scale = 0) {
  const OutputError e = relative_l2_error(got.data(), want.data(), got.size());
  double norm = 0;
  for (double w : want) norm += w * w;
  norm = std::sqrt(norm);
  const double error = e.rel_err * (norm > 0 ? norm : 1.0);
  INFO(name << ": |got - want| " << error << ", |want| " << norm << ", scale " << scale << ", first non-finite "
            << e.first_non_finite);
  CHECK(e.first_non_finite < 0);
  CHECK(error <= 1e-5 * std::max(norm, scale));
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

TEST_CASE("emulation: the layer's layout kernels move every element once", "[emulation][layer]") {
  for (const Shape& s : kShapes) {
    INFO(describe(s));
    const LayerProblem p = layer_of(s);
    const int M = s.H * s.Dh, rows = s.B * s.T;
    const std::size_t N = std::size_t(rows) * M;
    // Rows of a wider tile (ld = 3M) at a column offset of M tell ld from M.
    const std::vector<float> wide = normal(std::size_t(rows) * 3 * M, 7);
    const DeviceBuffer wide_d = upload(wide), heads_d = output(N);
    cuda::layer_rows_to_heads(p, wide_d.f() + M, 3 * M, heads_d.f(), nullptr);
    const std::vector<float> heads = heads_d.floats();
    const std::vector<float> a = normal(N, 1), c = normal(N, 2);
    const DeviceBuffer a_d = upload(a), c_d = upload(c), sum_d = output(N), copy_d = output(N);
    cuda::layer_heads_to_rows(p, a_d.f(), c_d.f(), sum_d.f(), nullptr);
    cuda::layer_heads_to_rows(p, a_d.f(), nullptr, copy_d.f(), nullptr);
    const std::vector<float> sum = sum_d.floats(), copy = copy_d.floats();
    bool all_equal = true;
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.H; ++h)
        for (int t = 0; t < s.T; ++t)
          for (int j = 0; j < s.Dh; ++j) {
            const std::size_t head_at = ((std::size_t(b) * s.H + h) * s.T + t) * s.Dh + j;
            const std::size_t row = std::size_t(b) * s.T + t, col = std::size_t(h) * s.Dh + j;
            all_equal = all_equal && heads[head_at] == wide[row * 3 * M + M + col] &&
                        sum[row * M + col] == a[head_at] + c[head_at] && copy[row * M + col] == a[head_at];
          }
    CHECK(all_equal);
  }
}

TEST_CASE("emulation: the layer's norm and gate kernels match float64", "[emulation][layer]") {
  for (const Shape& s : kShapes) {
    INFO(describe(s));
    const LayerProblem p = layer_of(s);
    const int M = s.H * s.Dh, R = s.B * s.H * s.T;
    const std::size_t N = std::size_t(R) * s.Dh;
    std::vector<float> lin = normal(N, 1, 3.0), swa = normal(N, 2, 3.0),
                       dy = normal(N, 13), g = normal(M, 8, 0.3), beta = normal(s.H, 12);
    for (float& x : g) x += 1.0f;

    // float64: per (b, h, t) row of the heads layout; y, dy and dg_terms in the rows layout.
    std::vector<double> y(N), rinv(R), dlin(N), dswa(N), dg_terms(N), gate(R), dg(M, 0.0), dbeta(s.H, 0.0);
    double dlin_scale = 0;  // || r g sig dY ||, the first of dLin's two terms
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.H; ++h) {
        const double sig = sigmoid(beta[h]);
        for (int t = 0; t < s.T; ++t) {
          const std::size_t row = (std::size_t(b) * s.H + h) * s.T + t, at = row * s.Dh;
          const std::size_t out = (std::size_t(b) * s.T + t) * M + std::size_t(h) * s.Dh;
          double squares = 0, ul = 0, gate_sum = 0;
          for (int j = 0; j < s.Dh; ++j) squares += double(lin[at + j]) * lin[at + j];
          const double r = 1.0 / std::sqrt(squares / s.Dh + kRmsNormEps);
          rinv[row] = r;
          for (int j = 0; j < s.Dh; ++j) {
            const double gj = g[h * s.Dh + j], l = lin[at + j], d = dy[out + j];
            y[out + j] = sig * r * gj * l + (1 - sig) * swa[at + j];
            ul += gj * sig * d * l;
            gate_sum += d * (r * gj * l - swa[at + j]);
          }
          gate[row] = gate_sum;
          dbeta[h] += gate_sum * sig * (1 - sig);
          for (int j = 0; j < s.Dh; ++j) {
            const double gj = g[h * s.Dh + j], l = lin[at + j], d = dy[out + j];
            dlin[at + j] = r * gj * sig * d - r * r * r / s.Dh * ul * l;
            dlin_scale += (r * gj * sig * d) * (r * gj * sig * d);
            dswa[at + j] = (1 - sig) * d;
            dg_terms[out + j] = sig * r * d * l;
            dg[h * s.Dh + j] += sig * r * d * l;
          }
        }
      }

    const DeviceBuffer g_d = upload(g), beta_d = upload(beta), lin_d = upload(lin), swa_d = upload(swa), dy_d = upload(dy);
    const DeviceBuffer y_d = output(N), y_only_d = output(N), rinv_d = output(R);
    cuda::layer_norm_gate_forward(p, g_d.f(), beta_d.f(), lin_d.f(), swa_d.f(), y_d.f(), rinv_d.f(), nullptr);
    cuda::layer_norm_gate_forward(p, g_d.f(), beta_d.f(), lin_d.f(), swa_d.f(), y_only_d.f(), nullptr, nullptr);
    expect_close("y", y_d.floats(), y);
    expect_close("y (no rinv)", y_only_d.floats(), y);
    expect_close("rinv", rinv_d.floats(), rinv);

    const DeviceBuffer dlin_d = output(N), dswa_d = output(N), terms_d = output(N), gate_d = output(R), dg_d = output(M),
                       dbeta_d = output(s.H);
    cuda::layer_norm_gate_backward(p,
                                   {g_d.f(), beta_d.f(), lin_d.f(), swa_d.f(), rinv_d.f(), dy_d.f(), dlin_d.f(),
                                    dswa_d.f(), terms_d.f(), gate_d.f(), dg_d.f(), dbeta_d.f()},
                                   nullptr);
    expect_close("dlin", dlin_d.floats(), dlin, std::sqrt(dlin_scale));
    expect_close("dswa", dswa_d.floats(), dswa);
    expect_close("dg_terms", terms_d.floats(), dg_terms);
    expect_close("gate", gate_d.floats(), gate);
    expect_close("dg", dg_d.floats(), dg);
    expect_close("dbeta", dbeta_d.floats(), dbeta);
  }
}

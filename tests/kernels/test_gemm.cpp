// The packed products (kernels/cpu/packed_gemm.hpp) against a float64 product, at every vector
// width this build and CPU have, on 1 and 2 threads: sizes that are not multiples of the micro-tile,
// the depth block or the column block, every pair of transposes, beta 0 (C's old contents, NaN
// here, never read) and beta 1, leading dimensions wider than the matrices; and their scratch
// against the closed form; the same products in the two-step form and into panels. Then the hybrid
// layer on both product paths (kernels/layer/cpu/products.hpp).
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "src/run/counting_allocator.hpp"

using namespace lattn;

namespace {

struct VecOverride {
  explicit VecOverride(cpu::Vec vec) { cpu::set_vec_override(vec); }
  ~VecOverride() { cpu::set_vec_override(std::nullopt); }
  VecOverride(const VecOverride&) = delete;
  VecOverride& operator=(const VecOverride&) = delete;
};

struct Operands {
  int m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b;
  std::vector<float> A, B, C0;
};

Operands operands(int m, int n, int k, bool trans_a, bool trans_b, float c0, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Operands o{m, n, k, (trans_a ? m : k) + 3, (trans_b ? k : n) + 5, n + 2, trans_a, trans_b, {}, {}, {}};
  o.A.resize(std::size_t(trans_a ? k : m) * o.lda);
  o.B.resize(std::size_t(trans_b ? n : k) * o.ldb);
  o.C0.assign(std::size_t(m) * o.ldc, c0);
  for (float& x : o.A) x = uniform(rng);
  for (float& x : o.B) x = uniform(rng);
  if (!std::isnan(c0))
    for (float& x : o.C0) x = uniform(rng);
  return o;
}

// beta C0 + op(A) op(B) in float64, m x n.
std::vector<double> expected_product(const Operands& o, float beta) {
  std::vector<double> expected(std::size_t(o.m) * o.n);
  for (int i = 0; i < o.m; ++i)
    for (int j = 0; j < o.n; ++j) {
      double sum = beta != 0.0f ? double(beta) * o.C0[std::size_t(i) * o.ldc + j] : 0.0;
      for (int l = 0; l < o.k; ++l) {
        const double a = o.trans_a ? o.A[std::size_t(l) * o.lda + i] : o.A[std::size_t(i) * o.lda + l];
        const double b = o.trans_b ? o.B[std::size_t(j) * o.ldb + l] : o.B[std::size_t(l) * o.ldb + j];
        sum += a * b;
      }
      expected[std::size_t(i) * o.n + j] = sum;
    }
  return expected;
}

// The largest |C - expected| over the m x n block, relative to sqrt(k) (the products' scale); C's
// padding columns must keep their old values.
double max_error(const Operands& o, const std::vector<double>& expected, const std::vector<float>& C) {
  double worst = 0;
  for (int i = 0; i < o.m; ++i) {
    for (int j = 0; j < o.n; ++j) {
      const double error = std::abs(double(C[std::size_t(i) * o.ldc + j]) - expected[std::size_t(i) * o.n + j]) /
                           std::sqrt(double(o.k) + 1);
      if (!(error <= worst)) worst = std::isnan(error) ? 1e30 : error;  // a NaN (C never written) fails
    }
    for (int j = o.n; j < o.ldc; ++j) {
      const float before = o.C0[std::size_t(i) * o.ldc + j], after = C[std::size_t(i) * o.ldc + j];
      if (!(before == after || (std::isnan(before) && std::isnan(after)))) return 1e30;
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("the packed products match a float64 product at every width, shape and thread count", "[gemm]") {
  std::mt19937 rng(11);
  // (m, n, k): one micro-tile and less; sizes one past the micro-tiles and the depth block (256);
  // n = 4100, whose packed op(B) takes two slabs (256 rows of at most 4 MiB, then 44); a k of 0
  // (C = beta C).
  const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {15, 33, 17}, {29, 70, 257}, {131, 45, 300},
                           {9, 4100, 300}, {300, 97, 530}, {7, 20, 0}};
  // Each operand set and its float64 product once; every width and thread count against it.
  for (const auto& shape : shapes)
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true})
        for (const float beta : {0.0f, 1.0f}) {
          const int m = shape[0], n = shape[1], k = shape[2];
          const Operands o = operands(m, n, k, trans_a, trans_b,
                                      beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 0.0f, rng);
          const std::vector<double> expected = expected_product(o, beta);
          for (const cpu::Vec vec : cpu::available_vecs()) {
            const VecOverride width(vec);
            for (const int threads : {1, 2}) {
              omp_set_num_threads(threads);
              INFO(cpu::to_string(vec) << " threads " << threads << " m " << m << " n " << n << " k " << k
                                       << " trans_a " << trans_a << " trans_b " << trans_b << " beta " << beta);
              std::vector<float> C = o.C0;
              CountingAllocator allocator;
              cpu::gemm::parallel_multiply(trans_a, trans_b, m, n, k, o.A.data(), o.lda, o.B.data(), o.ldb, beta,
                                           C.data(), o.ldc, allocator);
              CHECK(max_error(o, expected, C) < 1e-5);
              CHECK(allocator.peak_bytes() == cpu::gemm::parallel_scratch_bytes(m, n, k));
              CHECK(allocator.live_bytes() == 0);

              // The two-step form: op(B) packed whole, then two row ranges against it.
              std::vector<float> packed(cpu::gemm::packed_b_floats(k, n) + 1, -3.0f);
              cpu::gemm::pack_b(trans_b, k, n, o.B.data(), o.ldb, packed.data());
              CHECK(packed.back() == -3.0f);  // packed_b_floats covers all it wrote
              std::vector<float> C2 = o.C0;
              const int split = m / 2;
              std::vector<float> scratch(cpu::gemm::packed_a_floats(std::max(split, m - split), k));
              for (const int half : {0, 1}) {
                const int r0 = half == 0 ? 0 : split, rows = half == 0 ? split : m - split;
                const float* a_rows = trans_a ? o.A.data() + r0 : o.A.data() + std::size_t(r0) * o.lda;
                cpu::gemm::multiply_packed(trans_a, rows, n, k, a_rows, o.lda, packed.data(), beta,
                                           C2.data() + std::size_t(r0) * o.ldc, o.ldc, scratch.data());
              }
              CHECK(max_error(o, expected, C2) < 1e-5);

              // The panel form: C's columns in panels of panel_width(), each in a buffer of its own,
              // gathered back into C's layout to compare.
              const int nr = cpu::gemm::panel_width(), panel_ld = nr + 1;
              std::vector<std::vector<float>> panel_store;
              std::vector<float*> panels;
              for (int j0 = 0; j0 < n; j0 += nr) {
                std::vector<float>& panel = panel_store.emplace_back(std::size_t(m) * panel_ld, -7.0f);
                for (int i = 0; i < m; ++i)
                  for (int j = 0; j < std::min(nr, n - j0); ++j)
                    panel[std::size_t(i) * panel_ld + j] = o.C0[std::size_t(i) * o.ldc + j0 + j];
              }
              for (auto& panel : panel_store) panels.push_back(panel.data());
              CountingAllocator panel_allocator;
              cpu::gemm::parallel_multiply_to_panels(trans_a, trans_b, m, n, k, o.A.data(), o.lda, o.B.data(), o.ldb,
                                                     beta, panels.data(), panel_ld, panel_allocator);
              CHECK(panel_allocator.peak_bytes() == cpu::gemm::parallel_scratch_bytes(m, n, k));
              std::vector<float> C3 = o.C0;
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) C3[std::size_t(i) * o.ldc + j] = panels[j / nr][std::size_t(i) * panel_ld + j % nr];
              CHECK(max_error(o, expected, C3) < 1e-5);
            }
          }
        }
  omp_set_num_threads(2);
}

TEST_CASE("the packed products name their micro-kernel", "[gemm]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    const VecOverride width(vec);
    CHECK(cpu::gemm::available() == (vec != cpu::Vec::generic));
    CHECK(std::string(cpu::gemm::kernel_name()) ==
          (vec == cpu::Vec::avx512 ? "avx512_14x32" : vec == cpu::Vec::avx2 ? "avx2_6x16" : "none"));
  }
}

// The hybrid layer on both product paths at every width: each call's scratch equals its closed form,
// and the two paths give the same outputs and gradients. M = 48 is a multiple of the AVX2 panel (16)
// but not of the AVX-512 one (32): the input projection then takes one product per weight there, and
// one against [Wq Wk Wv] packed side by side at AVX2; 150 rows leave a short last row tile. Head
// dim 32 (a multiple of both panels) has the packed path write Q, K, V straight into the per-head
// layouts, from row tiles that two sequences of 75 tokens cut in two.
TEST_CASE("the layer's products: both paths agree, and their scratch equals the closed form", "[gemm][layer]") {
  omp_set_num_threads(2);
  for (const LayerProblem& shape : {LayerProblem{{1, 2, 150, 24, 64, Decay::none}, 40, false},
                                    LayerProblem{{2, 2, 75, 32, 64, Decay::none}, 40, false}})
  for (const bool chunked : {false, true}) {
    LayerProblem p = shape;
    p.chunked = chunked;
    const std::size_t N = p.token_elems(), W = p.weight_elems(), M = p.model_dim();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto filled = [&](std::size_t n, float scale) {
      std::vector<float> v(n);
      for (float& x : v) x = scale * normal(rng);
      return v;
    };
    const float w_scale = 1.0f / std::sqrt(float(M));
    const auto x = filled(N, 1), wq = filled(W, w_scale), wk = filled(W, w_scale), wv = filled(W, w_scale),
               wo = filled(W, w_scale), g = filled(M, 1), beta = filled(std::size_t(p.linear.heads), 1),
               d_out = filled(N, 1);
    for (const cpu::Vec vec : cpu::available_vecs()) {
      const VecOverride width(vec);
      std::vector<std::vector<float>> results[2];
      for (const cpu::ProductPath path : {cpu::ProductPath::openblas, cpu::ProductPath::packed}) {
        cpu::set_product_path(path);
        INFO(cpu::to_string(vec) << " " << cpu::product_path_name() << (chunked ? " chunked" : " scan") << " D"
                                 << p.linear.dim);
        std::vector<float> out(N), dx(N), dwq(W), dwk(W), dwv(W), dwo(W), dg(M), dbeta(std::size_t(p.linear.heads));
        CountingAllocator fwd, bwd;
        cpu::layer_forward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(), out.data()},
                           fwd);
        CHECK(fwd.peak_bytes() == cpu::layer_forward_workspace_bytes(p));
        std::vector<float> out2(N);
        cpu::layer_forward_backward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(),
                                        d_out.data(), out2.data(), dx.data(), dwq.data(), dwk.data(), dwv.data(),
                                        dwo.data(), dg.data(), dbeta.data()},
                                    bwd);
        CHECK(bwd.peak_bytes() == cpu::layer_forward_backward_workspace_bytes(p));
        CHECK(fwd.live_bytes() == 0);
        CHECK(bwd.live_bytes() == 0);
        results[path == cpu::ProductPath::packed] = {out, out2, dx, dwq, dwk, dwv, dwo, dg, dbeta};
      }
      cpu::set_product_path(std::nullopt);
      for (std::size_t t = 0; t < results[0].size(); ++t) {
        double diff = 0, norm = 0;
        for (std::size_t i = 0; i < results[0][t].size(); ++i) {
          diff += std::pow(double(results[0][t][i]) - results[1][t][i], 2);
          norm += std::pow(double(results[0][t][i]), 2);
        }
        INFO(cpu::to_string(vec) << " tensor " << t << (chunked ? " chunked" : " scan"));
        CHECK(std::sqrt(diff / norm) < 1e-4);
      }
    }
  }
}

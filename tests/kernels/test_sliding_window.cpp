// The sliding-window kernel (CPU float32) and its float64 reference against a naive masked softmax
// over the full T x T scores, forward and backward: window 1, window >= T, T not a multiple of the
// query block, one thread and several (the backward's segmented path), and huge scores.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "src/run/counting_allocator.hpp"
#include "kernels/sliding_window/cpu.hpp"
#include "kernels/sliding_window/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// The T x T scores of each head, -inf outside the causal window, softmax, then o = P V; the
// backward through the same full matrices. No blocking, no lse: nothing shared with the kernels.
struct Naive {
  std::vector<double> o, dq, dk, dv;
};

Naive naive_window_attention(const Problem& p, int window, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dO) {
  const int T = p.seq, D = p.dim;
  const double s = 1.0 / std::sqrt(double(D));
  Naive out{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(q.size()),
            std::vector<double>(q.size())};
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    const std::size_t base = bh * p.head_token_elems();
    std::vector<double> P(std::size_t(T) * T), dP(std::size_t(T) * T);
    for (int t = 0; t < T; ++t) {
      double m = -INFINITY;
      for (int u = 0; u < T; ++u) {
        double score = -INFINITY;
        if (u <= t && u > t - window) {
          score = 0;
          for (int j = 0; j < D; ++j) score += q[base + t * D + j] * k[base + u * D + j];
          score *= s;
        }
        P[t * T + u] = score;
        m = std::max(m, score);
      }
      double sum = 0;
      for (int u = 0; u < T; ++u) sum += (P[t * T + u] = std::exp(P[t * T + u] - m));
      for (int u = 0; u < T; ++u) P[t * T + u] /= sum;
      for (int j = 0; j < D; ++j)
        for (int u = 0; u < T; ++u) out.o[base + t * D + j] += P[t * T + u] * v[base + u * D + j];
    }
    for (int t = 0; t < T; ++t) {
      double delta = 0;
      for (int u = 0; u < T; ++u) {
        double d = 0;
        for (int j = 0; j < D; ++j) d += dO[base + t * D + j] * v[base + u * D + j];
        dP[t * T + u] = d;
        delta += P[t * T + u] * d;
      }
      for (int u = 0; u < T; ++u) {
        const double dS = P[t * T + u] * (dP[t * T + u] - delta) * s;
        for (int j = 0; j < D; ++j) {
          out.dq[base + t * D + j] += dS * k[base + u * D + j];
          out.dk[base + u * D + j] += dS * q[base + t * D + j];
          out.dv[base + u * D + j] += P[t * T + u] * dO[base + t * D + j];
        }
      }
    }
  }
  return out;
}

double rel_err(const std::vector<float>& x, const std::vector<double>& ref) {
  return relative_l2_error(x.data(), ref.data(), x.size()).rel_err;
}
double rel_err(const std::vector<double>& x, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);  // window 1: dq = dk = 0 exactly
}

std::vector<float> narrowed(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace

TEST_CASE("the float64 sliding-window reference equals a naive masked softmax", "[window][reference]") {
  for (const test::WindowShape& shape : test::window_test_shapes()) {
    const Problem& p = shape.p;
    INFO(test::describe(p) << " W" << shape.window);
    std::mt19937_64 rng(7);
    const auto q = random_vector(p.token_elems(), rng), k = random_vector(p.token_elems(), rng),
               v = random_vector(p.token_elems(), rng), dO = random_vector(p.token_elems(), rng);
    const Naive naive = naive_window_attention(p, shape.window, q, k, v, dO);
    std::vector<double> o(q.size()), dq(q.size()), dk(q.size()), dv(q.size());
    reference::sliding_window_forward(p, shape.window, q.data(), k.data(), v.data(), o.data(), nullptr);
    reference::sliding_window_backward(p, shape.window, q.data(), k.data(), v.data(), dO.data(), dq.data(), dk.data(),
                                       dv.data());
    CHECK(rel_err(o, naive.o) < 1e-13);
    CHECK(rel_err(dq, naive.dq) < 1e-13);
    CHECK(rel_err(dk, naive.dk) < 1e-13);
    CHECK(rel_err(dv, naive.dv) < 1e-13);
  }
}

TEST_CASE("the CPU sliding-window kernel matches a naive masked softmax, forward and backward", "[window]") {
  // Each vector width: AVX-512 runs the forward's products on the tiled kernel, narrower ones on OpenBLAS.
  for (const cpu::Vec vec : cpu::available_vecs())
  for (int threads : {1, 2, 3}) {
    test::VecOverride force(vec);
    omp_set_num_threads(threads);
    for (const test::WindowShape& shape : test::window_test_shapes()) {
      const Problem& p = shape.p;
      INFO(test::describe(p) << " W" << shape.window << " threads " << threads << " " << cpu::to_string(vec));
      std::mt19937_64 rng(11);
      const auto q = random_vector(p.token_elems(), rng), k = random_vector(p.token_elems(), rng),
                 v = random_vector(p.token_elems(), rng), dO = random_vector(p.token_elems(), rng);
      // The float32 kernel sees the float32 inputs; so does the float64 naive version.
      const auto qf = narrowed(q), kf = narrowed(k), vf = narrowed(v), dOf = narrowed(dO);
      const Naive naive = naive_window_attention(p, shape.window, std::vector<double>(qf.begin(), qf.end()),
                                                 std::vector<double>(kf.begin(), kf.end()),
                                                 std::vector<double>(vf.begin(), vf.end()),
                                                 std::vector<double>(dOf.begin(), dOf.end()));
      CountingAllocator allocator;
      std::vector<float> o(q.size()), lse(p.heads_total() * p.seq), dq(q.size()), dk(q.size(), 5.0f), dv(q.size(), 5.0f);
      cpu::sliding_window_forward(p, shape.window, {qf.data(), kf.data(), vf.data(), o.data(), lse.data()}, allocator);
      cpu::sliding_window_backward(p, shape.window,
                                   {qf.data(), kf.data(), vf.data(), o.data(), lse.data(), dOf.data(), dq.data(),
                                    dk.data(), dv.data(), false},
                                   allocator);
      CHECK(rel_err(o, naive.o) < 1e-6);
      CHECK(rel_err(dq, naive.dq) < 1e-5);
      CHECK(rel_err(dk, naive.dk) < 1e-5);
      CHECK(rel_err(dv, naive.dv) < 1e-5);

      // accumulate: a second backward adds the same gradients again.
      cpu::sliding_window_backward(p, shape.window,
                                   {qf.data(), kf.data(), vf.data(), o.data(), lse.data(), dOf.data(), dq.data(),
                                    dk.data(), dv.data(), true},
                                   allocator);
      std::vector<double> twice(naive.dk.size());
      for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * naive.dk[i];
      CHECK(rel_err(dk, twice) < 1e-5);
      CHECK(allocator.live_bytes() == 0);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("huge scores neither overflow nor lose the largest weight", "[window]") {
  const Problem p{1, 1, 80, 8, 1, Decay::none};
  const int window = 16;
  std::mt19937_64 rng(3);
  // Scores of order 10^4: exp() of them overflows unless each row's maximum comes off first.
  const auto q = random_vector(p.token_elems(), rng, 100.0), k = random_vector(p.token_elems(), rng, 100.0),
             v = random_vector(p.token_elems(), rng), dO = random_vector(p.token_elems(), rng);
  const auto qf = narrowed(q), kf = narrowed(k), vf = narrowed(v), dOf = narrowed(dO);
  const Naive naive = naive_window_attention(p, window, std::vector<double>(qf.begin(), qf.end()),
                                             std::vector<double>(kf.begin(), kf.end()),
                                             std::vector<double>(vf.begin(), vf.end()),
                                             std::vector<double>(dOf.begin(), dOf.end()));
  CountingAllocator allocator;
  std::vector<float> o(q.size()), lse(p.seq), dq(q.size()), dk(q.size()), dv(q.size());
  cpu::sliding_window_forward(p, window, {qf.data(), kf.data(), vf.data(), o.data(), lse.data()}, allocator);
  cpu::sliding_window_backward(
      p, window, {qf.data(), kf.data(), vf.data(), o.data(), lse.data(), dOf.data(), dq.data(), dk.data(), dv.data(), false},
      allocator);
  for (float x : lse) REQUIRE(std::isfinite(x));
  // Softmax this sharp is nearly one-hot; float32 scores of 10^4 carry absolute errors of ~10^-3,
  // which move the few non-negligible weights by as much.
  CHECK(rel_err(o, naive.o) < 1e-3);
  CHECK(rel_err(dv, naive.dv) < 1e-3);
}

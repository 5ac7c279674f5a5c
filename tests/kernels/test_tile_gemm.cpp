// The packing helpers of the register-tiled chunked form (kernels/cpu/tile_gemm.hpp), checked
// element by element, padding included: the products read every float of a panel; and the banded
// k range of a product (the sliding window's P V) against float64 sums over that range. Its own
// executable: without AVX-512 or AVX2 (compiled and on this CPU) the products have no vector form,
// and the main below reports the test skipped (exit 77) instead of passing it.
#include <catch2/catch.hpp>

#include "catch_runner.hpp"

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/cpu/vec.hpp"

using namespace lattn::cpu;

TEST_CASE("transpose_packed gives the panels pack gives the transpose", "[tile]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // 16-multiples take the in-register path (48, 80: an odd number of 16s, half a panel of
  // padding); the rest the element-wise one.
  for (int D : {1, 5, 16, 17, 32, 33, 48, 64, 80, 100, 128}) {
    INFO("D = " << D);
    const std::size_t panel_floats = std::size_t(D) * tile::panel_cols(D);
    std::vector<float> X(std::size_t(D) * D);
    for (float& x : X) x = uniform(rng);
    std::vector<float> packed(panel_floats, -7.0f), expected(panel_floats, -7.0f), got(panel_floats, -7.0f);
    tile::pack(X.data(), D, false, D, D, nullptr, packed.data());
    tile::pack(X.data(), D, true, D, D, nullptr, expected.data());
    tile::transpose_packed(packed.data(), D, got.data());
    CHECK(got == expected);
  }
}

// Range::band: the micro-tile at rows i0 .. sums k over [i0 + lo, i0 + 8 + hi) clipped to [0, K),
// whatever A holds outside it (filled here with values that would show if read). M 21 leaves a
// tail tile of 5 rows, which takes the range of its own 5 rows.
TEST_CASE("a banded product sums each micro-tile's k range and nothing else", "[tile]") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int N = 40, K = 50;
  std::vector<float> B(std::size_t(K) * N);
  for (float& x : B) x = uniform(rng);
  std::vector<float> packed(std::size_t(K) * tile::panel_cols(N));
  tile::pack(B.data(), N, false, K, N, nullptr, packed.data());
  for (const int M : {8, 21, 32})
    for (const auto& [lo, hi] : {std::pair{0, 0}, std::pair{-20, 3}, std::pair{5, 30}, std::pair{-3, -4}}) {
      INFO("M " << M << " band " << lo << " " << hi);
      std::vector<float> A(std::size_t(M) * K);
      for (float& x : A) x = uniform(rng);
      std::vector<float> C(std::size_t(M) * N, 0.0f);
      tile::Product p;
      p.M = M;
      p.N = N;
      p.c = C.data();
      p.ldc = N;
      p.s1 = tile::seg(tile::Range::band, K, A.data(), K, 1, packed.data());
      p.s1.band_lo = lo;
      p.s1.band_hi = hi;
      tile::run(p);
      double worst = 0;
      for (int i = 0; i < M; ++i) {
        const int i0 = i / tile::kMR * tile::kMR, rows = std::min(tile::kMR, M - i0);
        const int k0 = std::clamp(i0 + lo, 0, K), k1 = std::clamp(i0 + rows + hi, k0, K);
        for (int j = 0; j < N; ++j) {
          double sum = 0;
          for (int k = k0; k < k1; ++k) sum += double(A[std::size_t(i) * K + k]) * B[std::size_t(k) * N + j];
          worst = std::max(worst, std::abs(sum - C[std::size_t(i) * N + j]));
        }
      }
      CHECK(worst < 1e-5);
    }
}

int main(int argc, char** argv) {
  if (!tiles_active() && active_vec() != Vec::avx2) {
    std::printf("SKIPPED: no AVX-512 or AVX2 here (built without them, or this CPU lacks them): the tile products "
                "run element by element\n");
    return 77;
  }
  const int failed = lattn::test::run_catch(argc, argv);
  return failed == 77 ? 78 : failed;  // 77 failures must not read as "skipped"
}

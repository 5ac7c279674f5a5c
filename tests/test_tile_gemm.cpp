// The packing helpers of the register-tiled chunked form (kernels/cpu/tile_gemm.hpp), checked
// element by element, padding included: the products read every float of a panel. Its own
// executable: without AVX-512 (compiled and on this CPU) the helpers are not built, and the main
// below reports the test skipped (exit 77) instead of passing it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <random>
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

int main(int argc, char** argv) {
  if (!tiles_active()) {
    std::printf("SKIPPED: no AVX-512 here (built without it, or this CPU lacks it): the tile products are not used\n");
    return 77;
  }
  const int failed = Catch::Session().run(argc, argv);
  return failed == 77 ? 78 : failed;  // 77 failures must not read as "skipped"
}

// The counted tiles (kernels/cpu/amx_counted.hpp): what they count against the analytic numbers of
// tile instructions for known shapes, products and whole AMX rows; and the AMX rows at D 1 to 3
// (the test table's smallest shapes) against the float64 reference, on the tiles the run tests.
// Part of lattn_amx_tests (test_amx.cpp's main). The counted path's outputs are not results (its tiles
// compute nothing): these tests check its counts and that what it stores is zeros, never its
// outputs' accuracy.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/amx_counted.hpp"
#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"
#include "amx_tests.hpp"
#include "test_util.hpp"

using namespace lattn;
namespace amx = lattn::cpu::amx;

namespace {

std::uint64_t tiles(int x, int to) { return std::uint64_t((x + to - 1) / to); }

// tdpbf16ps of one product M x N over K on whole tiles (M, N padded to 16, K to 32).
std::uint64_t products(int M, int N, int K) { return tiles(M, 16) * tiles(N, 16) * tiles(K, 32); }

// The tensors of a bf16 case, as a kernel takes them.
struct Bf16Case {
  TensorSet t;
  std::vector<cpu::Bf16> q, k, v;
  std::vector<float> o, hT;
  Bf16Case(const Problem& p) : t(make_case_inputs(test::kernel_case(p, "chunked", Mode::fwd, "cpu", "bf16"), 0)) {
    const auto bits = [&](const char* name) {
      std::vector<cpu::Bf16> out(t.at(name).data.size());
      std::transform(t.at(name).data.begin(), t.at(name).data.end(), out.begin(), float_to_bf16_bits);
      return out;
    };
    q = bits("q"), k = bits("k"), v = bits("v");
    o.assign(p.value_elems(), 1.0f);
    hT.assign(p.state_elems(), 1.0f);
  }
  cpu::Bf16ForwardArgs args() {
    const auto input = [&](const char* name) { return t.find(name) ? t.find(name)->data.data() : nullptr; };
    return {q.data(), k.data(), v.data(), t.at("h0").data.data(), o.data(), hT.data(), input("g"), input("beta")};
  }
};

}  // namespace

TEST_CASE("amx counted: a product's tile instructions, counted, and zeros stored", "[amx][counted]") {
  for (const auto& [M, N, K] : {std::array<int, 3>{16, 16, 32}, {32, 32, 64}, {48, 80, 96}, {64, 16, 128}})
    for (const bool accumulate : {false, true}) {
      INFO("M " << M << " N " << N << " K " << K << (accumulate ? " accumulating" : ""));
      std::vector<std::uint16_t> a(std::size_t(M) * K, 0x3f80);
      std::vector<std::uint32_t> b(std::size_t(K) / 2 * N, 0x3f803f80u);
      std::vector<float> c(std::size_t(M) * N, 7.0f);
      amx::counted::reset();
      amx::configure<amx::Counted>();
      amx::gemm<amx::Counted>(M, N, K, a.data(), K, b.data(), N, c.data(), N, accumulate);
      amx::Counted::release();
      const amx::TileCounts t = amx::counted::totals();
      // Per block of C (2 x 2 tiles where they fit): its A and B tiles each step, its C tiles once.
      std::uint64_t loads = 0, blocks_tiles = 0;
      for (int m = 0; m < M; m += 32)
        for (int n = 0; n < N; n += 32) {
          const int mt = m + 32 <= M ? 2 : 1, nt = n + 32 <= N ? 2 : 1;
          loads += std::uint64_t(K / 32) * (mt + nt);
          blocks_tiles += std::uint64_t(mt) * nt;
        }
      CHECK(t.dpbf16ps == products(M, N, K));
      CHECK(t.loads == loads + (accumulate ? blocks_tiles : 0));
      CHECK(t.zeros == (accumulate ? 0 : blocks_tiles));
      CHECK(t.stores == blocks_tiles);
      CHECK(t.load_bytes == t.loads * 1024);
      CHECK(t.store_bytes == t.stores * 1024);
      CHECK(std::all_of(c.begin(), c.end(), [](float x) { return x == 0.0f; }));  // what the stores wrote
    }
}

TEST_CASE("amx counted: instructions outside a configuration fault as the emulation's do", "[amx][counted]") {
  amx::counted::reset();
  CHECK_THROWS_WITH(amx::Counted::load<0>(nullptr, 64), Catch::Matchers::Contains("no tile configuration"));
  amx::TileConfig bad = amx::uniform_config(8, 16, 64);
  bad.rows[0] = 20;
  CHECK_THROWS_WITH(amx::Counted::load_config(bad), Catch::Matchers::Contains("ldtilecfg"));
}

// Whole rows: the number of tile products each chunk's products take, from the maths of the row's
// file (chunked_amx.cpp, chunked_amx_delta.cpp), summed over every thread.
TEST_CASE("amx counted: the AMX rows' tdpbf16ps equal their analytic number", "[amx][counted]") {
  omp_set_num_threads(2);
  SECTION("chunked_amx, the additive rule: four products a chunk") {
    // B 2 H 2 (4 items), T 100 (chunks of 32: 32, 32, 32, 4), D 64.
    const Problem p{2, 2, 100, 64, 32, Decay::scalar};
    Bf16Case in(p);
    amx::counted::reset();
    CountingAllocator allocator;
    cpu::chunked_amx_forward(p, in.args(), allocator, cpu::AmxPath::counted);
    std::uint64_t per_item = 0;
    for (int c0 = 0; c0 < p.seq; c0 += p.chunk) {
      const int n = std::min(p.chunk, p.seq - c0), n16 = (n + 15) / 16 * 16, n32 = (n + 31) / 32 * 32;
      for (int m0 = 0; m0 < n16; m0 += 32) {
        const int rows = std::min(32, n16 - m0);
        per_item += products(rows, std::min(m0 + 32, n16), p.dim);     // Q K^T, up to the diagonal
        per_item += products(rows, p.dim, std::min(m0 + 32, n32));     // P V
      }
      per_item += products(n16, p.dim, p.dim) + products(p.dim, p.dim, n32);  // Q S, K_w^T V
    }
    CHECK(amx::counted::totals().dpbf16ps == per_item * 4);
    CHECK(allocator.live_bytes() == 0);
  }
  SECTION("chunked_amx_delta, decay none: seven products a chunk") {
    // T 70 with chunks of 32 (32, 32, 6), Dk 24, Dv 40 (ragged: padded to whole tiles).
    const Problem p{1, 2, 70, 24, 32, Decay::none, Rule::delta, 0, 40};
    Bf16Case in(p);
    amx::counted::reset();
    CountingAllocator allocator;
    cpu::chunked_amx_delta_forward(p, in.args(), allocator, cpu::AmxPath::counted);
    const int Dk = p.dim, Dv = p.value_dim();
    std::uint64_t per_item = 0;
    for (int c0 = 0; c0 < p.seq; c0 += p.chunk) {
      const int n = std::min(p.chunk, p.seq - c0);
      for (int m0 = 0; m0 < n; m0 += 32) {
        const int m1 = std::min(n, m0 + 32);
        per_item += 2 * products(m1 - m0, m1, Dk);  // A_qk and A_kk, per 32-row block up to the diagonal
        per_item += 2 * products(m1 - m0, Dv, m1);  // W = T R and A_qk W
      }
      per_item += products(n, Dv, Dk) + products(n, Dv, Dk) + products(Dk, Dv, n);  // E, Q S, the state
    }
    CHECK(amx::counted::totals().dpbf16ps == per_item * 2);
    CHECK(allocator.live_bytes() == 0);
  }
  omp_set_num_threads(omp_get_num_procs());
}

// The shapes of tests/cases.hpp's kernel table with D 1 (a single token, and nine tokens over
// chunks of 4), and D 2 and 3, which the AMX rows for vector gates and the delta rule take: few
// channels, so no reduction averages the bf16 roundings, and the delta rule's write cancels the
// state along its key (chunked_amx_delta splits its operands there); a few seeds each, gates of
// the default strength and strong ones.
TEST_CASE("amx chunked, vector gates and the delta rule: D 1 to 3 within the bf16 tolerance", "[amx]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  const std::vector<std::pair<Rule, Decay>> families = {{Rule::additive, Decay::vector},
                                                        {Rule::delta, Decay::none},
                                                        {Rule::delta, Decay::retnet},
                                                        {Rule::delta, Decay::scalar},
                                                        {Rule::delta, Decay::vector}};
  double worst_delta = 0;
  for (const auto& [rule, decay] : families)
    for (const Problem& p : {Problem{1, 1, 1, 1, 4, decay, rule}, Problem{1, 2, 9, 1, 4, decay, rule},
                             Problem{1, 2, 9, 2, 4, decay, rule}, Problem{1, 1, 37, 3, 16, decay, rule}})
      for (const Mode mode : {Mode::fwd, Mode::fwd_bwd})
        for (const std::string gate_norm : {"", "1"})
          for (const std::uint64_t seed : {3, 4, 5}) {
            if (!gate_norm.empty() && decay != Decay::scalar && decay != Decay::vector) continue;
            Case c = test::kernel_case(p, "chunked", mode, "cpu", "bf16");
            if (!gate_norm.empty()) c.options["gate_norm"] = gate_norm;
            INFO(test::describe(c) << " seed " << seed << " on the "
                                   << (amx_tests::hardware_run ? "hardware's" : "emulated") << " tiles");
            REQUIRE(backend->find("linear_attention", "chunked")->variant(c) ==
                    (rule == Rule::delta ? "chunked_amx_delta" : "chunked_amx_gated"));
            const test::Outcome r = test::run_on(*backend, c, seed);
            INFO(test::errors(r.check));
            CHECK(r.check.non_finite.empty());
            CHECK(r.check.passed);
            if (rule == Rule::delta) worst_delta = std::max(worst_delta, r.check.rel_err);
          }
  // The split operands carry ~16 bits: the delta rule's errors there are float32-like, far under
  // the bf16 tolerance (one bf16 product per operand pair left them at 5-15% on single outputs).
  WARN("chunked_amx_delta at D 1 to 3: worst rel_err " << worst_delta);
  CHECK(worst_delta < 1e-3);
}

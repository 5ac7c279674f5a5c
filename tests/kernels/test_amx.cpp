// AMX (kernels/cpu/amx.hpp, kernels/cpu/amx_gemm.hpp) and the chunked forms on its tiles
// (kernels/linear_attention/cpu/chunked/chunked_amx*.cpp); the layer's bf16 cases on them are in
// test_amx_layer.cpp, linked into the same executable. Its own executable, run twice by CTest:
//   amx_emulated  the kernels on the emulated tiles, on every CPU; and the emulated instructions
//                 themselves: tdpbf16ps on known values, the tile configuration's checks;
//   amx_hardware  (--hardware) the same kernel tests on the CPU's tiles, and the hardware's
//                 tdpbf16ps against the emulation bit for bit; exits 77 (skipped) where
//                 amx::hardware_refusal() gives a reason.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_runner.hpp"
#include "core/random.hpp"
#include "kernels/cpu/amx.hpp"
#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/layer/block/cpu.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"
#include "amx_tests.hpp"
#include "test_util.hpp"

using namespace lattn;
using amx_tests::hardware_run;
using amx_tests::tested_path;
using Catch::Matchers::Contains;
namespace amx = lattn::cpu::amx;

namespace {

std::uint16_t bf(float x) { return float_to_bf16_bits(x); }

float bits_float(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Loads a configuration for the scope (the emulated thread state), releases it after.
struct Configured {
  explicit Configured(const amx::TileConfig& c) { amx::Emulated::load_config(c); }
  ~Configured() { amx::Emulated::release(); }
  Configured(const Configured&) = delete;
  Configured& operator=(const Configured&) = delete;
};

// C (rows x cols float32) = C + A (rows x pairs bf16 pairs) B (pairs x cols bf16 pairs) on the
// emulated tiles 0 (C), 1 (A), 2 (B), each configured to exactly that shape.
std::vector<float> emulated_dp(int rows, int cols, int pairs, std::vector<float> c, const std::vector<std::uint16_t>& a,
                               const std::vector<std::uint16_t>& b) {
  amx::TileConfig config;
  config.palette = 1;
  config.rows[0] = std::uint8_t(rows);
  config.colsb[0] = std::uint16_t(4 * cols);
  config.rows[1] = std::uint8_t(rows);
  config.colsb[1] = std::uint16_t(4 * pairs);
  config.rows[2] = std::uint8_t(pairs);
  config.colsb[2] = std::uint16_t(4 * cols);
  const Configured on(config);
  amx::Emulated::load<0>(c.data(), std::size_t(4 * cols));
  amx::Emulated::load<1>(a.data(), std::size_t(4 * pairs));
  amx::Emulated::load<2>(b.data(), std::size_t(4 * cols));
  amx::Emulated::dpbf16ps<0, 1, 2>();
  amx::Emulated::store<0>(c.data(), std::size_t(4 * cols));
  return c;
}

Problem packed(std::vector<int> cu, int heads, int heads_k, int dim, int dim_v, int chunk, Decay decay, Rule rule) {
  Problem p{1, heads, cu.back(), dim, chunk, decay, rule, heads_k, dim_v};
  p.cu_seqlens = std::move(cu);
  return p;
}

// Ragged T (a short last chunk, and one not a multiple of 16), D 64 and 128, grouped heads with
// Dk != Dv, packed documents straddling chunk boundaries (one of a single token).
std::vector<Problem> shapes(Decay decay, Rule rule) {
  return {Problem{1, 2, 150, 64, 64, decay, rule}, Problem{1, 1, 200, 128, 128, decay, rule},
          Problem{2, 4, 75, 32, 32, decay, rule, 2, 64}, packed({0, 37, 38, 102, 141}, 2, 1, 32, 64, 32, decay, rule)};
}

// The AMX row that runs p: chunked_amx (the additive rule, decays none, retnet, scalar),
// chunked_amx_gated (vector gates), chunked_amx_delta (the delta rule), or none ("").
std::string amx_row(const Problem& p) {
  if (p.rule == Rule::delta) return cpu::chunked_amx_delta_limits(p) ? "" : "chunked_amx_delta";
  if (p.decay == Decay::vector) return cpu::chunked_amx_gated_limits(p) ? "" : "chunked_amx_gated";
  return cpu::chunked_amx_limits(p) ? "" : "chunked_amx";
}
bool amx_takes(const Problem& p) { return !amx_row(p).empty(); }

}  // namespace

TEST_CASE("amx emulation: tdpbf16ps on known values", "[amx]") {
  // One row, two columns, two pairs: C[0][n] = c + sum_p a[p] . b[p][n].
  const std::vector<std::uint16_t> a = {bf(1), bf(2), bf(3), bf(4)};       // pairs (1, 2), (3, 4)
  const std::vector<std::uint16_t> b = {bf(5), bf(6), bf(-1), bf(0.5f),    // row 0: (5, 6), (-1, 0.5)
                                        bf(7), bf(8), bf(2),  bf(0.25f)};  // row 1: (7, 8), (2, 0.25)
  const std::vector<float> c = emulated_dp(1, 2, 2, {10, 100}, a, b);
  CHECK(c[0] == 10 + 1 * 5 + 2 * 6 + 3 * 7 + 4 * 8);
  CHECK(c[1] == 100 + 1 * -1 + 2 * 0.5f + 3 * 2 + 4 * 0.25f);

  // The silicon's order: C + (low + high), the pairs' low halves and high halves summed to each other
  // before C. Two probes that tell it from (C + low) + high, as measured on an AMX-BF16 Xeon:
  // C 1 with halves 2^-24 and 2^-24 gives 1 + 2^-23 (the other order rounds 1 + 2^-24 to 1, a tie
  // to even, twice); C -2^24 with halves 2^24 and 1 gives 0 (2^24 + 1 rounds to 2^24 first; the
  // other order gives 1).
  const float tiny = std::ldexp(1.0f, -12);
  const std::vector<float> ordered = emulated_dp(1, 1, 1, {1.0f}, {bf(tiny), bf(tiny)}, {bf(tiny), bf(tiny)});
  CHECK(ordered[0] == 1.0f + std::ldexp(1.0f, -23));
  CHECK(amx::dpbf16_element(1.0f, std::vector<std::uint16_t>{bf(tiny), bf(tiny)}.data(),
                            std::vector<std::uint16_t>{bf(tiny), bf(tiny)}.data(), 1) == 1.0f + std::ldexp(1.0f, -23));
  const float two24 = std::ldexp(1.0f, 24);
  const std::vector<float> halves_first =
      emulated_dp(1, 1, 1, {-two24}, {bf(two24), bf(1.0f)}, {bf(1.0f), bf(1.0f)});
  CHECK(halves_first[0] == 0.0f);
  CHECK(amx::dpbf16_element(-two24, std::vector<std::uint16_t>{bf(two24), bf(1.0f)}.data(),
                            std::vector<std::uint16_t>{bf(1.0f), bf(1.0f)}.data(), 1) == 0.0f);

  // DAZ: a denormal bf16 input is zero (2^-133 x 2^100 would be 2^-33 otherwise).
  const std::uint16_t denormal = 0x0001, big = bf(std::ldexp(1.0f, 100));
  CHECK(emulated_dp(1, 1, 1, {0.0f}, {denormal, 0}, {big, 0})[0] == 0.0f);
  // FTZ: a product in float32's denormal range (2^-70 x 2^-70 = 2^-140) is flushed to zero.
  const std::uint16_t small = bf(std::ldexp(1.0f, -70));
  const float flushed = emulated_dp(1, 1, 1, {0.0f}, {small, 0}, {small, 0})[0];
  CHECK(flushed == 0.0f);
  CHECK_FALSE(std::signbit(flushed));
  // A denormal accumulator is read as zero too.
  CHECK(emulated_dp(1, 1, 1, {bits_float(1u)}, {bf(1), 0}, {bf(0), 0})[0] == 0.0f);
  // Rounding to nearest even in the accumulation: 2^24 + 1 is not a float32; 2^24 + 3 rounds up.
  CHECK(emulated_dp(1, 1, 1, {16777216.0f}, {bf(1), 0}, {bf(1), 0})[0] == 16777216.0f);
  CHECK(emulated_dp(1, 1, 1, {16777216.0f}, {bf(3), 0}, {bf(1), 0})[0] == 16777220.0f);
  // A NaN input gives a NaN.
  CHECK(std::isnan(emulated_dp(1, 1, 1, {0.0f}, {0x7fc0, 0}, {bf(1), 0})[0]));
}

TEST_CASE("amx emulation: loads and stores touch the configured rows and bytes only", "[amx]") {
  amx::TileConfig config = amx::uniform_config(1, 3, 8);
  const Configured on(config);
  std::vector<std::uint8_t> source(16 * 64);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = std::uint8_t(i + 1);
  amx::Emulated::load<0>(source.data(), 64);
  std::vector<std::uint8_t> out(16 * 64, 0xee);
  amx::Emulated::store<0>(out.data(), 64);
  for (int r = 0; r < 16; ++r)
    for (int x = 0; x < 64; ++x) {
      INFO("row " << r << " byte " << x);
      CHECK(out[std::size_t(r) * 64 + x] == (r < 3 && x < 8 ? source[std::size_t(r) * 64 + x] : 0xee));
    }
  amx::Emulated::zero<0>();
  amx::Emulated::store<0>(out.data(), 64);
  CHECK(out[0] == 0);
  CHECK(out[2 * 64 + 7] == 0);
  CHECK(out[3 * 64] == 0xee);
}

TEST_CASE("amx emulation: the tile configuration's checks", "[amx]") {
  CHECK_FALSE(amx::config_error(amx::uniform_config(8, 16, 64)));
  CHECK_FALSE(amx::config_error(amx::uniform_config(3, 1, 4)));
  const auto error = [](auto change) {
    amx::TileConfig c = amx::uniform_config(8, 16, 64);
    change(c);
    const std::optional<std::string> why = amx::config_error(c);
    return why.value_or("(accepted)");
  };
  CHECK_THAT(error([](amx::TileConfig& c) { c.palette = 0; }), Contains("palette 0"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.palette = 2; }), Contains("palette 2"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.start_row = 1; }), Contains("start_row"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.reserved[5] = 1; }), Contains("reserved"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.rows[2] = 17; }), Contains("tile 2") && Contains("17 rows"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.colsb[7] = 68; }), Contains("tile 7") && Contains("68 bytes"));
  CHECK_THAT(error([](amx::TileConfig& c) {
               c.rows[8] = 1;
               c.colsb[8] = 4;
             }),
             Contains("tile 8"));
  CHECK_THAT(error([](amx::TileConfig& c) { c.colsb[3] = 0; }), Contains("tile 3") && Contains("not both"));

  // The emulation faults where the hardware would: ldtilecfg on a bad configuration, an
  // instruction before any configuration or on an unconfigured tile, tdpbf16ps on shapes that do
  // not fit.
  amx::TileConfig bad = amx::uniform_config(8, 16, 64);
  bad.rows[0] = 20;
  CHECK_THROWS_WITH(amx::Emulated::load_config(bad), Contains("ldtilecfg") && Contains("20 rows"));
  CHECK_THROWS_WITH(amx::Emulated::zero<0>(), Contains("no tile configuration"));
  {
    const Configured on(amx::uniform_config(3, 16, 64));
    CHECK_THROWS_WITH(amx::Emulated::zero<5>(), Contains("tile 5 is not configured"));
    CHECK_NOTHROW(amx::Emulated::dpbf16ps<0, 1, 2>());
  }
  {
    amx::TileConfig c = amx::uniform_config(3, 16, 64);
    c.rows[1] = 8;  // A's rows differ from C's
    const Configured on(c);
    CHECK_THROWS_WITH((amx::Emulated::dpbf16ps<0, 1, 2>()), Contains("C and A differ in rows"));
  }
  {
    amx::TileConfig c = amx::uniform_config(3, 16, 64);
    c.rows[2] = 8;  // B's rows differ from A's pairs a row
    const Configured on(c);
    CHECK_THROWS_WITH((amx::Emulated::dpbf16ps<0, 1, 2>()), Contains("A's pairs a row differ from B's rows"));
  }
  {
    amx::TileConfig c = amx::uniform_config(3, 16, 64);
    c.colsb[0] = 32;  // C's columns differ from B's
    const Configured on(c);
    CHECK_THROWS_WITH((amx::Emulated::dpbf16ps<0, 1, 2>()), Contains("C and B differ"));
  }
  {
    amx::TileConfig c = amx::uniform_config(3, 16, 64);
    c.colsb[1] = 62;
    const Configured on(c);
    CHECK_THROWS_WITH((amx::Emulated::dpbf16ps<0, 1, 2>()), Contains("multiple of 4"));
  }
}

// The products layer against a model made of dpbf16_element: each 32-deep step of the reduction is
// one tdpbf16ps, taken in order, so the result is exact, not within a tolerance.
TEST_CASE("amx products: every block shape, accumulating or not, exactly as the instruction's steps", "[amx]") {
  for (const auto& [M, N, K] :
       {std::array<int, 3>{16, 16, 32}, {32, 32, 64}, {48, 80, 96}, {64, 16, 32}, {16, 48, 128}})
    for (const bool accumulate : {false, true}) {
      INFO("M " << M << " N " << N << " K " << K << (accumulate ? " accumulating" : ""));
      const std::size_t lda = std::size_t(K) + 32, ldb = std::size_t(N) + 16, ldc = std::size_t(N) + 8;
      std::vector<float> values(std::size_t(M) * lda + std::size_t(K) * ldb + std::size_t(M) * ldc);
      fill_normal(values, 11, std::uint64_t(M * 1000 + N * 10 + K), 1.0);
      std::vector<std::uint16_t> a(std::size_t(M) * lda), b(std::size_t(K) * ldb);  // b: K / 2 rows of ldb pairs
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = bf(values[i]);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf(values[a.size() + i]);
      std::vector<float> c(values.end() - std::ptrdiff_t(std::size_t(M) * ldc), values.end());
      std::vector<float> expected = c;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          float x = accumulate ? c[std::size_t(m) * ldc + n] : 0.0f;
          for (int s = 0; s < K / 32; ++s) {
            std::uint16_t bcol[32];
            for (int p = 0; p < 16; ++p) {
              const std::size_t word = (std::size_t(s) * 16 + p) * ldb + n;
              bcol[2 * p] = b[2 * word];
              bcol[2 * p + 1] = b[2 * word + 1];
            }
            x = amx::dpbf16_element(x, a.data() + std::size_t(m) * lda + std::size_t(s) * 32, bcol, 16);
          }
          expected[std::size_t(m) * ldc + n] = x;
        }
      amx::configure<amx::Emulated>();
      amx::gemm<amx::Emulated>(M, N, K, a.data(), lda, reinterpret_cast<const std::uint32_t*>(b.data()), ldb, c.data(),
                               ldc, accumulate);
      amx::Emulated::release();
      CHECK(c == expected);  // columns past N (the padding of ldc) untouched too
    }
}

TEST_CASE("amx hardware: tdpbf16ps equals the emulation bit for bit", "[.hardware]") {
  for (const bool accumulate : {false, true}) {
    const int M = 48, N = 80, K = 96;
    std::vector<float> values(std::size_t(M) * K + std::size_t(K) * N + std::size_t(M) * N);
    fill_normal(values, 5, 7, 1.0);
    std::vector<std::uint16_t> a(std::size_t(M) * K), b(std::size_t(K) * N);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = bf(values[i]);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf(values[a.size() + i]);
    // Tiny values too, for the hardware's denormal handling: products near 2^-130 are denormal
    // (flushed), a few inputs denormal themselves (read as zero), and some accumulators too.
    for (std::size_t i = 0; i < a.size(); i += 7) a[i] = bf(std::ldexp(values[i], -100));
    for (std::size_t i = 0; i < b.size(); i += 5) b[i] = bf(std::ldexp(values[a.size() + i], -30));
    for (std::size_t i = 0; i < a.size(); i += 11) a[i] = bf(std::ldexp(values[i], -130));
    std::vector<float> c(values.end() - M * N, values.end());
    for (std::size_t i = 0; i < c.size(); i += 13) c[i] = std::ldexp(c[i], -130);
    std::vector<float> hw = c;
    amx::configure<amx::Emulated>();
    amx::gemm<amx::Emulated>(M, N, K, a.data(), K, reinterpret_cast<const std::uint32_t*>(b.data()), N, c.data(), N,
                             accumulate);
    amx::Emulated::release();
    REQUIRE(amx::hardware_gemm(M, N, K, a.data(), K, reinterpret_cast<const std::uint32_t*>(b.data()), N, hw.data(), N,
                               accumulate));
    CHECK(hw == c);
  }
}

TEST_CASE("amx chunked: every rule and decay, fwd and fwd_bwd, within the bf16 tolerance", "[amx]") {
  double worst = 0, worst_dg = 0;
  std::map<std::string, double> worst_other;  // chunked_amx_gated, chunked_amx_delta
  auto backend = make_backend("cpu", BackendOptions{2});
  for (const Rule rule : {Rule::additive, Rule::delta})
    for (const Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector})
      for (const Problem& p : shapes(decay, rule))
        for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          const Case c = test::kernel_case(p, "chunked", mode, "cpu", "bf16");
          INFO(test::describe(c) << " on the " << (hardware_run ? "hardware's" : "emulated") << " tiles");
          REQUIRE_FALSE(backend->unsupported(c));
          const std::string variant = backend->find("linear_attention", "chunked")->variant(c);
          const std::string converted = cpu::cpu_variant_for("chunked", p).name + "+bf16cvt";
          // The forward and the backward on AMX tiles.
          if (amx_takes(p))
            CHECK(variant == amx_row(p));
          else
            CHECK(variant == converted);
          const test::Outcome r = test::run_on(*backend, c);
          INFO(test::errors(r.check));
          CHECK(r.check.non_finite.empty());
          CHECK(r.check.passed);
          CHECK(r.check.tolerance == 3e-2);
          if (amx_row(p) == "chunked_amx")
            for (const auto& [output, err] : r.check.per_output) {
              double& w = output == "dg" ? worst_dg : worst;
              w = std::max(w, err);
            }
          else if (amx_takes(p)) {
            double& w = worst_other[amx_row(p) + " " + to_string(decay)];
            w = std::max(w, r.check.rel_err);
          }
        }
  for (const auto& [row, err] : worst_other) WARN(row << " worst rel_err " << err);
  // The AMX forward rounds P, S and the decayed keys to bf16, as chunked_bf16 does; the backward
  // rounds P, dA, the states and their gradients: every output within 1e-2 but dg, a sum from the
  // sequence's end of q . dq - k . dk, whose cancellation takes it to ~1.4e-2 at D 128 (held to
  // the bf16 tolerance above, as every output is).
  WARN("chunked_amx worst rel_err " << worst << ", dg " << worst_dg);
  CHECK(worst > 0);
  CHECK(worst < 1e-2);
  CHECK(worst_dg > 0);
}

// Vector gates (chunked_amx_gated) and the delta rule (chunked_amx_delta): ragged dims (neither a
// multiple of 16), ragged T, grouped heads with Dk != Dv, packed documents, a tiny chunk, and strong
// gates (gate_norm 1 and 0.25 over chunks of 64), fwd and fwd_bwd, against the float64 reference.
TEST_CASE("amx chunked, vector gates and the delta rule: ragged shapes and strong gates", "[amx]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  std::map<std::string, double> worst;  // per row and rule x decay
  const std::vector<std::pair<Rule, Decay>> families = {{Rule::additive, Decay::vector},
                                                        {Rule::delta, Decay::none},
                                                        {Rule::delta, Decay::retnet},
                                                        {Rule::delta, Decay::scalar},
                                                        {Rule::delta, Decay::vector}};
  for (const auto& [rule, decay] : families) {
    const bool gated = decay == Decay::scalar || decay == Decay::vector;
    std::vector<std::pair<Problem, std::string>> cases = {
        {Problem{1, 2, 77, 24, 32, decay, rule, 1, 40}, ""},
        {Problem{2, 1, 50, 40, 32, decay, rule, 0, 20}, ""},
        {packed({0, 37, 38, 90}, 2, 1, 20, 36, 32, decay, rule), ""},
        {Problem{1, 1, 5, 3, 2, decay, rule}, ""}};
    if (gated) {
      cases.push_back({Problem{1, 1, 150, 32, 64, decay, rule}, "1"});
      cases.push_back({Problem{1, 1, 130, 24, 64, decay, rule, 0, 16}, "0.25"});
    }
    for (const auto& [p, gate_norm] : cases)
      for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        Case c = test::kernel_case(p, "chunked", mode, "cpu", "bf16");
        if (!gate_norm.empty()) c.options["gate_norm"] = gate_norm;
        INFO(test::describe(c) << " on the " << (hardware_run ? "hardware's" : "emulated") << " tiles");
        REQUIRE_FALSE(backend->unsupported(c));
        const std::string row = rule == Rule::delta ? "chunked_amx_delta" : "chunked_amx_gated";
        CHECK(backend->find("linear_attention", "chunked")->variant(c) == row);
        const test::Outcome r = test::run_on(*backend, c);
        INFO(test::errors(r.check));
        CHECK(r.check.non_finite.empty());
        CHECK(r.check.passed);
        CHECK(r.check.tolerance == 3e-2);
        double& w = worst[to_string(rule) + "/" + to_string(decay)];
        w = std::max(w, r.check.rel_err);
      }
  }
  for (const auto& [family, err] : worst) {
    WARN(family << " worst rel_err " << err);
    CHECK(err > 0);
  }
}

// Their scratch: what each variant reports is what it allocates, forward and backward.
TEST_CASE("amx chunked, vector gates and the delta rule: scratch as reported", "[amx][memory]") {
  omp_set_num_threads(2);
  for (const Problem& p : {Problem{1, 2, 70, 24, 32, Decay::vector, Rule::additive, 1, 40},
                           Problem{1, 3, 40, 32, 32, Decay::scalar, Rule::delta},
                           packed({0, 37, 38, 70}, 2, 1, 20, 36, 32, Decay::vector, Rule::delta)}) {
    INFO(test::describe(p));
    const cpu::CpuBf16Variant v = cpu::cpu_bf16_variant_for("chunked", p);
    REQUIRE(v.name == amx_row(p));
    REQUIRE(v.own_backward);
    CHECK(v.own_backward(p));
    const TensorSet t = make_case_inputs(test::kernel_case(p, "chunked", Mode::fwd_bwd, "cpu", "bf16"), 0);
    const auto bits = [&](const char* name) {
      std::vector<cpu::Bf16> out(t.at(name).data.size());
      std::transform(t.at(name).data.begin(), t.at(name).data.end(), out.begin(), float_to_bf16_bits);
      return out;
    };
    const auto input = [&](const char* name) { return t.find(name) ? t.find(name)->data.data() : nullptr; };
    const std::vector<cpu::Bf16> q = bits("q"), k = bits("k"), v16 = bits("v"), dO = bits("dO");
    std::vector<float> o(p.value_elems()), hT(p.state_elems());
    const cpu::Bf16ForwardArgs fa{q.data(), k.data(), v16.data(), t.at("h0").data.data(), o.data(), hT.data(),
                                  input("g"), input("beta")};
    CountingAllocator allocator;
    v.forward(p, fa, allocator, nullptr);
    CHECK(allocator.live_bytes() == 0);
    CHECK(allocator.peak_bytes() == v.forward_workspace_bytes(p, false));
    std::vector<float> dq(p.key_elems()), dk(p.key_elems()), dv(p.value_elems()), dh0(p.state_elems());
    std::vector<float> dg(p.gate_elems()), dbeta(p.rule == Rule::delta ? p.beta_elems() : 0);
    const cpu::Bf16BackwardArgs ba{q.data(),    k.data(),    v16.data(), t.at("h0").data.data(),
                                   dO.data(),   t.at("dhT").data.data(),
                                   dq.data(),   dk.data(),   dv.data(),  dh0.data(),
                                   input("g"),  dg.empty() ? nullptr : dg.data(),
                                   input("beta"), dbeta.empty() ? nullptr : dbeta.data()};
    CountingAllocator back;
    v.backward(p, ba, back, nullptr);
    CHECK(back.live_bytes() == 0);
    CHECK(back.peak_bytes() == v.backward_workspace_bytes(p, false));
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("amx chunked forward: strong gates, long chunks, a chunk longer than the sequence, threads", "[amx]") {
  for (int threads : {1, 3}) {
    auto backend = make_backend("cpu", BackendOptions{threads});
    for (Problem p : {Problem{2, 3, 70, 32, 32, Decay::scalar}, Problem{1, 3, 300, 128, 64, Decay::retnet},
                      Problem{1, 1, 20, 64, 256, Decay::none}, Problem{1, 2, 129, 96, 96, Decay::scalar}}) {
      if (p.seq == 300) p.chunk = 128;
      Case c = test::kernel_case(p, "chunked", Mode::fwd, "cpu", "bf16");
      if (p.decay == Decay::scalar) c.options["gate_norm"] = "1";
      INFO(test::describe(c) << " threads " << threads);
      CHECK(backend->find("linear_attention", "chunked")->variant(c) == "chunked_amx");
      const test::Outcome r = test::run_on(*backend, c);
      INFO(test::errors(r.check));
      CHECK(r.check.passed);
      CHECK(r.check.rel_err < 1e-2);
    }
  }
}

TEST_CASE("amx chunked: its scratch equals its closed form", "[amx][memory]") {
  omp_set_num_threads(2);
  for (const Problem& p : {Problem{2, 4, 100, 32, 128, Decay::none}, Problem{1, 3, 70, 128, 64, Decay::scalar},
                           packed({0, 37, 38, 102}, 2, 1, 32, 64, 32, Decay::retnet, Rule::additive)}) {
    INFO(test::describe(p));
    const cpu::CpuBf16Variant v = cpu::cpu_bf16_variant_for("chunked", p);
    REQUIRE(v.name == "chunked_amx");
    // Written out: packed K^T, V, K_w^T, S; S; scores; P; a short chunk's Q; O's rows; the decays.
    const std::size_t C = p.chunk, Dk = p.dim, Dv = p.value_dim();
    const std::size_t thread =
        Dk / 2 * C + C / 2 * Dv + Dk * C / 2 + Dk / 2 * Dv + Dk * Dv + C * C + C * C / 2 + C * Dk / 2 + C * Dv + 3 * C;
    const std::size_t threads = std::min<std::size_t>(2, p.slices());
    CHECK(v.forward_workspace_bytes(p, false) == threads * thread * 4);
    const TensorSet t = make_case_inputs(test::kernel_case(p, "chunked", Mode::fwd_bwd, "cpu", "bf16"), 0);
    const auto bits = [&](const char* name) {
      std::vector<cpu::Bf16> out(t.at(name).data.size());
      std::transform(t.at(name).data.begin(), t.at(name).data.end(), out.begin(), float_to_bf16_bits);
      return out;
    };
    const std::vector<cpu::Bf16> q = bits("q"), k = bits("k"), v16 = bits("v");
    std::vector<float> o(p.value_elems()), hT(p.state_elems());
    const float* g = p.decay == Decay::scalar ? t.at("g").data.data() : nullptr;
    const cpu::Bf16ForwardArgs fa{q.data(), k.data(), v16.data(), t.at("h0").data.data(), o.data(), hT.data(), g};
    CountingAllocator allocator;
    v.forward(p, fa, allocator, nullptr);
    CHECK(allocator.live_bytes() == 0);
    CHECK(allocator.peak_bytes() == v.forward_workspace_bytes(p, false));

    // The backward on AMX tiles: the partial dq, dk copies of GradParts, then
    // per thread the chunk's bf16 rows (4), their pairings (K^T, V^T, K, Q, V, dO; S^T, dS^T, dS),
    // K_w^T and (diag(lam) Q)^T, two float32 and four bf16 C x C blocks, dS, a gradient's rows, the
    // decays, and the entering states of the longest sequence's chunks and the state leaving it.
    const std::size_t chunks = std::size_t(cpu::max_chunks(p)), Dmax = std::max(Dk, Dv);
    const std::size_t bwd_thread = C * Dk + C * Dv + Dk / 2 * C + Dv / 2 * C + C * Dk + C * Dv + 2 * Dv / 2 * Dk +
                                   Dk / 2 * Dv + Dk * C + 2 * C * C + 2 * C * C + Dk * Dv + C * Dmax + 3 * C +
                                   (chunks + 1) * Dk * Dv;
    const cpu::GradParts parts(p, 2);
    const std::size_t bwd_threads = std::min<std::size_t>(2, parts.items);
    CHECK(v.backward_workspace_bytes(p, false) == (parts.partial_floats(p) + bwd_threads * bwd_thread) * 4);
    const std::vector<cpu::Bf16> dO = bits("dO");
    std::vector<float> dq(p.key_elems()), dk(p.key_elems()), dv(p.value_elems()), dh0(p.state_elems());
    std::vector<float> dg(p.gate_elems());
    const cpu::Bf16BackwardArgs ba{q.data(),   k.data(),
                                   v16.data(), t.at("h0").data.data(),
                                   dO.data(),  t.at("dhT").data.data(),
                                   dq.data(),  dk.data(),
                                   dv.data(),  dh0.data(),
                                   g,          g ? dg.data() : nullptr};
    CountingAllocator back;
    v.backward(p, ba, back, nullptr);
    CHECK(back.live_bytes() == 0);
    CHECK(back.peak_bytes() == v.backward_workspace_bytes(p, false));
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("amx: without AMX-BF16 the chunked_amx row declines with the reason", "[amx]") {
  const std::optional<std::string> why = amx::hardware_refusal();
  cpu::set_amx_override(std::nullopt);  // the CPU's own answer
  const Problem p{1, 2, 64, 128, 64, Decay::none};
  const std::string chosen = cpu::cpu_bf16_variant_for("chunked", p).name;
  if (why) {
    CHECK(cpu::amx_refusal() == why);
    CHECK(chosen != "chunked_amx");
    CHECK_THAT(*why, Contains("AMX"));
    // Forcing the hardware where it is refused still declines.
    cpu::set_amx_override(cpu::AmxPath::hardware);
    CHECK(cpu::amx_refusal() == why);
    CHECK(cpu::cpu_bf16_variant_for("chunked", p).name != "chunked_amx");
  } else {
    CHECK_FALSE(cpu::amx_refusal());
    CHECK(chosen == "chunked_amx");
  }
  cpu::set_amx_override(tested_path());
}

namespace lattn::amx_tests {
bool hardware_run = false;
}  // namespace lattn::amx_tests

int main(int argc, char** argv) {
  prepare_process_environment(argv);
  std::vector<char*> args(argv, argv + argc);
  const auto flag =
      std::find_if(args.begin(), args.end(), [](const char* a) { return std::string(a) == "--hardware"; });
  hardware_run = flag != args.end();
  if (hardware_run) {
    args.erase(flag);
    if (const auto& why = amx::hardware_refusal()) {
      std::printf("SKIPPED: the AMX hardware path cannot run here: %s\n", why->c_str());
      return 77;
    }
  }
  cpu::set_amx_override(tested_path());
  // The bf16 cases run on a CPU without AVX512-BF16 too: the AMX row (emulated) and the converter
  // are plain C++ there.
  cpu::set_bf16_override(true);
  const int failed = lattn::test::run_catch(int(args.size()), args.data());
  return failed == 77 ? 78 : failed;  // 77 failures must not read as "skipped"
}

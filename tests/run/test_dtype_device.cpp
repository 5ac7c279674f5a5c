// The dtype, device and cold settings, and how a backend without a GPU or without bf16 answers.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "src/config/config.hpp"
#include "core/random.hpp"
#include "kernels/cpu/amx.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("dtype bf16, device and cache are config keys with flags", "[config]") {
  Config c = parse_config("dtype: bf16\ndevice: 1\nkernel:\n  cache: [cold, warm]\n", "suite.yaml");
  CHECK(c.run.dtype == "bf16");
  CHECK(c.run.device == 1);
  CHECK(c.suite("kernel").names("cache") == std::vector<std::string>{"cold", "warm"});
  CHECK(c.suite("decode").names("cache") == std::vector<std::string>{"cold"});  // the decode suite's default
  CHECK(c.suite("layer").names("cache") == std::vector<std::string>{"warm"});
  CHECK(to_json(c).at("device") == 1);
  CHECK_FALSE(to_json(c).contains("cold"));
  Overrides o;
  o.values["device"] = "0";
  o.values["cache"] = "warm";
  apply_overrides(c, o);
  CHECK(c.run.device == 0);
  CHECK(c.suite("kernel").names("cache") == std::vector<std::string>{"warm"});
  CHECK_THROWS_WITH(parse_config("kernel:\n  cache: tepid\n", "s.yaml"), Contains("s.yaml:2: kernel.cache") && Contains("cold, warm"));
  // The run key it replaced says where it went rather than running warm.
  CHECK_THROWS_WITH(parse_config("cold: true\n", "s.yaml"), Contains("s.yaml:1: cold") && Contains("cache: cold"));
  CHECK_THROWS_WITH(parse_config("device: -1\n", "s.yaml"), Contains("device"));
  CHECK_THROWS_WITH(parse_config("dtype: fp8\n", "s.yaml"), Contains("expected one of: float32, bf16"));
}

TEST_CASE("bf16 rounding is round-to-nearest-even and exact on bf16 values", "[inputs]") {
  CHECK(bf16_bits_to_float(float_to_bf16_bits(1.0f)) == 1.0f);
  CHECK(bf16_bits_to_float(float_to_bf16_bits(-2.5f)) == -2.5f);
  CHECK(float_to_bf16_bits(1.0f + 0x1p-8f) == float_to_bf16_bits(1.0f));             // tie: to even
  CHECK(float_to_bf16_bits(1.0f + 0x1p-7f + 0x1p-8f) == float_to_bf16_bits(1.0f + 0x1p-6f));  // tie: to even (up)
  CHECK(bf16_bits_to_float(float_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-12f)) == 1.0f + 0x1p-7f);  // above the tie: up
  std::vector<float> v{0.1f, 3.14159f, -1e-3f};
  round_to_bf16(v);
  std::vector<float> again = v;
  round_to_bf16(again);
  CHECK(again == v);
  CHECK(std::abs(v[1] - 3.14159f) < 3.14159f * 0x1p-8f);
}

// The default suites' linear-attention cases run in bf16 where the CPU has AVX512-BF16 (dim 4:
// the float32 kernels behind the converter) and are skipped with the reason elsewhere; the layer's
// run on AMX tiles where the CPU has AMX-BF16 and are skipped with their reason elsewhere.
TEST_CASE("the CPU backend runs bf16 kernel cases where it has AVX512-BF16, and skips the rest with a reason", "[cli][spawns]") {
  const fs::path out = fs::temp_directory_path() / ("lattn-bf16-" + std::to_string(::getpid()) + ".json");
  const auto r = test::run_process(test::binary() + " --dtype bf16 --seq 16 --dim 4 --batch 1 --heads 1 --reps 1 "
                                   "--warmup 0 --min-sample-ms 1 --quiet --out " + out.string());
  INFO(r.output);
  CHECK(r.exit_status == 0);
  std::ifstream in(out);
  const nlohmann::json doc = nlohmann::json::parse(in);
  const bool runs = cpu::bf16_supported();
  // What runs follows from the capabilities this run has, not from the host the test was written on:
  // the kernel suite's bf16 cases where the CPU has AVX512-BF16, the layer's on AMX tiles where it
  // has AMX-BF16 (a scan branch at dim 4).
  const bool amx = !cpu::amx::hardware_refusal();
  int kernel_cases = 0, layer_cases = 0, layer_ok = 0;
  for (const auto& rec : doc.at("results")) {
    CHECK(rec.at("dtype") == "bf16");
    if (rec.at("suite") == "layer") {
      ++layer_cases;
      if (amx) {
        CHECK(rec.at("status") == "ok");
        CHECK(rec.at("variant").get<std::string>().rfind("products amx", 0) == 0);
        ++layer_ok;
      } else {
        CHECK(rec.at("status") == "skipped");
        CHECK_THAT(rec.at("skip_reason").get<std::string>(), Contains("AMX tiles only"));
      }
      continue;
    }
    if (rec.at("suite") != "kernel") {
      CHECK(rec.at("status") == "skipped");
      CHECK_THAT(rec.at("skip_reason").get<std::string>(), Contains("float32 only"));
      continue;
    }
    ++kernel_cases;
    if (runs) {
      CHECK(rec.at("status") == "ok");
      CHECK_THAT(rec.at("variant").get<std::string>(), Contains("+bf16cvt"));
    } else {
      CHECK(rec.at("status") == "skipped");
      CHECK_THAT(rec.at("skip_reason").get<std::string>(), Contains("AVX512-BF16"));
    }
  }
  CHECK(kernel_cases == 4);  // scan and chunked, fwd and fwd_bwd
  CHECK(layer_cases > 0);
  CHECK(doc.at("totals").at("ok") == (runs ? kernel_cases : 0) + layer_ok);
  fs::remove(out);
}

TEST_CASE("without a usable GPU, --backend cuda exits 2 and --list says why", "[cli][cuda][spawns]") {
  if (test::cuda_usable()) {
    // A GPU is usable here: --list says so (the CUDA tests, lattn_cuda_tests, cover the backend).
    const auto list = test::run_process(test::binary() + " --list");
    CHECK(list.exit_status == 0);
    CHECK_THAT(list.output, Contains("cuda  available"));
    return;
  }
  const auto run = test::run_process(test::binary() + " --backend cuda --seq 16 --dim 4 --quiet --out " +
                                     (fs::temp_directory_path() / "never-cuda.json").string());
  CHECK(run.exit_status == 2);
  CHECK_THAT(run.output, Contains("lattnbench: error: --backend cuda: no CUDA device: "));
  const auto list = test::run_process(test::binary() + " --list");
  CHECK(list.exit_status == 0);
  CHECK_THAT(list.output, Contains("cuda  unavailable: no CUDA device: "));
  CHECK_THAT(list.output, Contains("dtypes:   float32, bf16"));
}

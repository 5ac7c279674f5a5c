// The roofline every CPU result carries: the measured peak and bandwidth in the device block,
// peak_gflops / peak_fraction in each record, and the two environment settings lattnbench makes
// before the libraries read them (docs/performance.md).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backends/cpu/roofline.hpp"
#include "src/summary.hpp"
#include "test_util.hpp"

using namespace lattn;
namespace fs = std::filesystem;

TEST_CASE("the CPU roofline is measured once and cached", "[roofline]") {
  const Roofline& first = cpu_roofline(2);
  CHECK(first.threads == 2);
  CHECK(first.sgemm_n > 0);
  CHECK(first.sgemm_gflops > 1.0);
  CHECK(first.stream_gbytes_per_s > 0.1);
  CHECK(first.stream_bytes == 3 * sizeof(float) * (std::size_t(1) << 25));
  // Measured where the build has AVX2 or AVX-512 kernels (the flags the library is built with,
  // not this file's). sgemm is FMAs too, so it cannot run faster than the FMA units; a factor of
  // two of slack for a busy moment during the FMA loop still catches a miscounted lane width or
  // thread count.
  if (cpu::available_vecs().back() != cpu::Vec::generic)
    CHECK(first.fma_gflops > 0.5 * first.sgemm_gflops);
  else
    CHECK(first.fma_gflops == 0.0);
  const Roofline& again = cpu_roofline(1);  // cached: the first call's figures, not a new measurement
  CHECK(&again == &first);
  CHECK(again.threads == 2);
}

TEST_CASE("the start-up sgemm stops once its best has settled, not after a fixed count", "[roofline]") {
  const PeakRule rule{100, 0.5, 2.5};
  std::vector<double> flat(100, 2e-3);
  CHECK(sgemm_peak_settled(flat, 0.6, rule));
  CHECK_FALSE(sgemm_peak_settled(flat, 0.4, rule));  // too soon: a 0.2 s window can be one busy stretch
  CHECK_FALSE(sgemm_peak_settled(std::vector<double>(99, 2e-3), 0.6, rule));  // too few
  CHECK(sgemm_peak_settled(std::vector<double>(10, 2e-3), 2.5, rule));         // out of time, whatever
  // The best still moving: the last quarter beat the earlier best by 2%, so keep going ...
  std::vector<double> improving(75, 3e-3);
  improving.insert(improving.end(), 25, 3e-3 / 1.02);
  CHECK_FALSE(sgemm_peak_settled(improving, 0.6, rule));
  // ... but a gain under 1% is settled.
  std::vector<double> nearly(75, 3e-3);
  nearly.insert(nearly.end(), 25, 3e-3 / 1.005);
  CHECK(sgemm_peak_settled(nearly, 0.6, rule));
  // The quarter grows with the count: 200 products look back over the last 50.
  std::vector<double> late(150, 3e-3);
  late.insert(late.end(), 20, 2e-3);
  late.insert(late.end(), 30, 3e-3);
  CHECK_FALSE(sgemm_peak_settled(late, 0.6, rule));
}

TEST_CASE("records above the start-up peak make a warning that names how many", "[roofline]") {
  auto measured = [](double fraction) {
    CaseRecord r;
    r.status = Status::ok;
    r.measured = Measurement{};
    r.measured->peak_fraction = fraction;
    return r;
  };
  std::vector<CaseRecord> below = {measured(0.7), CaseRecord{}};  // the second: skipped, unmeasured
  CHECK(above_peak_warning(below, 200.0, 150.0).empty());
  std::vector<CaseRecord> above = below;
  above.push_back(measured(1.3));
  above.push_back(measured(1.01));
  const std::string w = above_peak_warning(above, 157.0, 120.0);
  CHECK(w.rfind("2 case(s) ran above the start-up sgemm peak (157.0 GFLOP/s", 0) == 0);
  CHECK(w.find("peak_fraction_now") != std::string::npos);
}

TEST_CASE("a wide spread of the start-up sgemm products makes a warning with their ratio", "[roofline]") {
  CHECK(peak_spread_warning(300.0, 285.0).empty());  // 0.95: a quiet machine
  CHECK(peak_spread_warning(300.0, 0.0).empty());    // no median recorded (a backend without one)
  CHECK(peak_spread_warning(0.0, 250.0).empty());
  const std::string w = peak_spread_warning(300.0, 249.0);
  CHECK(w.rfind("the start-up sgemm products spread: median 249.0 against best 300.0 GFLOP/s (0.83)", 0) == 0);
  CHECK(w.find("peak_fraction_now") != std::string::npos);
  CHECK_FALSE(peak_spread_warning(300.0, 269.0).empty());  // just under 0.9
}

TEST_CASE("the sgemm check is a fresh measurement that leaves the cached roofline alone", "[roofline]") {
  const double cached = cpu_roofline(2).sgemm_gflops;
  const double one = cpu_sgemm_check(1, 1), several = cpu_sgemm_check(2, 3);
  CHECK(std::isfinite(one));
  CHECK(one > 1.0);
  CHECK(std::isfinite(several));
  CHECK(several > 1.0);
  CHECK(cpu_roofline(2).sgemm_gflops == cached);  // a check leaves the start-up figure alone
}

TEST_CASE("every record carries peak_gflops and peak_fraction against the device block's peak and the peak around it", "[roofline][cli]") {
  const fs::path out = fs::temp_directory_path() / ("lattn-roofline-" + std::to_string(::getpid()) + ".json");
  const auto run = test::run_process(test::binary() + " --config " + test::source_dir() +
                                     "/configs/smoke.yaml --quiet --threads 2 --out " + out.string());
  REQUIRE(run.exit_status == 0);
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(out));
  fs::remove(out);
  const nlohmann::json& device = doc["device"];
  const double peak = device["peak_gflops"];
  CHECK(peak > 1.0);
  CHECK(device["sgemm_gflops"].get<double>() == peak);
  CHECK(device["sgemm_threads"] == 2);
  // At least 100 products over half a second, unless the 2.5 s cap came first; the median below the best.
  CHECK((device["sgemm_products"].get<int>() >= 100 || device["sgemm_seconds"].get<double>() >= 2.5));
  CHECK(device["sgemm_seconds"].get<double>() >= 0.5);
  CHECK(device["sgemm_median_gflops"].get<double>() <= peak);
  CHECK(device["sgemm_median_gflops"].get<double>() > 1.0);
  CHECK(device["stream_gbytes_per_s"].get<double>() > 0.1);
  // lattnbench re-executes itself with a short spin (GOMP_SPINCOUNT=1000) unless a policy was chosen.
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    CHECK(device["gomp_spincount"] == "1000");
    CHECK(device["omp_wait_policy"] == "");
    CHECK(device["env_set_by_lattnbench"].get<std::string>().find("GOMP_SPINCOUNT") != std::string::npos);
  }
  // And never runs OpenBLAS's SSE3 fallback on a CPU with AVX2 or AVX-512 unless told to.
  if (!std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx2")) CHECK(device["blas_core"] != "Prescott");
  for (const auto& record : doc["results"]) {
    INFO(record.dump());
    CHECK(record["peak_gflops"].get<double>() == peak);
    CHECK(record["peak_fraction"].get<double>() == Approx(record["gflops"].get<double>() / peak));
    // The re-measurement the runner takes on either side of each case.
    const double now = record["peak_gflops_now"];
    CHECK(now > 1.0);
    CHECK(record["peak_fraction_now"].get<double>() == Approx(record["gflops"].get<double>() / now));
    // The roofline: the compute peak, or the intensity times the measured bandwidth if lower.
    const double intensity = record["flops"].get<double>() / record["bytes"].get<double>();
    const double roof = std::min(peak, intensity * device["stream_gbytes_per_s"].get<double>());
    CHECK(record["roofline_gflops"].get<double>() == Approx(roof));
    CHECK(record["roofline_fraction"].get<double>() == Approx(record["gflops"].get<double>() / roof));
    CHECK(record["roofline_fraction"].get<double>() >= record["peak_fraction"].get<double>());
    CHECK(record["flops"].get<double>() > 0);
    CHECK(record["gbytes_per_s"].get<double>() > 0);
  }
}

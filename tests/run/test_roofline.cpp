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
#include "kernels/cpu/amx.hpp"
#include "src/results/summary.hpp"
#include "src/run/bandwidth_roof.hpp"
#include "test_util.hpp"

using namespace lattn;
namespace fs = std::filesystem;

TEST_CASE("the CPU roofline is measured once and cached", "[roofline]") {
  const Roofline& first = cpu_roofline(2);
  CHECK(first.threads == 2);
  CHECK(first.sgemm_n > 0);
  CHECK(first.sgemm_gflops > 1.0);
  CHECK(first.stream_gbytes_per_s > 0.1);
  CHECK(first.stream_bytes == 3 * sizeof(float) * triad_elems_for_cache(last_level_cache_bytes()));
  // Measured where the build has AVX2 or AVX-512 kernels (the flags the library is built with,
  // not this file's). sgemm is FMAs too, so it cannot run faster than the FMA units; a factor of
  // two of slack for a busy moment during the FMA loop still catches a miscounted lane width or
  // thread count.
  if (cpu::available_vecs().back() != cpu::Vec::generic)
    CHECK(first.fma_gflops > 0.5 * first.sgemm_gflops);
  else
    CHECK(first.fma_gflops == 0.0);
  CHECK((first.amx_gflops > 0) == !cpu::amx::hardware_refusal());
  // The bandwidth sweep: from 16 KiB at growing sizes, each rate measured, up to the DRAM triad's
  // working set and rate; the cache levels are read off it, sysfs's kept beside them.
  const std::vector<BandwidthPoint>& sweep = first.bandwidth_sweep;
  REQUIRE(sweep.size() >= 2);
  CHECK(sweep.front().bytes == 16 * 1024);
  for (std::size_t i = 1; i < sweep.size(); ++i) CHECK(sweep[i].bytes > sweep[i - 1].bytes);
  for (const BandwidthPoint& point : sweep) CHECK(point.gbytes_per_s > 0);
  CHECK(sweep.back().bytes * 3 == first.stream_bytes * 2);
  CHECK(sweep.back().gbytes_per_s == first.stream_gbytes_per_s);
  CHECK(first.sweep_seconds > 0);
  const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
  REQUIRE(first.cache_levels.size() == levels.size());
  for (std::size_t i = 0; i < levels.size(); ++i) {
    CHECK(first.cache_levels[i].level == levels[i].level);
    CHECK(first.cache_levels[i].capacity_bytes == levels[i].capacity_bytes);
    CHECK(first.cache_levels[i].gbytes_per_s == levels[i].gbytes_per_s);
  }
  CHECK(first.sysfs_caches.size() == sysfs_cache_levels(2).size());
  const Roofline& again = cpu_roofline(1);  // cached: the first call's figures, not a new measurement
  CHECK(&again == &first);
  CHECK(again.threads == 2);
}

TEST_CASE("the in-place triad's two arrays are eight times the last-level cache, between 8 and 256 MiB each",
          "[roofline]") {
  constexpr std::size_t MiB = std::size_t(1) << 20;
  CHECK(triad_elems_for_cache(32 * MiB) == 128 * MiB / 4);               // Zen 4/5: 32 MiB L3, 2 x 128 MiB
  CHECK(triad_elems_for_cache(0) == (std::size_t(1) << 26));             // unknown: 256 MiB per array
  CHECK(triad_elems_for_cache(1 * MiB) == (std::size_t(1) << 21));       // 8 MiB at the least
  CHECK(triad_elems_for_cache(1024 * MiB) == (std::size_t(1) << 26));    // 256 MiB at the most
  // The runner's figure is eight times this host's largest cache where sysfs tells it.
  if (const std::size_t llc = last_level_cache_bytes(); llc > 0) {
    const std::size_t total = triad_elems_for_cache(llc) * 2 * sizeof(float);
    CHECK((total >= std::min<std::size_t>(8 * llc - 8, 512 * MiB) || total == 16 * MiB));
  }
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

TEST_CASE("the compute ceiling is the larger of the FMA rate and sgemm", "[roofline]") {
  // Zen 4 / Zen 5 with Debian's OpenBLAS: sgemm runs the AVX2 Haswell kernel at about half of the
  // AVX-512 FMA rate, and the FMA rate is the ceiling.
  const ComputeCeiling zen = compute_ceiling(542.0, 260.0);
  CHECK(zen.gflops == 542.0);
  CHECK(zen.source == "fma");
  // A busy moment during the FMA loop left it under sgemm: sgemm is the better lower bound.
  const ComputeCeiling busy = compute_ceiling(240.0, 260.0);
  CHECK(busy.gflops == 260.0);
  CHECK(busy.source == "sgemm");
  // A build without AVX2 measures no FMA rate: sgemm alone.
  const ComputeCeiling none = compute_ceiling(std::nullopt, 150.0);
  CHECK(none.gflops == 150.0);
  CHECK(none.source == "sgemm");
  CHECK(compute_ceiling(0.0, 150.0).source == "sgemm");
  CHECK(compute_ceiling(std::nullopt, 0.0).gflops == 0.0);
  CHECK(compute_ceiling(std::nullopt, 0.0).source.empty());
  // The device block's peak is that ceiling, the BLAS figure beside it.
  DeviceInfo device;
  device.cpu = CpuDeviceInfo{};
  device.cpu->sgemm_gflops = 260.0;
  device.cpu->fma_gflops = 542.0;
  CHECK(device.peak_gflops() == 542.0);
  CHECK(device.blas_gflops() == 260.0);
  // A bf16 record on AMX tiles is held against the AMX rate where one was measured; every other
  // record against the ceiling.
  CHECK(device.peak_gflops_for("bf16", "chunked_amx") == 542.0);  // no AMX rate measured
  device.cpu->amx_gflops = 5000.0;
  CHECK(device.peak_gflops_for("bf16", "chunked_amx") == 5000.0);
  CHECK(device.peak_gflops_for("bf16", "chunked_amx/chunked_tiled+bf16cvt") == 5000.0);
  CHECK(device.peak_gflops_for("bf16", "products amx") == 5000.0);  // a bf16 layer on AMX tiles
  CHECK(device.peak_gflops_for("bf16", "products amx, linear chunked_amx_delta") == 5000.0);
  CHECK(device.peak_gflops_for("float32", "products openblas") == 542.0);
  CHECK(device.peak_gflops_for("bf16", "chunked_bf16") == 542.0);
  CHECK(device.peak_gflops_for("float32", "chunked_tiled") == 542.0);
  CHECK(device.peak_gflops() == 542.0);
  CHECK(DeviceInfo{}.peak_gflops() == 0.0);
}

TEST_CASE("records above 1.05 of the compute ceiling make a warning that names how many", "[roofline]") {
  auto measured = [](double fraction) {
    CaseRecord r;
    r.status = Status::ok;
    r.measured = Measurement{};
    r.measured->peak_fraction = fraction;
    r.measured->above_ceiling = fraction > kAboveCeiling;
    return r;
  };
  const ComputeCeiling ceiling = compute_ceiling(542.0, 260.0);
  std::vector<CaseRecord> below = {measured(0.7), measured(1.04), CaseRecord{}};  // the last: skipped, unmeasured
  CHECK(above_peak_warning(below, ceiling, 542.0, 260.0).empty());
  std::vector<CaseRecord> above = below;
  above.push_back(measured(1.3));
  above.push_back(measured(1.06));
  const std::string w = above_peak_warning(above, ceiling, 542.0, 260.0);
  CHECK(w.rfind("2 case(s) ran above 1.05 of the compute ceiling (542.0 GFLOP/s, the FMA rate; FMA rate 542.0, sgemm 260.0)", 0) == 0);
  CHECK(w.find("above_ceiling") != std::string::npos);
}

TEST_CASE("a wide spread of the start-up sgemm products makes a warning with their ratio", "[roofline]") {
  CHECK(peak_spread_warning(300.0, 285.0).empty());  // 0.95: a quiet machine
  CHECK(peak_spread_warning(300.0, 0.0).empty());    // no median recorded (a backend without one)
  CHECK(peak_spread_warning(0.0, 250.0).empty());
  const std::string w = peak_spread_warning(300.0, 249.0);
  CHECK(w.rfind("the start-up sgemm products spread: median 249.0 against best 300.0 GFLOP/s (0.83)", 0) == 0);
  CHECK(w.find("blas_fraction_now") != std::string::npos);
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

TEST_CASE("every record carries peak_fraction against the compute ceiling, blas_fraction against sgemm and the sgemm around it", "[roofline][cli][spawns]") {
  const fs::path out = fs::temp_directory_path() / ("lattn-roofline-" + std::to_string(::getpid()) + ".json");
  const auto run = test::run_process(test::binary() + " --config " + test::source_dir() +
                                     "/configs/smoke.yaml --quiet --threads 2 --out " + out.string());
  REQUIRE(run.exit_status == 0);
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(out));
  fs::remove(out);
  const nlohmann::json& device = doc["device"];
  const double peak = device["peak_gflops"], blas = device["blas_gflops"];
  CHECK(peak > 1.0);
  // The ceiling is the hardware's: the larger of the FMA rate and sgemm, and the BLAS figure beside it.
  CHECK(device["sgemm_gflops"].get<double>() == blas);
  CHECK(peak == std::max(device.value("fma_gflops", 0.0), blas));
  // The AMX rate where this CPU runs AMX, absent elsewhere.
  CHECK(device.contains("amx_gflops") == !cpu::amx::hardware_refusal());
  CHECK(device["peak_source"] == (peak == blas ? "sgemm" : "fma"));
  CHECK(device["sgemm_threads"] == 2);
  // At least 100 products over half a second, unless the 2.5 s cap came first; the median below the best.
  CHECK((device["sgemm_products"].get<int>() >= 100 || device["sgemm_seconds"].get<double>() >= 2.5));
  CHECK(device["sgemm_seconds"].get<double>() >= 0.5);
  CHECK(device["sgemm_median_gflops"].get<double>() <= blas);
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
    CHECK(record["above_ceiling"] == (record["peak_fraction"].get<double>() > 1.05));
    CHECK(record["blas_gflops"].get<double>() == blas);
    CHECK(record["blas_fraction"].get<double>() == Approx(record["gflops"].get<double>() / blas));
    // The sgemm re-measurement the runner takes on either side of each case.
    const double now = record["blas_gflops_now"];
    CHECK(now > 1.0);
    CHECK(record["blas_fraction_now"].get<double>() == Approx(record["gflops"].get<double>() / now));
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

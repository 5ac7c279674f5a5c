// Cold and warm (core/op.hpp, cache_axis; docs/harness.md, "Cold and warm"): which roof a record's
// bandwidth is held against (src/run/bandwidth_roof.hpp: the start-up bandwidth sweep's rate at a
// warm case's working set, the cache levels read off the sweep), how the CPU backend makes a call
// cold (backends/cpu/cold.hpp: rotating copies past the cold span, or evicting), the sweep in the
// device block, and the key's flags.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/cold.hpp"
#include "backends/cpu/decode_case.hpp"
#include "backends/cpu/roofline.hpp"
#include "kernels/decode/op.hpp"
#include "src/results/record.hpp"
#include "src/run/bandwidth_roof.hpp"
#include "test_util.hpp"

using namespace lattn;
using lattn::cpu::cold_copies;
using lattn::cpu::eviction_bytes;
using lattn::cpu::rotation_fits;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024, GiB = MiB * 1024;

// A sweep over bandwidth_sweep_sizes(2, 512 MiB) of a machine whose caches hold (capacity, rate)
// as given, the memory `dram` past them: each level's rate up to its capacity, then falling in log
// size to the next level's over 1.6 times the capacity; the DRAM triad last, at 512 MiB.
// `noise(i)` scales each point (a busy moment reads low).
template <class Noise>
std::vector<BandwidthPoint> model_sweep(const std::vector<std::pair<double, double>>& caches, double dram,
                                        Noise noise) {
  std::vector<BandwidthPoint> sweep;
  const std::size_t end = 512 * MiB;
  for (std::size_t size : bandwidth_sweep_sizes(2, end)) {
    double rate = dram;
    for (std::size_t k = caches.size(); k-- > 0;) {
      const double next = k + 1 < caches.size() ? caches[k + 1].second : dram;
      const double past = std::log2(double(size) / caches[k].first) / std::log2(1.6);
      if (past < 1) rate = caches[k].second - (caches[k].second - next) * std::clamp(past, 0.0, 1.0);
    }
    sweep.push_back({size, rate * noise(sweep.size())});
  }
  sweep.push_back({end, dram});
  return sweep;
}

std::vector<BandwidthPoint> model_sweep(const std::vector<std::pair<double, double>>& caches, double dram) {
  return model_sweep(caches, dram, [](std::size_t) { return 1.0; });
}

// Zen 5 with two threads: 48 KiB L1d and 1 MiB L2 per core, a 32 MiB L3.
const std::vector<std::pair<double, double>> kZen5 = {{96.0 * KiB, 400.0}, {2.0 * MiB, 200.0}, {32.0 * MiB, 100.0}};

// A case that counts its calls.
class Counting final : public PreparedCase {
 public:
  int runs = 0, reads = 0;
  void run() override { ++runs; }
  double time_ms(int calls) override {
    runs += calls;
    return 0;
  }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet&) override { ++reads; }
};

}  // namespace

TEST_CASE("cache: the sweep's levels are its plateaus, each to where it keeps 80% of its rate", "[cache][roofline]") {
  const std::vector<BandwidthPoint> sweep = model_sweep(kZen5, 40.0);
  const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
  REQUIRE(levels.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    INFO("level " << k);
    CHECK(levels[k].level == "L" + std::to_string(k + 1));
    CHECK(levels[k].gbytes_per_s == Approx(kZen5[k].second));
    // 80% of the plateau is reached 0.4 of the way down the fall (1.6^0.4 = 1.21 times the capacity).
    const double capacity = double(levels[k].capacity_bytes);
    CHECK(capacity >= kZen5[k].first);
    CHECK(capacity <= 1.3 * kZen5[k].first);
  }
  // The memory's plateau is not a cache; a sweep that never falls by a fifth shows no cache at all.
  CHECK(cache_levels_from_sweep(model_sweep({}, 40.0)).empty());
  CHECK(cache_levels_from_sweep(model_sweep({{32.0 * MiB, 45.0}}, 40.0)).empty());
  CHECK(cache_levels_from_sweep({}).empty());
  CHECK(cache_levels_from_sweep({{16 * KiB, 100.0}}).empty());
  // One fall: one level, to where the rate crosses 80 of 100 (log size); a level
  // under twice its first size is a step of a noisy fall.
  const std::vector<CacheRoof> one = cache_levels_from_sweep({{32 * KiB, 100.0}, {64 * KiB, 100.0}, {256 * KiB, 60.0}});
  REQUIRE(one.size() == 1);
  CHECK(double(one[0].capacity_bytes) == Approx(128.0 * KiB).epsilon(0.01));
  CHECK(cache_levels_from_sweep({{64 * KiB, 100.0}, {80 * KiB, 95.0}, {128 * KiB, 60.0}, {256 * KiB, 60.0}}).empty());
}

TEST_CASE("cache: the sweep's levels survive a shared host's noise", "[cache][roofline]") {
  // Points read up to 15% low (a busy moment) and up to 3% high, from a fixed generator.
  std::uint32_t state = 12345;
  const auto noise = [&](std::size_t) {
    state = state * 1664525u + 1013904223u;
    return 0.85 + 0.18 * double(state >> 8) / double(1u << 24);
  };
  for (int trial = 0; trial < 20; ++trial) {
    INFO("trial " << trial);
    const std::vector<BandwidthPoint> sweep = model_sweep(kZen5, 40.0, noise);
    const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
    REQUIRE(levels.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(levels[k].gbytes_per_s >= 0.9 * kZen5[k].second);
      CHECK(levels[k].gbytes_per_s <= 1.03 * kZen5[k].second);
      CHECK(double(levels[k].capacity_bytes) >= kZen5[k].first / 1.3);
      CHECK(double(levels[k].capacity_bytes) <= 1.5 * kZen5[k].first);
    }
    // The roof never dips below a later point's rate: it is the envelope from the right.
    const std::vector<double> envelope = sweep_envelope(sweep);
    for (std::size_t i = 0; i < sweep.size(); ++i) {
      CHECK(envelope[i] >= sweep[i].gbytes_per_s);
      if (i + 1 < sweep.size()) CHECK(envelope[i] >= envelope[i + 1]);
    }
  }
}

TEST_CASE("cache: a VM whose sysfs reports a 480 MiB L3 is held against the sweep, not sysfs", "[cache][roofline]") {
  // The host's cache really serves a loop up to ~160 MiB at 110 GB/s; sysfs says 480 MiB; DRAM 42.
  const std::vector<std::pair<double, double>> host = {{96.0 * KiB, 500.0}, {2.0 * MiB, 250.0}, {160.0 * MiB, 110.0}};
  const std::vector<BandwidthPoint> sweep = model_sweep(host, 42.0);
  const std::vector<CacheRoof> sysfs = {{"L1d", 96 * KiB, 0.0}, {"L2", 2 * MiB, 0.0}, {"L3", 480 * MiB, 0.0}};
  const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
  REQUIRE(levels.size() == 3);
  CHECK(levels.back().capacity_bytes < sysfs.back().capacity_bytes / 2);
  CHECK(levels.back().capacity_bytes >= 160 * MiB);
  // A warm step over 128 MiB at 94 GB/s: within the third level, held against its rate there.
  const BandwidthRoof roof = bandwidth_roof(false, 128.0 * MiB, sweep, levels, 42.0);
  CHECK(roof.name == "l3");
  REQUIRE(roof.gbytes_per_s);
  CHECK(*roof.gbytes_per_s == Approx(110.0));
  CHECK(94.0 / *roof.gbytes_per_s <= kAboveCeiling);
  // A triad sized from sysfs (half of 480 MiB) reads near the memory's rate, and the step would be flagged.
  CHECK(94.0 / *sweep_rate_at(sweep, 240.0 * MiB) > kAboveCeiling);
  // Past every level, the fall towards DRAM is interpolated, and named DRAM.
  const BandwidthRoof past = bandwidth_roof(false, 220.0 * MiB, sweep, levels, 42.0);
  CHECK(past.name == "dram");
  CHECK(*past.gbytes_per_s < 110.0);
  CHECK(*past.gbytes_per_s > 42.0);
}

TEST_CASE("cache: a warm case's roof is the sweep's rate at its working set, a cold case's DRAM",
          "[cache][roofline]") {
  const std::vector<BandwidthPoint> sweep = {{16 * KiB, 100.0}, {32 * KiB, 100.0}, {64 * KiB, 50.0},
                                             {128 * KiB, 50.0}, {256 * KiB, 20.0},  {1 * MiB, 20.0}};
  CHECK(sweep_rate_at(sweep, 16.0 * KiB) == Approx(100.0));
  CHECK(sweep_rate_at(sweep, 1.0 * KiB) == Approx(100.0));  // below the sweep: its first rate
  CHECK(sweep_rate_at(sweep, 48.0 * KiB) == Approx(100.0 - 50.0 * std::log2(1.5)));  // linear in log size
  CHECK(sweep_rate_at(sweep, 181.0 * KiB) == Approx(35.0).epsilon(0.01));
  CHECK(sweep_rate_at(sweep, 1.0 * MiB) == Approx(20.0));
  CHECK(sweep_rate_at(sweep, 1.0 * GiB) == Approx(20.0));  // past it: the DRAM triad's
  CHECK_FALSE(sweep_rate_at({}, 1.0 * MiB));
  // A point read low is lifted to the larger size's rate.
  const std::vector<BandwidthPoint> dipped = {{16 * KiB, 100.0}, {64 * KiB, 10.0}, {256 * KiB, 30.0}};
  CHECK(sweep_rate_at(dipped, 64.0 * KiB) == Approx(30.0));
  CHECK(sweep_rate_at(dipped, 32.0 * KiB) == Approx(65.0));

  // 100 to 32 KiB x 2^0.4 (80 of it), then 50 to 128 KiB x 2^(1/3) (40 of it).
  const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
  REQUIRE(levels.size() == 2);
  CHECK(double(levels[0].capacity_bytes) == Approx(32.0 * KiB * std::exp2(0.4)).epsilon(0.001));
  CHECK(double(levels[1].capacity_bytes) == Approx(128.0 * KiB * std::cbrt(2.0)).epsilon(0.001));
  for (double ws : {1.0 * KiB, 1.0 * MiB, 20.0 * MiB}) {
    const BandwidthRoof cold = bandwidth_roof(true, ws, sweep, levels, 50.0);
    CHECK(cold.name == "dram");
    CHECK(cold.gbytes_per_s == 50.0);
  }
  CHECK(bandwidth_roof(false, 10.0 * KiB, sweep, levels, 50.0).name == "l1");
  CHECK(*bandwidth_roof(false, 40.0 * KiB, sweep, levels, 50.0).gbytes_per_s > 80.0);
  const BandwidthRoof falling = bandwidth_roof(false, 48.0 * KiB, sweep, levels, 50.0);
  CHECK(falling.name == "l2");  // past the first level's capacity: the next level holds it
  CHECK(*falling.gbytes_per_s == Approx(*sweep_rate_at(sweep, 48.0 * KiB)));
  CHECK(bandwidth_roof(false, 150.0 * KiB, sweep, levels, 50.0).name == "l2");
  const BandwidthRoof past = bandwidth_roof(false, 512.0 * KiB, sweep, levels, 50.0);
  CHECK(past.name == "dram");
  CHECK(*past.gbytes_per_s == Approx(20.0));  // the sweep's, not the `dram_gbytes_per_s` of a cold case
  // Without a sweep (no CPU backend's device block): DRAM; nothing measured: no rate to divide by.
  CHECK(bandwidth_roof(false, 1.0, {}, {}, 50.0).name == "dram");
  CHECK(*bandwidth_roof(false, 1.0, {}, {}, 50.0).gbytes_per_s == 50.0);
  CHECK_FALSE(bandwidth_roof(false, 1.0, {}, {}, 0.0).gbytes_per_s);
  CHECK_FALSE(bandwidth_roof(true, 1.0, sweep, levels, 0.0).gbytes_per_s);
}

TEST_CASE("cache: the sweep's sizes step by 2^(1/3) from 16 KiB, and it stops at the memory's rate",
          "[cache][roofline]") {
  const std::vector<std::size_t> sizes = bandwidth_sweep_sizes(2, 256 * MiB);
  REQUIRE(sizes.size() > 30);
  CHECK(sizes.front() == 16 * KiB);
  CHECK(sizes.back() < 256 * MiB);
  CHECK(sizes.back() * 1.3 >= 256.0 * MiB);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK(sizes[i] % (2 * 64 * 2) == 0);  // whole lines per array and thread
    if (i > 0) CHECK(double(sizes[i]) / double(sizes[i - 1]) == Approx(std::cbrt(2.0)).epsilon(0.02));
  }
  CHECK(bandwidth_sweep_sizes(16, 256 * MiB).front() == 128 * KiB);  // at least 8 KiB a thread
  CHECK(bandwidth_sweep_sizes(2, 16 * KiB).empty());
  const std::vector<BandwidthPoint> falling = {{1, 300.0}, {2, 100.0}, {3, 51.0}, {4, 49.0}};
  CHECK_FALSE(sweep_reached_dram(falling, 40.0, 0));  // one within 1.25 of it, not two
  std::vector<BandwidthPoint> settled = falling;
  settled.push_back({5, 50.0});
  CHECK(sweep_reached_dram(settled, 40.0, 0));
  CHECK(sweep_reached_dram(settled, 40.0, 5));
  CHECK_FALSE(sweep_reached_dram(settled, 40.0, 6));  // not yet past the sizes it must reach
  CHECK_FALSE(sweep_reached_dram(settled, 0.0, 0));   // no DRAM rate: sweep to the end
}

TEST_CASE("cache: a cold copy rotation passes sixteen times the last-level cache, at most 1 GiB", "[cache]") {
  CHECK(cold_span_bytes(32 * MiB) == 512 * MiB);
  CHECK(cold_span_bytes(96 * MiB) == 1024 * MiB);   // capped
  CHECK(cold_span_bytes(640 * MiB) == 1280 * MiB);  // never under twice the cache
  CHECK(cold_copies(512 * MiB, 32 * MiB) == 1);     // alone past the span
  CHECK(cold_copies(64 * MiB, 32 * MiB) == 9);      // a state twice the cache is not cold alone
  CHECK(cold_copies(1 * MiB, 32 * MiB) == 513);
  CHECK(cold_copies(0, 32 * MiB) == 1);
  for (std::size_t bytes : {std::size_t(1), 3 * KiB, 700 * KiB, 31 * MiB, 63 * MiB, 511 * MiB})
    CHECK(cold_copies(bytes, 32 * MiB) * bytes > 512 * MiB);
  CHECK(rotation_fits(64 * MiB));
  CHECK_FALSE(rotation_fits(std::size_t(1) << 50));
  // The whole machine's last level: at least cpu0's, or the stated fallback where sysfs says nothing.
  const std::size_t llc = machine_last_level_cache_bytes();
  CHECK(llc >= std::max<std::size_t>(last_level_cache_bytes(), 1));
  if (last_level_cache_bytes() == 0) CHECK(llc == kAssumedLastLevelCacheBytes);
  CHECK(eviction_bytes() == cold_span_bytes(llc));
}

TEST_CASE("cache: a cold decode step on the CPU rotates over copies, a warm one steps one", "[cache][decode]") {
  DecodeProblem p{2, 2, 1, 16, 1, Decay::scalar, Rule::delta};
  Case c = test::decode_case(p);
  CHECK(cpu::decode_case_copies(c) == 1);
  c.options["cache"] = "cold";
  const std::size_t copies = cpu::decode_case_copies(c);
  // Each copy: q, k, v, o (16 floats a head), g and beta (one a head), the 16 x 16 states.
  const std::size_t copy = 4 * (4 * 4 * 16 + 2 * 4 + 4 * 256);
  const std::size_t span = cold_span_bytes(machine_last_level_cache_bytes());
  CHECK(copies * copy > span);
  CHECK((copies - 1) * copy <= span);
  // Checked after the timed calls stepped every copy: one step from h0 on copy 0.
  auto backend = make_backend("cpu", BackendOptions{2});
  const TensorSet all = make_case_inputs(c, 5);
  const Reference ref = c.op->reference(c, all, false);
  auto prepared = backend->find("decode", "step")->prepare(c, all.inputs_for(c.mode));
  prepared->time_ms(int(copies) + 3);
  TensorSet outputs = make_case_outputs(c);
  prepared->read_outputs(outputs);
  CHECK(check_outputs(c, outputs, ref).passed);
  // The other copies are held beside the case's own tensors, their pools with the outputs.
  const MemoryUsage m = prepared->memory();
  CHECK(m.arg_bytes + m.out_bytes >= copies * copy);
}

TEST_CASE("cache: an evicting case evicts outside each call's timing and forwards the rest", "[cache]") {
  auto counting = std::make_unique<Counting>();
  Counting* inner = counting.get();
  cpu::EvictingCase evicting(std::move(counting));
  const double ms = evicting.time_ms(3);
  CHECK(inner->runs == 3);
  CHECK(ms >= 0);
  CHECK(ms < 100);  // the calls' own time, not the evictions' (~ms each over twice the cache)
  TensorSet outputs;
  evicting.read_outputs(outputs);
  CHECK(inner->reads == 1);
  // A cold kernel-suite case on the CPU runs evicting and still matches its reference.
  Case c = test::kernel_case({1, 2, 64, 16, 16, Decay::none}, "scan", Mode::fwd);
  c.options["cache"] = "cold";
  const test::Outcome r = test::run_on(*make_backend("cpu", BackendOptions{1}), c, 4);
  CHECK(r.check.passed);
}

TEST_CASE("cache: records name the roof, its rate and the working set they are held against, and say when they "
          "pass it",
          "[cache][cli][spawns]") {
  const auto dir = test::fresh_dir("cache-records");
  const std::string out = (dir / "c.json").string();
  // Working sets from a few KiB to 4 MiB: the first level, L2 and the last level when warm.
  const test::ProcessResult r = test::run_process(
      "timeout 300 " + test::binary() +
      " --suite decode --batch 1,16,64 --heads 4 --dim 64 --tokens 1 "
      "--rule additive --decay none --cache cold,warm --reps 2 --warmup 0 --min-sample-ms 1 --threads 2 --out " +
      out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  const auto& device = doc["device"];
  REQUIRE(doc["results"].size() == 6);
  // The device block carries the sweep, the DRAM triad its last point, and the levels read off it.
  REQUIRE(device.contains("bandwidth_sweep"));
  const auto& bytes = device["bandwidth_sweep"]["bytes"];
  const auto& rates = device["bandwidth_sweep"]["gbytes_per_s"];
  REQUIRE(bytes.size() == rates.size());
  REQUIRE(bytes.size() >= 2);
  CHECK(device["bandwidth_sweep"]["seconds"].get<double>() > 0);
  std::vector<BandwidthPoint> sweep;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    sweep.push_back({bytes[i].get<std::size_t>(), rates[i].get<double>()});
    CHECK(sweep.back().gbytes_per_s > 0);
    if (i > 0) CHECK(sweep[i].bytes > sweep[i - 1].bytes);
  }
  CHECK(sweep.front().bytes == 16 * KiB);
  CHECK(sweep.back().bytes * 3 == 2 * device["stream_bytes"].get<std::size_t>());
  CHECK(sweep.back().gbytes_per_s == device["stream_gbytes_per_s"].get<double>());
  const std::vector<CacheRoof> levels = cache_levels_from_sweep(sweep);
  REQUIRE(device.value("cache_gbytes_per_s", nlohmann::json::object()).size() == levels.size());
  for (const CacheRoof& level : levels) {
    CHECK(device.at("cache_gbytes_per_s").at(level.level).get<double>() == level.gbytes_per_s);
    CHECK(device.at("cache_roof_bytes").at(level.level).get<std::size_t>() == level.capacity_bytes);
  }
  // Sysfs's own figures beside them, where it gives any.
  const std::vector<CacheRoof> sysfs = sysfs_cache_levels(2);
  REQUIRE(device.contains("sysfs_cache_bytes") == !sysfs.empty());
  for (const CacheRoof& cache : sysfs) CHECK(device.at("sysfs_cache_bytes").at(cache.level) == cache.capacity_bytes);
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    const double working_set = (rec["out_mb"].get<double>() + rec["temp_mb"].get<double>()) * double(MiB);
    CHECK(rec["working_set_bytes"].get<double>() == Approx(working_set));
    // A cold case re-measures the DRAM rate around itself; its roof is the larger figure.
    const bool cold = rec["cache"] == "cold";
    CHECK(rec.contains("stream_gbytes_per_s_now") == cold);
    const double dram = std::max(device["stream_gbytes_per_s"].get<double>(),
                                 cold ? rec["stream_gbytes_per_s_now"].get<double>() : 0.0);
    if (cold) CHECK(rec["stream_gbytes_per_s_now"].get<double>() > 0);
    // A warm one: the sweep's rate at its own working set.
    if (!cold) CHECK(rec["bandwidth_roof_gbytes_per_s"].get<double>() == Approx(*sweep_rate_at(sweep, working_set)));
    const BandwidthRoof roof = bandwidth_roof(cold, rec["working_set_bytes"].get<double>(), sweep, levels, dram);
    CHECK(rec["bandwidth_roof"] == roof.name);
    REQUIRE(roof.gbytes_per_s);
    CHECK(rec["bandwidth_roof_gbytes_per_s"].get<double>() == Approx(*roof.gbytes_per_s));
    CHECK(rec["bandwidth_fraction"].get<double>() == Approx(rec["gbytes_per_s"].get<double>() / *roof.gbytes_per_s));
    CHECK(rec["above_roof"] == (rec["bandwidth_fraction"].get<double>() > 1.05));
    CHECK(rec["above_ceiling"] == (rec["peak_fraction"].get<double>() > 1.05));
  }
}

TEST_CASE("cache: --cold is --cache cold, and both at once are refused in one line", "[cache][cli][spawns]") {
  const auto dir = test::fresh_dir("cache-flag");
  const std::string out = (dir / "c.json").string();
  const test::ProcessResult r =
      test::run_process("timeout 300 " + test::binary() +
                        " --suite kernel --batch 1 --heads 1 --seq 64 --dim 16 --mode fwd "
                        "--impl scan --cold --reps 1 --warmup 0 --min-sample-ms 1 --threads 1 --out " +
                        out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 1);
  CHECK(doc["results"][0]["cache"] == "cold");
  CHECK(doc["results"][0]["status"] == "ok");
  const test::ProcessResult both =
      test::run_process("timeout 60 " + test::binary() + " --suite kernel --cold --cache warm --quiet --out " + out);
  CHECK(both.exit_status == 2);
  CHECK(both.output.find("--cold") != std::string::npos);
  CHECK(std::count(both.output.begin(), both.output.end(), '\n') == 1);
}

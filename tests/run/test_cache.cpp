// Cold and warm (core/op.hpp, cache_axis; docs/harness.md, "Cold and warm"): which roof a record's
// bandwidth is held against (src/run/bandwidth_roof.hpp), how the CPU backend makes a call cold
// (backends/cpu/cold.hpp: rotating copies past twice the last-level cache, or evicting), the
// cache roofs of the device block, and the key's flags.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/cold.hpp"
#include "backends/cpu/decode_case.hpp"
#include "backends/cpu/roofline.hpp"
#include "kernels/decode/op.hpp"
#include "src/run/bandwidth_roof.hpp"
#include "test_util.hpp"

using namespace lattn;
using lattn::cpu::cold_copies;
using lattn::cpu::eviction_bytes;
using lattn::cpu::rotation_fits;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// Zen 5 with two threads: 48 KiB L1d and 1 MiB L2 per core, a 32 MiB L3.
const std::vector<CacheRoof> kLevels = {{"L1d", 96 * KiB, 400.0}, {"L2", 2 * MiB, 200.0}, {"L3", 32 * MiB, 100.0}};

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

TEST_CASE("cache: a cold case's roof is DRAM, a warm one's the smallest level its working set fits",
          "[cache][roofline]") {
  for (double ws : {1.0 * KiB, 1.0 * MiB, 20.0 * MiB, 1000.0 * MiB}) {
    const BandwidthRoof cold = bandwidth_roof(true, ws, kLevels, 50.0);
    CHECK(cold.name == "dram");
    CHECK(cold.gbytes_per_s == 50.0);
  }
  const auto warm = [](double ws) { return bandwidth_roof(false, ws, kLevels, 50.0); };
  CHECK(warm(10 * KiB).name == "l1d");
  CHECK(warm(10 * KiB).gbytes_per_s == 400.0);
  CHECK(warm(96 * KiB).name == "l1d");  // exactly the capacity still fits
  CHECK(warm(96 * KiB + 1).name == "l2");
  CHECK(warm(1 * MiB).gbytes_per_s == 200.0);
  CHECK(warm(20 * MiB).name == "llc");  // the last level is named llc, whatever its number
  CHECK(warm(20 * MiB).gbytes_per_s == 100.0);
  // Past the last level but within its cold span (16 x 32 MiB): partly served there, held against it.
  CHECK(warm(64 * MiB).name == "llc");
  CHECK(warm(64 * MiB).gbytes_per_s == 100.0);
  CHECK(warm(512 * MiB).name == "llc");
  CHECK(warm(512 * MiB + 1).name == "dram");
  CHECK(warm(512 * MiB + 1).gbytes_per_s == 50.0);
  // Without the levels (sysfs said nothing): DRAM; a level not measured: named, no rate to divide by.
  CHECK(bandwidth_roof(false, 1.0, {}, 50.0).name == "dram");
  const BandwidthRoof unmeasured = bandwidth_roof(false, 1.0, {{"L1d", 96 * KiB, 0.0}}, 50.0);
  CHECK(unmeasured.name == "llc");
  CHECK_FALSE(unmeasured.gbytes_per_s);
  CHECK_FALSE(bandwidth_roof(true, 1.0, kLevels, 0.0).gbytes_per_s);
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

TEST_CASE("cache: records name the roof they are held against, and say when they pass it", "[cache][cli]") {
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
  std::vector<CacheRoof> levels;
  if (device.contains("cache_gbytes_per_s"))
    for (const auto& [level, rate] : device["cache_gbytes_per_s"].items()) {
      CHECK(rate.get<double>() > 0);
      levels.push_back({level, device["cache_roof_bytes"][level].get<std::size_t>(), rate.get<double>()});
    }
  std::sort(levels.begin(), levels.end(),
            [](const CacheRoof& a, const CacheRoof& b) { return a.capacity_bytes < b.capacity_bytes; });
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    const double working_set = (rec["out_mb"].get<double>() + rec["temp_mb"].get<double>()) * double(MiB);
    // A cold case re-measures the DRAM rate around itself; its roof is the larger figure.
    const bool cold = rec["cache"] == "cold";
    CHECK(rec.contains("stream_gbytes_per_s_now") == cold);
    const double dram = std::max(device["stream_gbytes_per_s"].get<double>(),
                                 cold ? rec["stream_gbytes_per_s_now"].get<double>() : 0.0);
    if (cold) CHECK(rec["stream_gbytes_per_s_now"].get<double>() > 0);
    const BandwidthRoof roof = bandwidth_roof(cold, working_set, levels, dram);
    CHECK(rec["bandwidth_roof"] == roof.name);
    REQUIRE(roof.gbytes_per_s);
    CHECK(rec["bandwidth_fraction"].get<double>() == Approx(rec["gbytes_per_s"].get<double>() / *roof.gbytes_per_s));
    CHECK(rec["above_roof"] == (rec["bandwidth_fraction"].get<double>() > 1.05));
    CHECK(rec["above_ceiling"] == (rec["peak_fraction"].get<double>() > 1.05));
  }
}

TEST_CASE("cache: --cold is --cache cold, and both at once are refused in one line", "[cache][cli]") {
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

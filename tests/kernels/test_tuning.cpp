// The CPU kernels' runtime choices (kernels/cpu/tuning.hpp) and how a run decides them
// (backends/cpu/tuning.hpp): every candidate of every choice on the test table against the float64
// reference, at every vector width this machine has; the shipped table's keying by signature; the
// cache's reading, writing and replacement; and the device block's `tuning`, in process and
// through the binary (--tuning, --retune, LATTN_TUNING); the exhaustive search and its record.
// Over 500 lines (and just past 650): the choice table, the decision, its cache, its command line
// and the exhaustive search are one feature, whose fakes (calibrator, searcher) the tests share.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "backends/cpu/tuning.hpp"
#include "src/cli/cli.hpp"
#include "core/error.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"
#include "op_table.hpp"
#include "src/results/build_info.hpp"
#include "src/results/record_json.hpp"
#include "test_util.hpp"

using namespace lattn;
using cpu::Vec;
using cpu::tuning::Knob;
using cpu::tuning::Setting;

namespace {

const std::string kZen4 = "AuthenticAMD family 25 model 17 stepping 1";
const std::string kZen5 = "AuthenticAMD family 26 model 2 stepping 0";

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A setting that differs from the defaults in every choice that has another candidate.
Setting other_than_defaults(Vec vec) {
  Setting s = cpu::tuning::defaults(vec);
  for (Knob k : cpu::tuning::kAllKnobs) s[k] = cpu::tuning::candidates(k, vec).back();
  return s;
}

// A calibrator that counts its calls and returns `result` at once.
struct FakeCalibrator {
  int calls = 0;
  Setting result;
  cpu::Calibrator get() {
    return [this](Vec) {
      ++calls;
      return cpu::Calibration{result, 0.25, {}};
    };
  }
};

struct ProductPathOverride {
  explicit ProductPathOverride(cpu::ProductPath path) { cpu::set_product_path(path); }
  ~ProductPathOverride() { cpu::set_product_path(std::nullopt); }
};

bool is_additive(const Case& c) { return c.option("rule").empty() || c.option("rule") == "additive"; }

}  // namespace

TEST_CASE("tuning: the choices' tables hold today's choices as defaults, and a setting is checked", "[tuning]") {
  for (Vec vec : {Vec::generic, Vec::avx2, Vec::avx512})
    for (Knob k : cpu::tuning::kAllKnobs) {
      INFO(cpu::to_string(vec) << " " << cpu::tuning::kernel_of(k) << "." << cpu::tuning::name_of(k));
      REQUIRE_FALSE(cpu::tuning::candidates(k, vec).empty());
      CHECK(cpu::tuning::default_value(k, vec) == cpu::tuning::candidates(k, vec).front());
    }
  // The values the kernels were measured and written with on Zen 4 (docs/performance.md).
  const Setting avx512 = cpu::tuning::defaults(Vec::avx512);
  CHECK(avx512[Knob::scan_tokens_per_walk] == 6);
  CHECK(avx512[Knob::scan_column_block] == 32);
  CHECK(avx512[Knob::scan_prefetch_rows] == 1);
  CHECK(avx512[Knob::gemm_micro_rows] == 14);
  CHECK(avx512[Knob::gemm_depth_block] == 256);
  CHECK(avx512[Knob::gemm_row_tiles] * avx512[Knob::gemm_micro_rows] == 140);
  CHECK(avx512[Knob::tile_prefetch_next] == 1);  // into L2
  const Setting avx2 = cpu::tuning::defaults(Vec::avx2);
  CHECK(avx2[Knob::scan_tokens_per_walk] == 2);
  CHECK(avx2[Knob::scan_column_block] == 16);
  CHECK(avx2[Knob::gemm_micro_rows] == 6);
  CHECK(avx2[Knob::gemm_row_tiles] * avx2[Knob::gemm_micro_rows] == 120);

  // The structures: the chunked products on the tiles at AVX-512 (sgemm the other), on sgemm alone
  // where there are no tiles; the layer's on the packed products at AVX-512, on OpenBLAS at AVX2
  // (the packed AVX2 kernel the other), on OpenBLAS alone at the generic width.
  using cpu::tuning::kProductsBlas;
  using cpu::tuning::kProductsPacked;
  CHECK(cpu::tuning::candidates(Knob::chunked_products, Vec::avx512) == std::vector<int>{kProductsPacked, kProductsBlas});
  CHECK(cpu::tuning::candidates(Knob::chunked_products, Vec::avx2) == std::vector<int>{kProductsBlas});
  CHECK(cpu::tuning::candidates(Knob::layer_products, Vec::avx512) == std::vector<int>{kProductsPacked, kProductsBlas});
  CHECK(cpu::tuning::candidates(Knob::layer_products, Vec::avx2) == std::vector<int>{kProductsBlas, kProductsPacked});
  CHECK(cpu::tuning::candidates(Knob::layer_products, Vec::generic) == std::vector<int>{kProductsBlas});
  CHECK(cpu::tuning::value_text(Knob::chunked_products, kProductsPacked) == "packed");
  CHECK(cpu::tuning::value_text(Knob::chunked_products, kProductsBlas) == "blas");
  CHECK(cpu::tuning::value_text(Knob::layer_products, kProductsBlas) == "openblas");
  CHECK(cpu::tuning::value_text(Knob::gemm_micro_rows, 14) == "14");
  for (Knob k : cpu::tuning::kAllKnobs)
    for (Vec vec : {Vec::generic, Vec::avx2, Vec::avx512})
      for (int v : cpu::tuning::candidates(k, vec)) CHECK(cpu::tuning::value_from_label(k, cpu::tuning::value_text(k, v)) == v);
  CHECK(cpu::tuning::value_from_label(Knob::chunked_products, "openblas") == -1);
  CHECK(cpu::tuning::value_from_label(Knob::layer_products, "14") == -1);

  Setting bad = avx512;
  bad[Knob::scan_tokens_per_walk] = 7;
  CHECK_THAT(cpu::tuning::invalid(bad, Vec::avx512), Catch::Contains("scan.tokens_per_walk 7"));
  CHECK_THROWS_AS(cpu::tuning::set(Vec::avx512, bad), std::invalid_argument);
  CHECK(cpu::tuning::current(Vec::avx512) == avx512);
  Setting tiles_at_avx2 = avx2;
  tiles_at_avx2[Knob::chunked_products] = kProductsPacked;
  CHECK(cpu::tuning::invalid(tiles_at_avx2, Vec::avx2) == "chunked.products packed is not one of avx2's candidates (blas)");
}

TEST_CASE("tuning: the kernels read the setting in force at their width", "[tuning]") {
  for (Vec vec : cpu::available_vecs()) {
    if (vec == Vec::generic) continue;
    const test::VecOverride forced(vec);
    const Setting other = other_than_defaults(vec);
    const cpu::tuning::Scoped scoped(vec, other);
    INFO(cpu::to_string(vec));
    CHECK(cpu::scan_tokens_per_walk(vec) == other[Knob::scan_tokens_per_walk]);
    CHECK(cpu::scan_column_block(vec) == other[Knob::scan_column_block]);
    CHECK(cpu::scan_prefetch_rows(vec) == (other[Knob::scan_prefetch_rows] != 0));
    CHECK(std::string(cpu::gemm::kernel_name()) == (vec == Vec::avx512 ? "avx512_8x32" : "avx2_4x16"));
    // The A scratch is sized by the tuned micro-tile, MC and KC.
    const int mr = other[Knob::gemm_micro_rows], mc = other[Knob::gemm_row_tiles] * mr,
              kc = other[Knob::gemm_depth_block];
    CHECK(cpu::gemm::packed_a_floats(10000, 10000) == std::size_t(mc) * kc);
  }
  CHECK(std::string(cpu::gemm::kernel_name()) != "avx512_8x32");  // restored
}

// The test table (tests/op_table.hpp) once per candidate of each choice, the other choices at
// their defaults: the scan's choices on the additive rule's scan cases (every decay, fwd and
// fwd_bwd, T 1 to 300 with ragged walks and blocks) and the layer's scan branch; the packed
// products' constants on every layer case, through the packed products at every width; the tile
// products' prefetch on every chunked case (every rule and decay) and the layer's chunked branch.
// The structural choices run every alternative, the default too, each on the cases whose code it
// picks, and the variant the backend names for them (records' `variant`) shows the alternative ran:
// chunked.products on the additive rule's chunked cases without gates (chunked_tiled or
// chunked_blas), layer.products on every layer case ("products packed_..." or "products openblas").
TEST_CASE("tuning: every candidate of every choice matches the float64 reference on the test table", "[tuning][ops]") {
  int candidates_run = 0, structures_run = 0;
  for (Vec vec : cpu::available_vecs()) {
    const test::VecOverride forced(vec);
    for (Knob knob : cpu::tuning::kAllKnobs)
      for (int candidate : cpu::tuning::candidates(knob, vec)) {
        const bool structural = cpu::tuning::value_label(knob, candidate) != nullptr;
        // The whole table runs the defaults.
        if (!structural && candidate == cpu::tuning::default_value(knob, vec)) continue;
        Setting setting = cpu::tuning::defaults(vec);
        setting[knob] = candidate;
        const cpu::tuning::Scoped scoped(vec, setting);
        const std::string kernel = cpu::tuning::kernel_of(knob);
        // The packed products' constants are read on the packed path alone: forced there. The
        // layer's own choice picks the path itself.
        std::optional<ProductPathOverride> packed;
        if (kernel == "packed_gemm") packed.emplace(cpu::ProductPath::packed);
        INFO(cpu::to_string(vec) << " " << kernel << "." << cpu::tuning::name_of(knob) << " "
                                 << cpu::tuning::value_text(knob, candidate));
        const test::TableRun run = test::run_op_table(
            "cpu", [](const BackendOptions& o) { return make_backend("cpu", o); },
            [&](const Case& c) {
              if (c.dtype != "float32") return false;
              const bool linear = c.op->name == "linear_attention" || c.op->name == "layer";
              if (kernel == "scan") return c.impl == "scan" && is_additive(c) && linear;
              if (kernel == "tile_products") return c.impl == "chunked" && linear;
              // The rows chunked.products picks between: the additive rule without gates.
              if (kernel == "chunked")
                return c.impl == "chunked" && c.op->name == "linear_attention" && is_additive(c) &&
                       (c.decay == "none" || c.decay == "retnet");
              return c.op->name == "layer";
            });
        CHECK(run.checked > 0);
        if (kernel != "chunked") CHECK(run.checked_by_op.count("layer") == 1);
        if (kernel != "packed_gemm" && kernel != "layer") CHECK(run.checked_by_op.count("linear_attention") == 1);
        if (knob == Knob::chunked_products) {
          const bool tiles = candidate == cpu::tuning::kProductsPacked;
          auto cases_of = [&](const std::string& name) {
            int cases = 0;
            for (const auto& [variant, n] : run.checked_by_variant)
              if (variant.find(name) != std::string::npos) cases += n;
            return cases;
          };
          CHECK(cases_of(tiles ? "chunked_tiled" : "chunked_blas") > 0);
          CHECK(cases_of(tiles ? "chunked_blas" : "chunked_tiled") == 0);
          ++structures_run;
        }
        if (knob == Knob::layer_products) {
          int packed_cases = 0, openblas_cases = 0;
          for (const auto& [variant, cases] : run.checked_by_variant) {
            if (variant.find("products packed_") != std::string::npos) packed_cases += cases;
            if (variant.find("products openblas") != std::string::npos) openblas_cases += cases;
          }
          // The hybrid block follows the choice (a modern block, were there one, is OpenBLAS's always).
          if (candidate == cpu::tuning::kProductsPacked) {
            CHECK(packed_cases > 0);
          } else {
            CHECK(packed_cases == 0);
            CHECK(openblas_cases > 0);
          }
          ++structures_run;
        }
        ++candidates_run;
      }
  }
  // Every width has at least the structural defaults; AVX2 adds the layer's packed products.
  CHECK(structures_run >= 2 * int(cpu::available_vecs().size()));
  // At AVX-512: 2 + 1 + 1 scan, 2 + 2 + 2 product and 2 tile candidates besides the defaults, and
  // both alternatives of both structures.
  if (cpu::active_vec() == Vec::avx512)
    CHECK(candidates_run >= 16);
  else if (cpu::active_vec() == Vec::generic)
    WARN("no vector width here: no candidates besides the defaults to run");
}

TEST_CASE("tuning: the shipped table is keyed by vendor, family and model", "[tuning]") {
  for (const std::string& sig :
       {kZen4, std::string("AuthenticAMD family 25 model 97 stepping 2"),
        std::string("AuthenticAMD family 25 model 160 stepping 0"), std::string("AuthenticAMD family 25 model 17")}) {
    INFO(sig);
    const auto shipped = cpu::shipped_tuning(sig, Vec::avx512);
    REQUIRE(shipped);
    CHECK(shipped->microarchitecture == "zen4");
    CHECK(shipped->setting == cpu::tuning::defaults(Vec::avx512));
  }
  for (const std::string& sig : {kZen5, std::string("AuthenticAMD family 25 model 1 stepping 1"),  // Zen 3
                                 std::string("GenuineIntel family 6 model 143 stepping 8"),
                                 std::string("GenuineIntel family 6 model 167 stepping 1"),
                                 std::string("GenuineIntel family 25 model 17 stepping 1"), std::string(""),
                                 std::string("AuthenticAMD family x model 17")}) {
    INFO(sig);
    CHECK_FALSE(cpu::shipped_tuning(sig, Vec::avx512));
  }
  CHECK_FALSE(cpu::shipped_tuning(kZen4, Vec::avx2));  // measured at AVX-512 only
}

TEST_CASE("tuning: the cache lives under XDG_CACHE_HOME or ~/.cache, one file per signature", "[tuning]") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::optional<std::string> saved_xdg = xdg ? std::optional<std::string>(xdg) : std::nullopt;
  const std::optional<std::string> saved_home = home ? std::optional<std::string>(home) : std::nullopt;
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  CHECK(cpu::tuning_cache_path(kZen5) == "/tmp/xdg/lattnbench/tuning-AuthenticAMD-family-26-model-2-stepping-0.json");
  CHECK(cpu::tuning_cache_path(kZen4) != cpu::tuning_cache_path(kZen5));
  CHECK(cpu::tuning_cache_path("") == "");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/someone", 1);
  CHECK(cpu::tuning_cache_path(kZen5) ==
        "/home/someone/.cache/lattnbench/tuning-AuthenticAMD-family-26-model-2-stepping-0.json");
  ::unsetenv("HOME");
  CHECK(cpu::tuning_cache_path(kZen5) == "");
  if (saved_home) ::setenv("HOME", saved_home->c_str(), 1);
  if (saved_xdg) ::setenv("XDG_CACHE_HOME", saved_xdg->c_str(), 1);
}

TEST_CASE("tuning: auto calibrates an unknown CPU once, then reads the cache, and calibrate redoes it", "[tuning]") {
  const Vec vec = Vec::avx512;
  const auto dir = test::fresh_dir("tuning-cache");
  const std::string path = (dir / "lattnbench" / "tuning-x.json").string();
  FakeCalibrator fake;
  fake.result = other_than_defaults(vec);

  const TuningInfo first = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get());
  CHECK(first.source == "calibrated");
  CHECK(fake.calls == 1);
  REQUIRE(first.cache);
  CHECK(*first.cache == path);
  CHECK_FALSE(first.note);
  REQUIRE(std::filesystem::exists(path));
  const nlohmann::json file = read_json(path);
  CHECK(file["cpu_signature"] == kZen5);
  CHECK(file["vector_width"] == "avx512");
  CHECK(file["choices"]["scan"]["tokens_per_walk"] == fake.result[Knob::scan_tokens_per_walk]);
  CHECK(file["choices"]["packed_gemm"]["micro_rows"] == fake.result[Knob::gemm_micro_rows]);
  // The structures by name: other_than_defaults took the last candidate of each.
  CHECK(file["choices"]["chunked"]["products"] == "blas");
  CHECK(file["choices"]["layer"]["products"] == "openblas");
  CHECK(file["trials"].is_array());
  CHECK_FALSE(file.contains("exhaustive"));

  const TuningInfo second = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get());
  CHECK(second.source == "cached");
  CHECK(fake.calls == 1);  // nothing added to later runs
  REQUIRE(second.calibration_s);
  CHECK(*second.calibration_s == Approx(0.25));
  const TuningInfo expected = cpu::tuning_info("cached", vec, fake.result);
  REQUIRE(second.choices.size() == expected.choices.size());
  for (std::size_t i = 0; i < expected.choices.size(); ++i) CHECK(second.choices[i].value == expected.choices[i].value);

  // --retune: calibrated again and the cache replaced.
  fake.result = cpu::tuning::defaults(vec);
  const TuningInfo again = cpu::decide_tuning(cpu::TuningMode::calibrate, kZen5, vec, path, fake.get());
  CHECK(again.source == "calibrated");
  CHECK(fake.calls == 2);
  CHECK(read_json(path)["choices"]["scan"]["tokens_per_walk"] == 6);

  // default and shipped never calibrate nor read the cache.
  CHECK(cpu::decide_tuning(cpu::TuningMode::defaults, kZen5, vec, path, fake.get()).source == "default");
  CHECK(cpu::decide_tuning(cpu::TuningMode::shipped, kZen5, vec, path, fake.get()).source == "default");
  const TuningInfo zen4 = cpu::decide_tuning(cpu::TuningMode::shipped, kZen4, vec, path, fake.get());
  CHECK(zen4.source == "shipped");
  CHECK(zen4.microarchitecture == std::optional<std::string>("zen4"));
  CHECK(fake.calls == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("tuning: auto takes the shipped table for a known CPU, and a cache made by --retune over it", "[tuning]") {
  const Vec vec = Vec::avx512;
  const auto dir = test::fresh_dir("tuning-shipped");
  const std::string path = (dir / "tuning-zen4.json").string();
  FakeCalibrator fake;
  fake.result = other_than_defaults(vec);
  const TuningInfo shipped = cpu::decide_tuning(cpu::TuningMode::automatic, kZen4, vec, path, fake.get());
  CHECK(shipped.source == "shipped");
  CHECK(fake.calls == 0);
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(cpu::decide_tuning(cpu::TuningMode::calibrate, kZen4, vec, path, fake.get()).source == "calibrated");
  CHECK(cpu::decide_tuning(cpu::TuningMode::automatic, kZen4, vec, path, fake.get()).source == "cached");
  CHECK(fake.calls == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("tuning: a cache that is malformed or not this CPU's is reported and replaced", "[tuning]") {
  const Vec vec = Vec::avx512;
  const auto dir = test::fresh_dir("tuning-bad");
  const std::string path = (dir / "tuning.json").string();
  const std::string good = "{\"lattnbench_tuning\": 2, \"cpu_signature\": \"" + kZen5 +
                           "\", \"vector_width\": \"avx512\", \"choices\": {\"scan\": {\"tokens_per_walk\": 6, "
                           "\"column_block\": 32, \"prefetch_rows\": 1}, \"packed_gemm\": {\"micro_rows\": 14, "
                           "\"depth_block\": 256, \"row_tiles\": 10}, \"tile_products\": {\"prefetch_next\": 1}, "
                           "\"chunked\": {\"products\": \"packed\"}, \"layer\": {\"products\": \"openblas\"}}}";
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  struct Bad {
    std::string text, problem;
  };
  const std::vector<Bad> bad = {
      {"{not json", "is not JSON"},
      {"[1, 2]", "is not a lattnbench tuning cache"},
      {with("\"lattnbench_tuning\": 2", "\"lattnbench_tuning\": 99"), "is not a lattnbench tuning cache"},
      // Format 1 named no structures: replaced, not misread.
      {with("\"lattnbench_tuning\": 2", "\"lattnbench_tuning\": 1"), "is not a lattnbench tuning cache of format 2"},
      {with("\"products\": \"packed\"", "\"products\": \"tiles\""), "has no named choices.chunked.products"},
      {with("\"products\": \"packed\"", "\"products\": 0"), "has no named choices.chunked.products"},
      {with("\"products\": \"openblas\"", "\"products\": \"blas\""), "has no named choices.layer.products"},
      {with("\"tokens_per_walk\": 6", "\"tokens_per_walk\": 7"),
       "holds scan.tokens_per_walk 7 is not one of avx512's candidates"},
      {with("\"tokens_per_walk\": 6", "\"tokens_per_walk\": \"6\""), "has no integer choices.scan.tokens_per_walk"},
      {with(", \"prefetch_rows\": 1", ""), "has no integer choices.scan.prefetch_rows"},
      {with("avx512", "avx2"), "is for vector width 'avx2'"},
      {with(kZen5, kZen4), "is for cpu_signature"},
  };
  // The well-formed file is read (so each bad one fails for its own defect).
  write_text(path, with("\"tokens_per_walk\": 6", "\"tokens_per_walk\": 5"));
  FakeCalibrator fake;
  fake.result = cpu::tuning::defaults(vec);
  const TuningInfo ok = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get());
  CHECK(ok.source == "cached");
  CHECK(ok.choices.front().value == 5);
  CHECK(ok.choices[std::size_t(Knob::chunked_products)].value == cpu::tuning::kProductsPacked);
  CHECK(ok.choices[std::size_t(Knob::layer_products)].value == cpu::tuning::kProductsBlas);
  CHECK(ok.choices[std::size_t(Knob::layer_products)].label == "openblas");
  for (const Bad& b : bad) {
    INFO(b.text);
    write_text(path, b.text);
    const int calls = fake.calls;
    const TuningInfo info = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get());
    CHECK(info.source == "calibrated");
    CHECK(fake.calls == calls + 1);
    REQUIRE(info.note);
    CHECK_THAT(*info.note, Catch::Contains(path) && Catch::Contains(b.problem) && Catch::Contains("calibrated again"));
    // Replaced by a good one: the next run reads it.
    CHECK(cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get()).source == "cached");
  }
  // No cache folder, or one that cannot be written: the calibration is used, not kept, and said so.
  const TuningInfo nowhere = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, "", fake.get());
  CHECK(nowhere.source == "calibrated");
  CHECK_FALSE(nowhere.cache);
  REQUIRE(nowhere.note);
  CHECK_THAT(*nowhere.note, Catch::Contains("not kept"));
  write_text(dir / "a-file", "x");
  const TuningInfo blocked =
      cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, (dir / "a-file" / "tuning.json").string(), fake.get());
  CHECK(blocked.source == "calibrated");
  REQUIRE(blocked.note);
  CHECK_THAT(*blocked.note, Catch::Contains("not kept"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("tuning: the device block records the choices and their source", "[tuning]") {
  DeviceInfo device;
  device.backend = "cpu";
  device.cpu = CpuDeviceInfo{};
  TuningInfo info = cpu::tuning_info("cached", Vec::avx512, other_than_defaults(Vec::avx512));
  info.cache = "/tmp/x/tuning.json";
  info.calibration_s = 1.5;
  device.cpu->tuning = info;
  const nlohmann::json t = to_json(device)["tuning"];
  CHECK(t["source"] == "cached");
  CHECK(t["vector_width"] == "avx512");
  CHECK(t["cache"] == "/tmp/x/tuning.json");
  CHECK(t["calibration_s"] == 1.5);
  CHECK(t["choices"]["scan"]["tokens_per_walk"] == 4);
  CHECK(t["choices"]["scan"]["column_block"] == 16);
  CHECK(t["choices"]["scan"]["prefetch_rows"] == 0);
  CHECK(t["choices"]["packed_gemm"]["micro_rows"] == 8);
  CHECK(t["choices"]["packed_gemm"]["depth_block"] == 384);
  CHECK(t["choices"]["packed_gemm"]["row_tiles"] == 20);
  CHECK(t["choices"]["tile_products"]["prefetch_next"] == 0);
  // The plan's structures, by name.
  CHECK(t["choices"]["chunked"]["products"] == "blas");
  CHECK(t["choices"]["layer"]["products"] == "openblas");
  CHECK_FALSE(t.contains("note"));
  CHECK_FALSE(t.contains("exhaustive"));
}

// --tuning exhaustive: the calibration, then the search from its plan; the search's plan runs and is
// cached beside the calibration's, and the groups' times are recorded and read back by later runs.
TEST_CASE("tuning: exhaustive runs the search's plan, caches it per signature and records the gaps", "[tuning]") {
  const Vec vec = Vec::avx512;
  const auto dir = test::fresh_dir("tuning-exhaustive");
  const std::string path = (dir / "tuning.json").string();
  FakeCalibrator fake;
  fake.result = cpu::tuning::defaults(vec);
  int searches = 0;
  const Setting best = other_than_defaults(vec);
  const cpu::Searcher search = [&](Vec v, const Setting& quick) {
    ++searches;
    CHECK(v == vec);
    CHECK(quick == fake.result);  // the search starts from the calibration's plan
    cpu::ExhaustiveSearch out;
    out.setting = best;
    out.seconds = 42.0;
    TuningInfo::PlanGap chunked;
    chunked.kernel = "chunked";
    chunked.combinations = 6;
    chunked.quick_ms = 110.0;
    chunked.best_ms = 100.0;
    chunked.best = cpu::tuning_info("x", vec, best).choices;
    chunked.best.erase(std::remove_if(chunked.best.begin(), chunked.best.end(),
                                      [](const TuningInfo::Choice& c) {
                                        return c.kernel != "chunked" && c.kernel != "tile_products";
                                      }),
                       chunked.best.end());
    out.groups = {chunked};
    return out;
  };

  const TuningInfo info = cpu::decide_tuning(cpu::TuningMode::exhaustive, kZen5, vec, path, fake.get(), search);
  CHECK(info.source == "exhaustive");
  CHECK(fake.calls == 1);
  CHECK(searches == 1);
  const TuningInfo expected = cpu::tuning_info("exhaustive", vec, best);
  REQUIRE(info.choices.size() == expected.choices.size());
  for (std::size_t i = 0; i < expected.choices.size(); ++i) CHECK(info.choices[i].value == expected.choices[i].value);
  REQUIRE(info.exhaustive.size() == 1);
  CHECK(info.exhaustive_s == std::optional<double>(42.0));

  // The cache: the search's plan in force, the calibration's beside it, the groups.
  const nlohmann::json file = read_json(path);
  CHECK(file["lattnbench_tuning"] == 2);
  CHECK(file["choices"]["chunked"]["products"] == "blas");
  CHECK(file["quick_choices"]["chunked"]["products"] == "packed");
  REQUIRE(file["exhaustive"].is_array());
  REQUIRE(file["exhaustive"].size() == 1);
  CHECK(file["exhaustive"][0]["kernel"] == "chunked");
  CHECK(file["exhaustive"][0]["quick_ms"] == 110.0);
  CHECK(file["exhaustive"][0]["best_ms"] == 100.0);
  CHECK(file["exhaustive"][0]["best"]["chunked"]["products"] == "blas");
  CHECK(file["exhaustive_s"] == 42.0);

  // A later auto run takes that plan from the cache, with the search's report.
  const TuningInfo later = cpu::decide_tuning(cpu::TuningMode::automatic, kZen5, vec, path, fake.get(), search);
  CHECK(later.source == "cached");
  CHECK(fake.calls == 1);
  CHECK(searches == 1);
  CHECK(later.choices[std::size_t(Knob::chunked_products)].label == "blas");
  REQUIRE(later.exhaustive.size() == 1);
  CHECK(later.exhaustive[0].kernel == "chunked");
  CHECK(later.exhaustive[0].combinations == 6);
  REQUIRE(later.exhaustive[0].best.size() == 2);  // chunked.products and tile_products.prefetch_next

  // The device block records the gaps.
  DeviceInfo device;
  device.backend = "cpu";
  device.cpu = CpuDeviceInfo{};
  device.cpu->tuning = later;
  const nlohmann::json t = to_json(device)["tuning"];
  CHECK(t["source"] == "cached");
  REQUIRE(t["exhaustive"].is_array());
  CHECK(t["exhaustive"][0]["kernel"] == "chunked");
  CHECK(t["exhaustive"][0]["quick_over_best"].get<double>() == Approx(1.1));
  CHECK(t["exhaustive"][0]["best"]["chunked"]["products"] == "blas");
  CHECK(t["exhaustive_s"] == 42.0);

  // --retune: a calibration alone, whose plan replaces the search's.
  CHECK(cpu::decide_tuning(cpu::TuningMode::calibrate, kZen5, vec, path, fake.get(), search).source == "calibrated");
  CHECK_FALSE(read_json(path).contains("exhaustive"));
  CHECK(read_json(path)["choices"]["chunked"]["products"] == "packed");
  // A width with one candidate per choice has nothing to search.
  CHECK(cpu::decide_tuning(cpu::TuningMode::exhaustive, kZen5, Vec::generic, path, fake.get(), search).source ==
        "default");
  CHECK(searches == 1);
  std::filesystem::remove_all(dir);
}

// The search itself on short sequences (its times mean nothing here and nothing is asserted of
// them beyond their order): at each width this machine has, every group with more than one
// combination is searched, each with the number of combinations its candidates make, and the plan
// it returns is valid and the quick plan's where the group's best was the quick plan.
TEST_CASE("tuning: the exhaustive search times each group's combinations", "[tuning]") {
  for (Vec vec : cpu::available_vecs()) {
    const test::VecOverride forced(vec);
    INFO(cpu::to_string(vec));
    const Setting quick = cpu::tuning::defaults(vec);
    const cpu::ExhaustiveSearch found = cpu::search_tuning(vec, quick, 64, 32);
    CHECK(cpu::tuning::invalid(found.setting, vec).empty());
    CHECK(cpu::tuning::current(vec) == quick);  // restored
    auto count = [&](Knob k) { return int(cpu::tuning::candidates(k, vec).size()); };
    const int scan = count(Knob::scan_tokens_per_walk) * count(Knob::scan_column_block) * count(Knob::scan_prefetch_rows);
    // The packed products' constants matter on the packed path only: one OpenBLAS combination.
    const int gemm = count(Knob::gemm_micro_rows) * count(Knob::gemm_depth_block) * count(Knob::gemm_row_tiles);
    const int layer = count(Knob::layer_products) > 1 ? gemm + 1 : gemm;
    const int chunked = count(Knob::chunked_products) * count(Knob::tile_prefetch_next);
    std::map<std::string, int> expected;
    if (scan > 1) expected["scan"] = scan;
    if (layer > 1) expected["layer"] = layer;
    if (chunked > 1) expected["chunked"] = chunked;
    std::map<std::string, int> searched;
    for (const TuningInfo::PlanGap& g : found.groups) {
      INFO(g.kernel);
      searched[g.kernel] = g.combinations;
      CHECK(g.best_ms > 0.0);
      CHECK(g.best_ms <= g.quick_ms);
      for (const TuningInfo::Choice& c : g.best) CHECK(c.kernel != "");
    }
    CHECK(searched == expected);
  }
}

TEST_CASE("tuning: --tuning takes exhaustive, --help lists it, a bad value is named", "[tuning][cli][spawns]") {
  const CliOutcome parsed = parse_command_line({"lattnbench", "--tuning", "exhaustive"});
  REQUIRE(parsed.request);
  CHECK(parsed.request->tuning == "exhaustive");
  CHECK(cpu::tuning_mode_from("exhaustive") == cpu::TuningMode::exhaustive);
  const CliOutcome help = parse_command_line({"lattnbench", "--help"});
  CHECK_THAT(help.output, Catch::Contains("auto, shipped, default, calibrate, exhaustive"));
  for (const std::string& mode : cpu::tuning_mode_names())
    CHECK(parse_command_line({"lattnbench", "--tuning", mode}).request->tuning == mode);
  try {
    parse_command_line({"lattnbench", "--tuning", "exhaustiv"});
    FAIL("--tuning exhaustiv was taken");
  } catch (const UsageError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("--tuning") && Catch::Contains("'exhaustiv'") &&
                                          Catch::Contains("exhaustive"));
  }
  // Through the binary: exit 2 and one line.
  const test::ProcessResult r = test::run_process(test::binary() + " --tuning exhaustive,auto --list-cases");
  CHECK(r.exit_status == 2);
  CHECK_THAT(r.output, Catch::Contains("'exhaustive,auto'"));
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') <= 1);
}

// Through the binary: the first run on this CPU calibrates (unless the shipped table has it), the
// next reads the cache, --retune calibrates again; the device block says which each time.
TEST_CASE("tuning: --tuning, --retune and LATTN_TUNING through the binary", "[tuning][cli][spawns]") {
  const auto dir = test::fresh_dir("tuning-cli");
  // The tests run with LATTN_TUNING=default (tests/test_main.cpp): unset here, or set as a case says.
  auto with_env = [&](const std::string& env) {
    return "env -u LATTN_TUNING " + env + " XDG_CACHE_HOME=" + (dir / "cache").string() + " " + test::binary() +
           " --suite kernel --impl scan --mode fwd --seq 16 --dim 8 --batch 1 --heads 1 --reps 1"
           " --warmup 0 --threads 1 --quiet";
  };
  const std::string run = with_env("");
  const std::string out = (dir / "r.json").string();
  auto tuning_of = [&] { return read_json(out)["device"]["tuning"]; };
  const std::string signature = cpu_signature();
  const bool shipped = cpu::shipped_tuning(signature, cpu::active_vec()).has_value();
  const bool choices = cpu::active_vec() != Vec::generic;

  test::ProcessResult r = test::run_process(run + " --tuning default --out " + out);
  REQUIRE(r.exit_status == 0);
  CHECK(tuning_of()["source"] == "default");
  CHECK(tuning_of()["choices"]["scan"]["tokens_per_walk"] ==
        cpu::tuning::default_value(Knob::scan_tokens_per_walk, cpu::active_vec()));
  CHECK_FALSE(std::filesystem::exists(dir / "cache"));

  r = test::run_process(run + " --tuning auto --out " + out);
  REQUIRE(r.exit_status == 0);
  if (!choices || shipped) {
    CHECK(tuning_of()["source"] == (shipped ? "shipped" : "default"));
  } else {
    INFO(r.output);
    CHECK(tuning_of()["source"] == "calibrated");
    CHECK_THAT(r.output, Catch::Contains("tuned the CPU kernels"));
    // Its time is recorded (the 5 s target is a benchmark figure, docs/performance.md, never a
    // test's assertion: a loaded or sanitized build takes longer).
    CHECK(tuning_of()["calibration_s"].get<double>() > 0.0);
    const std::string cache = tuning_of()["cache"];
    CHECK(std::filesystem::exists(cache));

    r = test::run_process(run + " --out " + out);  // auto, the default
    REQUIRE(r.exit_status == 0);
    CHECK(tuning_of()["source"] == "cached");
    CHECK_THAT(r.output, !Catch::Contains("tuned the CPU kernels"));

    // A malformed cache: one warning line, a calibration, exit 0.
    write_text(cache, "{oops");
    r = test::run_process(run + " --out " + out);
    INFO(r.output);
    CHECK(r.exit_status == 0);
    CHECK_THAT(r.output,
               Catch::Contains("lattnbench: warning: tuning cache " + cache + " is not JSON: calibrated again"));
    CHECK(tuning_of()["source"] == "calibrated");
  }
  r = test::run_process(run + " --retune --out " + out);
  REQUIRE(r.exit_status == 0);
  CHECK(tuning_of()["source"] == (choices ? "calibrated" : "default"));
  r = test::run_process(with_env("LATTN_TUNING=shipped") + " --out " + out);
  REQUIRE(r.exit_status == 0);
  CHECK(tuning_of()["source"] == (shipped ? "shipped" : "default"));

  // Bad input: one line, exit 2.
  r = test::run_process(run + " --tuning fastest --out " + out);
  CHECK(r.exit_status == 2);
  CHECK_THAT(r.output, Catch::Contains("--tuning") && Catch::Contains("'fastest'"));
  r = test::run_process(with_env("LATTN_TUNING=fastest") + " --out " + out);
  CHECK(r.exit_status == 2);
  CHECK_THAT(r.output, Catch::Contains("LATTN_TUNING") && Catch::Contains("'fastest'"));
  r = test::run_process(run + " --retune --tuning default --out " + out);
  CHECK(r.exit_status == 2);
  CHECK_THAT(r.output, Catch::Contains("--retune") && Catch::Contains("contradicts --tuning default"));
  std::filesystem::remove_all(dir);
}

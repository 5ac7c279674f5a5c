// The real executable's plan-side flags: --help's defaults, --filter and --list-cases, an installed
// config by name, the ETA's start, and the sampling flags' records (noise_pct, stopped_on).
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "process_util.hpp"
#include "src/config/config.hpp"

using namespace lattn;
using namespace lattn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

ProcessResult lattnbench(const std::string& args) { return run_process(binary() + " " + args); }

// Eight small cases; every use adds its own --reps.
const std::string kSmall = "--suite kernel --seq 16,24 --dim 4 --chunk 8 --batch 1 --heads 1 --warmup 1 "
                           "--min-sample-ms 0.5 --threads 1";

// The small cases with `args` in a fresh folder of `name`, writing `out`; it must exit 0.
struct SmallRun {
  fs::path dir, out;
  ProcessResult result;
};
SmallRun run_small(const std::string& name, const std::string& args) {
  SmallRun run;
  run.dir = fresh_dir(name);
  run.out = run.dir / "r.json";
  run.result = lattnbench(kSmall + " " + args + " --out " + run.out.string());
  INFO(run.result.output);
  REQUIRE(run.result.exit_status == 0);
  return run;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("the help shows every config key's flag with its default, and the new flags", "[cli][help][spawns]") {
  const auto help = lattnbench("--help");
  REQUIRE(help.exit_status == 0);
  for (const ConfigKey& key : config_keys()) {
    INFO(key.flag);
    CHECK_THAT(help.output, Contains(key.flag));
  }
  for (const char* flag : {"--filter", "--list-cases", "--min-samples", "--max-noise", "--timeout", "--interleave",
                           "--no-interleave", "--slowdown"})
    CHECK_THAT(help.output, Contains(flag));
  CHECK_THAT(help.output, Contains("[default: 10]") && Contains("[default: 25]") && Contains("--format NAME") &&
                              Contains("[default: table]"));
  // Where the suites differ, each one's default.
  CHECK_THAT(help.output, Contains("kernel 512,2048,8192; layer 512,2048"));
}

TEST_CASE("listing the cases shows the plan after --filter and --shard, with estimates, and runs nothing", "[cli][plan][spawns]") {
  const fs::path dir = fresh_dir("list-cases");
  const auto all = lattnbench(kSmall + " --reps 3 --list-cases --out " + (dir / "r.json").string());
  INFO(all.output);
  REQUIRE(all.exit_status == 0);
  // Each row names the variant of the form's table that would run it (cpu/variants.cpp).
  const std::regex row(
      R"(^\d{3}-kernel-(scan|chunked)-(fwd|fwd_bwd)-b1h1t(16|24)d4c8-none +[0-9.]+ s +[0-9.e+-]+ GFLOP  variant (scan_columns|chunked_tiled|chunked_blas)$)");
  std::size_t rows = 0;
  for (const std::string& line : lines_of(all.output)) rows += std::regex_match(line, row);
  CHECK(rows == 8);
  CHECK_THAT(all.output, Contains("8 cases") && Contains("estimated total"));
  CHECK(fs::is_empty(dir));

  const auto filtered = lattnbench(kSmall + " --reps 3 --list-cases --filter 'scan-fwd-' --shard 1/2");
  INFO(filtered.output);
  REQUIRE(filtered.exit_status == 0);
  std::size_t kept = 0;
  for (const std::string& line : lines_of(filtered.output)) {
    if (!std::regex_match(line, row)) continue;
    ++kept;
    CHECK_THAT(line, Contains("-scan-fwd-"));
  }
  CHECK(kept == 1);  // two scan fwd cases, one per shard
  CHECK_THAT(filtered.output, Contains("6 not planned (--filter scan-fwd-)") && Contains("shard 1/2"));
}

TEST_CASE("a filtered run runs the matching cases only and the summary line says how many were not planned", "[cli][plan][spawns]") {
  const auto [dir, out, result] = run_small("filter", "--reps 3 --filter 'chunked-fwd-.*t24'");
  CHECK_THAT(result.output, Contains("7 not planned (--filter chunked-fwd-.*t24)"));
  const auto doc = read_json(out);
  REQUIRE(doc["results"].size() == 1);
  CHECK(doc["results"][0]["impl"] == "chunked");
  CHECK(doc["results"][0]["seq"] == 24);
  // The record names the variant of the chunked table that ran it.
  const std::string variant = doc["results"][0].value("variant", "");
  CHECK((variant == "chunked_tiled" || variant == "chunked_blas"));
  CHECK(doc["totals"]["not_planned"] == 7);
  CHECK(doc["filter"] == "chunked-fwd-.*t24");
  // The progress line names the case as --filter and --dump do.
  CHECK_THAT(result.output, Contains("[1/1] 005-kernel-chunked-fwd-b1h1t24d4c8-none: median"));

  const auto bad = lattnbench(kSmall + " --reps 3 --filter '(' --out " + out.string());
  CHECK(bad.exit_status == 2);
  CHECK_THAT(bad.output, Contains("lattnbench: error: --filter: not a regular expression"));
  CHECK_FALSE(fs::exists(journal_of(out)));  // refused before the run opened anything
  const auto long_filter = lattnbench(kSmall + " --reps 3 --filter " + std::string(300, 'a') + " --out " + out.string());
  CHECK(long_filter.exit_status == 2);
  CHECK_THAT(long_filter.output, Contains("lattnbench: error: --filter: longer than 256 characters"));
  fs::remove_all(dir);
}

TEST_CASE("records carry the noise they reached and why they stopped, and the ETA starts from the cost model", "[cli][noise][spawns]") {
  const auto [dir, out, result] = run_small("noise-records", "--reps 6 --min-samples 3 --max-noise 0");
  INFO(result.output);
  // Before any case has finished, the run says what it expects from the cost model.
  const auto estimate = result.output.find("cases, estimated ");
  REQUIRE(estimate != std::string::npos);
  CHECK(estimate < result.output.find("[1/8]"));
  const auto doc = read_json(out);  // held: a range-for over a temporary's member would dangle
  for (const auto& r : doc["results"]) {
    CHECK(r["stopped_on"] == "samples");
    CHECK(r["samples_ms"].size() == 6);
    CHECK(r["reps"] == 6);
    CHECK(r["noise_pct"].get<double>() >= 0);
  }
  const auto& config = doc["config"];
  CHECK(config["min_samples"] == 3);
  CHECK(config["max_noise"] == 0);
  CHECK(config["interleave"] == true);
  for (const char* bad : {"--max-noise -1", "--max-noise 101", "--min-samples 0", "--timeout -2", "--slowdown -5"}) {
    INFO(bad);
    const auto refused = lattnbench(kSmall + " --reps 3 " + bad + " --out " + out.string());
    CHECK(refused.exit_status == 2);
  }
  fs::remove_all(dir);
}

TEST_CASE("a config is found by its installed name, with or without its extension", "[cli][install][spawns]") {
  for (const char* name : {"smoke", "smoke.yaml"}) {
    INFO(name);
    const auto listed = lattnbench(std::string("--config ") + name + " --list-cases");
    REQUIRE(listed.exit_status == 0);
    CHECK_THAT(listed.output, Contains("-kernel-scan-fwd-b1h2t24d16c32-none"));
  }
  // The model layers under configs/models/ by their names too.
  for (const auto& [name, slug] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3-next", "-layer-chunked-fwd-b1h4t2048d128c64w128-scalar-attentionnone-gatesprojected"},
           {"kimi-linear", "-layer-chunked-fwd-b1h4t2048d128c64w128-vector-attentionnone-gate_rank128"},
           {"mamba2", "-layer-chunked-fwd-b1h8t2048d64c64w128-scalar-attentionnone-gatesprojected"},
           {"rwkv7", "-decode-step-fwd-b64h32t4d64-vector-ruledplr"},
           {"rwkv7", "-layer-chunked-fwd_bwd-b1h8t8192d64c16w128-vector-decay_rank96-iclr_rank96-out_gate_rank256-ruledplr"},
           {"mamba3", "-kernel-chunked-fwd_bwd-b1h8t2048d128c64-scalar-dim_v64-heads_k1-mimo_rank4-ruletrapezoidal"},
           {"mamba3", "-layer-chunked-fwd_bwd-b1h8t8192d64c64w128-scalar-attentionnone-gatesprojected-ruletrapezoidal"}}) {
    INFO(name);
    const auto listed = lattnbench("--config " + name + " --list-cases");
    REQUIRE(listed.exit_status == 0);
    CHECK_THAT(listed.output, Contains(slug));
  }
  const auto missing = lattnbench("--config no-such-suite --list-cases");
  CHECK(missing.exit_status == 2);
  CHECK_THAT(missing.output, Contains("no-such-suite"));
}

TEST_CASE("the interleave flags set the config's interleave", "[cli][interleave][spawns]") {
  const fs::path dir = fresh_dir("interleave-flag");
  const fs::path out = dir / "r.json";
  for (const auto& [flag, expected] : std::vector<std::pair<std::string, bool>>{{"--no-interleave", false}, {"--interleave", true}}) {
    INFO(flag);
    const auto result = lattnbench(kSmall + " --reps 3 --quiet " + flag + " --out " + out.string());
    REQUIRE(result.exit_status == 0);
    CHECK(read_json(out)["config"]["interleave"] == expected);
  }
  fs::remove_all(dir);
}

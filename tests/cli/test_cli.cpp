// The real executable: exit statuses and one-line errors for bad input, --list, --version.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>

#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("lattn-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

test::ProcessResult lattnbench(const std::string& args) { return test::run_process(test::binary() + " " + args); }

std::size_t lines(const std::string& s) { return std::size_t(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("help and version and list answer and exit 0", "[cli][spawns]") {
  auto help = lattnbench("--help");
  CHECK(help.exit_status == 0);
  CHECK_THAT(help.output, Contains("--seq") && Contains("--min-sample-ms") && Contains("--config"));
  auto version = lattnbench("--version");
  CHECK(version.exit_status == 0);
  CHECK_THAT(version.output, Contains("lattnbench 0."));
  auto list = lattnbench("--list");
  CHECK(list.exit_status == 0);
  CHECK_THAT(list.output, Contains("scan, chunked") && Contains("fwd, fwd_bwd") && Contains("cpu   available"));
  // Each heading the plural of its option's key, spelt once ("gates:", not "gatess:"), the values in
  // one column after the headings that fit it.
  const std::string lines = "\n" + list.output;
  CHECK_THAT(lines, Contains("\nrules:") && Contains("\ngates:") && !Contains("ss:"));
  const auto value_column = [&](const std::string& heading) {
    const std::size_t at = lines.find("\n" + heading + ":");
    return at == std::string::npos ? std::string::npos : lines.find_first_not_of(' ', at + heading.size() + 2) - at;
  };
  CHECK(value_column("suites") == value_column("gates"));
  CHECK(value_column("suites") == value_column("rules"));
  if (test::cuda_usable())
    CHECK_THAT(list.output, Contains("cuda  available"));
  else
    CHECK_THAT(list.output, Contains("cuda  unavailable: no CUDA device: "));
}

TEST_CASE("bad input exits 2 with one line naming where", "[cli][errors][spawns]") {
  struct Bad {
    std::string args;
    std::string expected;
  };
  const fs::path unknown_key = write_temp("unknown.yaml", "kernel:\n  seq: [64]\n  sequence: 3\n");
  const fs::path bad_json = write_temp("bad.json", "{\"kernel\": {\"seq\": [64,,]}}");
  const fs::path bad_gate = write_temp("gate.yaml", "kernel:\n  decay: [scalar]\n  gate_norm: [1, 0]\n");
  std::vector<Bad> cases = {
      {"--config " + unknown_key.string(), unknown_key.string() + ":3: unknown key 'kernel.sequence'"},
      {"--config " + bad_json.string(), bad_json.string() + ":1: JSON syntax error"},
      {"--config /nonexistent/suite.yaml", "/nonexistent/suite.yaml: cannot read the config file"},
      {"--seq 0", "--seq: expected an integer in 1..16777216, got 0"},
      {"--impl fused", "--impl: unknown impl 'fused'"},
      {"--suite attention", "--suite: unknown suite 'attention'"},
      {"--window 0", "--window: expected an integer in 1..16777216, got 0"},
      {"--suite layer --heads 256 --head-dim 64", "over the limit 8192"},
      {"--suite kernel --head-dim 32", "--head-dim: only the layer suite has this key"},
      {"--backend tpu", "--backend: unknown backend 'tpu'"},
      {"--suite kernel --decay scalar --gate-norm 0", "--gate-norm: expected a number in (0, 1000000], got 0"},
      {"--suite kernel --decay vector --gate-norm -2", "--gate-norm: expected a number in (0, 1000000], got -2"},
      {"--gate-norm nan", "--gate-norm: expected a number, got 'nan'"},
      {"--gate-norm strong", "--gate-norm: expected a number, got 'strong'"},
      {"--config " + bad_gate.string(), bad_gate.string() + ":3: kernel.gate_norm: expected a number in (0, 1000000], got 0"},
      {"--suite layer --gate-norm 1", "--gate-norm: only the kernel suite has this key"},
      {"--decay bogus", "--decay: unknown decay 'bogus' (expected one of: none, retnet, scalar, vector)"},
      // The layer block's parts in a combination the block does not define.
      {"--suite layer --attention none", "attention none leaves the gate nothing to blend: it needs output_gate norm"},
      {"--suite layer --decay vector --gates projected --attention none --output-gate norm",
       "gates projected with rule additive is Mamba2: it needs decay scalar"},
      {"--suite layer --rule dplr --decay scalar",
       "rule dplr in the layer suite is RWKV-7's time mixing, whose decay is per channel: it needs decay vector, not scalar"},
      {"--decay linear", "--decay: unknown decay 'linear'"},  // no suite has it
      {"--batch-memory 0", "--batch-memory: expected a number in (0, 1], got 0"},
      {"--frobnicate", "command line:"},
  };
  if (!test::cuda_usable()) cases.push_back({"--backend cuda --seq 16 --dim 4", "--backend cuda: no CUDA device: "});
  for (const Bad& bad : cases) {
    INFO(bad.args);
    const auto result = lattnbench(bad.args + " --quiet --out " + (fs::temp_directory_path() / "never.json").string());
    CHECK(result.exit_status == 2);
    CHECK_THAT(result.output, Contains("lattnbench: error: ") && Contains(bad.expected));
    CHECK(lines(result.output) == 1);
  }
  CHECK_FALSE(fs::exists(fs::temp_directory_path() / "never.json"));
}

TEST_CASE("a run with flags only writes its file and exits 0", "[cli][spawns]") {
  const fs::path out = write_temp("placeholder", "").parent_path() / "flags.json";
  const auto result = lattnbench("--suite kernel --seq 33 --dim 8 --chunk 16 --batch 1 --heads 2 --reps 2 --warmup 1 "
                                 "--min-sample-ms 1 --threads 1 --out " + out.string());
  INFO(result.output);
  CHECK(result.exit_status == 0);
  CHECK(fs::exists(out));
  CHECK_THAT(result.output, Contains("[4/4]") && Contains("ETA"));
}

// LATTN_AMX: the AMX rows on the emulated tiles (checked) or on the counted ones (timed, not
// checked, with the counts of one call), on any CPU; a bad value is exit 2 before anything runs.
TEST_CASE("LATTN_AMX runs the bf16 AMX rows on emulated or counted tiles", "[cli][amx][spawns]") {
  const fs::path dir = write_temp("placeholder", "").parent_path();
  // The delta rule, decay none, T 64 over chunks of 32, D 32: seven products of 2 x 2 x 1 tiles a
  // chunk (chunked_amx_delta.cpp: the two scores, E, W, Q S, A_qk W and the state), two chunks.
  const std::string args = "--suite kernel --impl chunked --mode fwd --dtype bf16 --rule delta --decay none --seq 64 "
                           "--dim 32 --chunk 32 --batch 1 --heads 1 --reps 2 --warmup 1 --min-sample-ms 1 --threads 1 "
                           "--quiet --out ";
  const auto read = [](const fs::path& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const fs::path counted_out = dir / "amx-counted.json";
  const auto counted = test::run_process("LATTN_AMX=counted " + test::binary() + " " + args + counted_out.string());
  INFO(counted.output);
  REQUIRE(counted.exit_status == 0);
  const nlohmann::json doc = read(counted_out);
  REQUIRE(doc["results"].size() == 1);
  const nlohmann::json& r = doc["results"][0];
  CHECK(r["status"] == "unchecked");
  CHECK_THAT(r["unchecked_reason"].get<std::string>(), Contains("counted"));
  CHECK_FALSE(r.contains("rel_err"));
  CHECK(r["variant"] == "chunked_amx_delta");
  CHECK(r["amx_tiles"] == "counted");
  CHECK(r["tile_counts"]["tdpbf16ps"] == 2 * 7 * 4);
  CHECK(r["tile_counts"]["tilestored_bytes"] == r["tile_counts"]["tilestored"].get<long>() * 1024);
  CHECK(r["tile_model_ms"].get<double>() > 0);
  CHECK(r["tile_rate_gflops"].get<double>() > 0);
  CHECK_FALSE(r["tile_rate_source"].get<std::string>().empty());
  CHECK_FALSE(r.contains("peak_fraction"));
  CHECK(doc["totals"]["unchecked"] == 1);
  CHECK(doc["totals"]["ok"] == 0);
  REQUIRE(doc["summary"]["not_compared"].size() == 1);
  CHECK(doc["summary"]["not_compared"][0]["status"] == "unchecked");

  const fs::path emulated_out = dir / "amx-emulated.json";
  const auto emulated = test::run_process("LATTN_AMX=emulated " + test::binary() + " " + args + emulated_out.string());
  INFO(emulated.output);
  REQUIRE(emulated.exit_status == 0);
  const nlohmann::json emulated_doc = read(emulated_out);
  const nlohmann::json& e = emulated_doc["results"][0];
  CHECK(e["status"] == "ok");
  CHECK(e["amx_tiles"] == "emulated");
  CHECK(e["rel_err"].get<double>() < 3e-2);
  CHECK_FALSE(e.contains("tile_counts"));

  const auto bad = test::run_process("LATTN_AMX=fast " + test::binary() + " " + args + (dir / "never.json").string());
  CHECK(bad.exit_status == 2);
  CHECK_THAT(bad.output, Contains("lattnbench: error: LATTN_AMX: expected one of") && Contains("'fast'"));
  CHECK(lines(bad.output) == 1);
  CHECK_FALSE(fs::exists(dir / "never.json"));
}

TEST_CASE("the layer suite runs from flags and writes its records", "[cli][layer][spawns]") {
  const fs::path out = write_temp("placeholder", "").parent_path() / "layer.json";
  const auto result = lattnbench("--suite layer --seq 40 --batch 1 --heads 2 --head-dim 8 --window 5 --chunk 16 "
                                 "--reps 2 --warmup 1 --min-sample-ms 1 --threads 1 --out " + out.string());
  INFO(result.output);
  CHECK(result.exit_status == 0);
  // Each case's progress line names it as --filter and --dump do; the cases of a batch finish in
  // the order their last samples are taken.
  CHECK_THAT(result.output, Contains("[4/4] ") && Contains("] 003-layer-chunked-fwd_bwd-b1h2t40d8c16w5-none: median"));
}

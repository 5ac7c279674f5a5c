// Config: YAML and JSON reach the same plan; every class of bad input has its own clear message.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "src/config/config.hpp"
#include "src/config/plan.hpp"
#include "src/results/record_json.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::string plan_signature(const Config& c) {
  std::string out;
  for (const Case& k : expand_plan(c))
    out += test::describe(k) + "/" + k.backend + ";";
  return out;
}

std::string error_of(const std::string& text, const std::string& name = "suite.yaml") {
  return test::config_error(text, name);
}

}  // namespace

TEST_CASE("YAML and JSON versions of one suite load to the same plan", "[config]") {
  const Config yaml = parse_config(R"(
suites: [kernel]
reps: 4
kernel:
  batch: 1
  heads: [2, 3]
  seq: [16, 40]
  dim: 8
  chunk: 16
  impl: [scan, chunked]
  mode: fwd_bwd
  decay: [none, retnet]
)", "a.yaml");
  const Config json = parse_config(R"({
	"suites": ["kernel"],
	"reps": 4,
	"kernel": {"batch": 1, "heads": [2, 3], "seq": [16, 40], "dim": 8, "chunk": 16,
	           "impl": ["scan", "chunked"], "mode": "fwd_bwd", "decay": ["none", "retnet"]}
})", "a.json");
  CHECK(plan_signature(yaml) == plan_signature(json));
  CHECK(expand_plan(yaml).size() == 2 * 2 * 2 * 2);
  CHECK(yaml.run.reps == 4);
  CHECK(json.run.reps == 4);
}

TEST_CASE("the embedded default is configs/default.yaml and the reference results' suite", "[config]") {
  std::ifstream in(test::source_dir() + "/configs/default.yaml");
  std::stringstream text;
  text << in.rdbuf();
  const Config from_file = parse_config(text.str(), "default.yaml");
  const Config embedded = embedded_default_config();
  CHECK(plan_signature(from_file) == plan_signature(embedded));
  CHECK(plan_signature(embedded) == plan_signature(Config{}));
  const auto plan = expand_plan(embedded);
  CHECK(plan.size() == 44);  // kernel: 3 seq x 3 dim x 2 impl x 2 mode; layer: 2 seq x 2 impl x 2 mode
  CHECK(plan.front().op->suite == "kernel");
  CHECK(plan.front().batch == 2);
  CHECK(plan.front().heads == 4);
  CHECK(plan.front().chunk == 128);
  CHECK(plan.front().window == 0);
  const Case& layer = plan[36];
  CHECK(layer.op->suite == "layer");
  CHECK(layer.batch == 2);
  CHECK(layer.heads == 8);
  CHECK(layer.dim == 64);
  CHECK(layer.window == 128);
  CHECK(layer.seq == 512);
  CHECK(plan.back().seq == 2048);
}

TEST_CASE("the layer plan follows the reference file's order: seq, then impl, then mode", "[config]") {
  const Config c = parse_config("suites: [layer]\nlayer:\n  seq: [64, 128]\n  window: [8, 16]\n  head_dim: 16\n", "l.yaml");
  const auto plan = expand_plan(c);
  REQUIRE(plan.size() == 2 * 2 * 2 * 2);
  CHECK(plan[0].window == 8);
  CHECK(plan[0].impl == "scan");
  CHECK(plan[0].mode == Mode::fwd);
  CHECK(plan[1].mode == Mode::fwd_bwd);
  CHECK(plan[2].impl == "chunked");
  CHECK(plan[4].seq == 128);
  CHECK(plan[8].window == 16);
  for (const Case& k : plan) CHECK(k.op->suite == "layer");
}

TEST_CASE("bwd_states is a config key with a flag: kept or recomputed, one value", "[config]") {
  CHECK(embedded_default_config().run.bwd_states == "kept");
  Config c = parse_config("bwd_states: recomputed\n", "suite.yaml");
  CHECK(c.run.bwd_states == "recomputed");
  CHECK(to_json(c).at("bwd_states") == "recomputed");
  Overrides o;
  o.values["bwd_states"] = "kept";
  apply_overrides(c, o);
  CHECK(c.run.bwd_states == "kept");
  CHECK_THROWS_WITH(parse_config("bwd_states: stored\n", "s.yaml"),
                    Catch::Matchers::Contains("s.yaml:1: bwd_states") &&
                        Catch::Matchers::Contains("expected one of: kept, recomputed"));
  CHECK_THROWS_WITH(parse_config("bwd_states: [kept, recomputed]\n", "s.yaml"),
                    Catch::Matchers::Contains("expected a single value"));
  o.values["bwd_states"] = "none";
  CHECK_THROWS_WITH(apply_overrides(c, o), Catch::Matchers::Contains("--bwd-states"));
}

TEST_CASE("the command line beats the file, which beats the defaults", "[config]") {
  Config c = parse_config("reps: 7\nkernel:\n  seq: [64]\n  dim: 16\n", "x.yaml");
  CHECK(c.run.reps == 7);
  CHECK(c.run.warmup == Config{}.run.warmup);
  Overrides o;
  o.values["seq"] = "32,48";
  o.values["reps"] = "3";
  o.values["impl"] = "chunked";
  apply_overrides(c, o);
  CHECK(c.suite("kernel").numbers("seq") == std::vector<long>{32, 48});
  CHECK(c.run.reps == 3);
  CHECK(c.suite("kernel").names("impl") == std::vector<std::string>{"chunked"});
  CHECK(c.suite("kernel").numbers("dim") == std::vector<long>{16});
  // --seq reaches every selected suite that has the key, --window only the layer
  CHECK(c.suite("layer").numbers("seq") == std::vector<long>{32, 48});
  Overrides w;
  w.values["window"] = "4,8";
  w.values["head_dim"] = "32";
  apply_overrides(c, w);
  CHECK(c.suite("layer").numbers("window") == std::vector<long>{4, 8});
  CHECK(c.suite("layer").numbers("head_dim") == std::vector<long>{32});
  CHECK(c.suite("kernel").numbers("dim") == std::vector<long>{16});
}

TEST_CASE("each class of malformed config has its own message naming where", "[config][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of("kernel: [1, 2\n"), Contains("suite.yaml:") && Contains("YAML syntax error"));
  CHECK_THAT(error_of("{\"kernel\": {\"seq\": [1,]}}", "s.json"), Contains("s.json:1") && Contains("JSON syntax error"));
  CHECK_THAT(error_of("reps: 3\nfrobnicate: 1\n"), Contains("suite.yaml:2") && Contains("unknown key 'frobnicate'"));
  CHECK_THAT(error_of("kernel:\n  seqs: [1]\n"), Contains("suite.yaml:2") && Contains("unknown key 'kernel.seqs'"));
  CHECK_THAT(error_of("kernel:\n  seq: abc\n"), Contains("suite.yaml:2: kernel.seq") && Contains("expected an integer"));
  CHECK_THAT(error_of("{\"kernel\": {\"seq\": \"512\"}}", "s.json"), Contains("kernel.seq") && Contains("the string '512'"));
  CHECK_THAT(error_of("kernel:\n  dim: 0\n"), Contains("suite.yaml:2: kernel.dim") && Contains("got 0"));
  CHECK_THAT(error_of("kernel:\n  batch: -3\n"), Contains("kernel.batch") && Contains("got -3"));
  CHECK_THAT(error_of("kernel:\n  seq: 1000000000000\n"), Contains("kernel.seq") && Contains("expected an integer in 1..16777216"));
  CHECK_THAT(error_of("suites: [kernel, attention]\n"), Contains("suite.yaml:1") && Contains("unknown suite 'attention'"));
  CHECK(error_of("suites: layer\n").empty());
  CHECK_THAT(error_of("suites: [layer, attention]\n"), Contains("unknown suite 'attention'"));
  CHECK_THAT(error_of("layer:\n  dim: 64\n"), Contains("suite.yaml:2") && Contains("unknown key 'layer.dim'") &&
                                                 Contains("head_dim"));
  CHECK_THAT(error_of("layer:\n  window: 0\n"), Contains("suite.yaml:2: layer.window") && Contains("got 0"));
  CHECK_THAT(error_of("layer:\n  window: -4\n"), Contains("layer.window") && Contains("got -4"));
  CHECK_THAT(error_of("layer:\n  head_dim: 0\n"), Contains("layer.head_dim") && Contains("got 0"));
  CHECK_THAT(error_of("layer:\n  heads: 64\n  head_dim: 256\n"),
             Contains("heads 64 x head_dim 256") && Contains("16384") && Contains("over the limit 8192"));
  CHECK_THAT(error_of("layer:\n  batch: 4096\n  seq: 1048576\n"), Contains("layer case") && Contains("2^31"));
  CHECK_THAT(error_of("layer: [1]\n"), Contains("layer") && Contains("expected a mapping"));
  CHECK_THAT(error_of("layer:\n  impl: fused\n"), Contains("unknown impl 'fused'"));
  CHECK_THAT(error_of("kernel:\n  impl: [scan, fused]\n"), Contains("unknown impl 'fused'"));
  CHECK_THAT(error_of("kernel:\n  mode: backward\n"), Contains("unknown mode 'backward'"));
  CHECK_THAT(error_of("backend: tpu\n"), Contains("unknown backend 'tpu'"));
  CHECK_THAT(error_of("kernel:\n  decay: [none, none]\n"), Contains("duplicate value 'none'"));
  CHECK_THAT(error_of("reps: [1, 2]\n"), Contains("reps") && Contains("expected a single value"));
  CHECK_THAT(error_of("kernel:\n  seq: []\n"), Contains("empty list"));
  CHECK_THAT(error_of("kernel: 3\n"), Contains("kernel") && Contains("expected a mapping"));
  CHECK_THAT(error_of(""), Contains("empty"));
  CHECK_THAT(error_of("- 1\n- 2\n"), Contains("expected a mapping at the top level"));
  CHECK_THAT(error_of("kernel:\n  batch: 4096\n  heads: 4096\n  seq: 16777216\n  dim: 1024\n"), Contains("2^31"));
  std::string many = "layer:\n  seq: [";
  for (int s = 1; s <= 400; ++s) many += std::to_string(s) + (s < 400 ? ", " : "]\n  window: [");
  for (int w = 1; w <= 400; ++w) many += std::to_string(w) + (w < 400 ? ", " : "]\n");
  CHECK_THAT(error_of(many), Contains("cases; at most 100000"));
}

TEST_CASE("bad command-line values name the flag", "[config][errors]") {
  using Catch::Matchers::Contains;
  using test::override_error;
  CHECK_THAT(override_error("seq", "512,abc"), Contains("--seq") && Contains("'abc'"));
  CHECK_THAT(override_error("min_sample_ms", "0"), Contains("--min-sample-ms"));
  CHECK_THAT(override_error("threads", "2,3"), Contains("--threads") && Contains("single value"));
  CHECK(override_error("suites", "layer").empty());
  CHECK_THAT(override_error("suites", "attention"), Contains("--suite") && Contains("unknown suite 'attention'"));
  CHECK_THAT(override_error("window", "0"), Contains("--window") && Contains("got 0"));
  CHECK_THAT(override_error("head_dim", "2000"), Contains("--head-dim") && Contains("1..1024"));
  CHECK_THAT(override_error("heads", "1024"), Contains("heads 1024 x head_dim 64") && Contains("over the limit"));
  auto kernel_only = [](const std::string& key, const std::string& value) {
    Config c;
    Overrides o;
    o.values["suites"] = "kernel";
    o.values[key] = value;
    try {
      apply_overrides(c, o);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(kernel_only("window", "64"), Contains("--window") && Contains("only the layer suite"));
  CHECK(kernel_only("seq", "64").empty());
  CHECK_THAT(override_error("seq", ""), Contains("--seq"));
}

// gate_norm is the first op-specific key (Param::option): a real that applies to gated decays only.
TEST_CASE("gate_norm: parsed as a real, planned and recorded only for the gated decays", "[config][gated]") {
  const Config c = parse_config(R"(
suites: [kernel]
kernel:
  batch: 1
  heads: 2
  dim: 8
  seq: 16
  impl: scan
  mode: fwd
  decay: [none, scalar, retnet, vector]
  gate_norm: [16, 0.25, 1e0]
)", "g.yaml");
  CHECK(c.suite("kernel").names("gate_norm") == std::vector<std::string>{"16", "0.25", "1"});
  const auto plan = expand_plan(c);
  // none and retnet once each, without the key; scalar and vector once per gate_norm.
  REQUIRE(plan.size() == 1 + 3 + 1 + 3);
  CHECK(plan[0].decay == "none");
  // rule always applies; the shape keys too, at their defaults (square, dense), and cache (warm);
  // householder and bonus at their defaults (their other values are refused where they do not apply)
  const std::map<std::string, std::string> additive_only = {
      {"rule", "additive"}, {"heads_k", "0"}, {"dim_v", "0"},       {"lengths", ""},
      {"varlen", ""},       {"cache", "warm"}, {"householder", "1"}, {"bonus", "false"}};
  CHECK(plan[0].options == additive_only);
  CHECK(plan[1].decay == "scalar");
  CHECK(plan[1].option("gate_norm") == "16");
  CHECK(plan[2].option("gate_norm") == "0.25");
  CHECK(plan[3].option("gate_norm") == "1");
  CHECK(plan[4].decay == "retnet");
  CHECK(plan[4].options == additive_only);
  CHECK(plan[7].decay == "vector");
  CHECK(plan[7].option("gate_norm") == "1");

  // Records: a number in gated cases' identity, absent from the others'.
  CHECK(identity_json(plan[2]).at("gate_norm") == 0.25);
  CHECK_FALSE(identity_json(plan[0]).contains("gate_norm"));
  CHECK_FALSE(identity_json(plan[4]).contains("gate_norm"));
  CHECK(identity_json(plan[1]) != identity_json(plan[3]));
  CHECK(to_json(c).at("kernel").at("gate_norm") == nlohmann::json::array({16.0, 0.25, 1.0}));

  // The inputs follow it: g = logsigmoid(z) / gate_norm, the same z for every gate_norm.
  const TensorSet g16 = make_case_inputs(plan[1], 0), g1 = make_case_inputs(plan[3], 0);
  const auto &weak = g16.at("g").data, &strong = g1.at("g").data;
  REQUIRE(weak.size() == std::size_t(1 * 2 * 16));
  for (std::size_t i = 0; i < weak.size(); ++i) {
    CHECK(strong[i] <= 0.0f);
    CHECK(weak[i] == Approx(strong[i] / 16).epsilon(1e-6));
  }
  CHECK_FALSE(make_case_inputs(plan[0], 0).find("g"));
  CHECK(make_case_inputs(plan[7], 0).at("g").shape == std::vector<std::size_t>{1, 2, 16, 8});
}

TEST_CASE("gate_norm defaults to 16, takes the command line, and its bad values name where", "[config][gated][errors]") {
  using Catch::Matchers::Contains;
  Config c = parse_config("kernel:\n  decay: scalar\n", "d.yaml");
  CHECK(c.suite("kernel").names("gate_norm") == std::vector<std::string>{"16"});
  for (const Case& k : expand_plan(c))
    if (k.op->suite == "kernel") CHECK(k.option("gate_norm") == "16");
  Overrides o;
  o.values["gate_norm"] = "0.25,4";
  apply_overrides(c, o);
  CHECK(c.suite("kernel").names("gate_norm") == std::vector<std::string>{"0.25", "4"});

  CHECK_THAT(error_of("kernel:\n  decay: vector\n  gate_norm: 0\n"),
             Contains("suite.yaml:3: kernel.gate_norm") && Contains("expected a number in (0, 1000000], got 0"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: -1\n"), Contains("suite.yaml:2: kernel.gate_norm") && Contains("got -1"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: .nan\n"), Contains("kernel.gate_norm") && Contains("expected a number, got '.nan'"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: nan\n"), Contains("kernel.gate_norm") && Contains("expected a number"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: .inf\n"), Contains("kernel.gate_norm") && Contains("expected a number"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: strong\n"), Contains("expected a number, got 'strong'"));
  CHECK_THAT(error_of("{\"kernel\": {\"gate_norm\": \"16\"}}", "s.json"), Contains("s.json:1: kernel.gate_norm"));
  CHECK_THAT(error_of("kernel:\n  gate_norm: [1, 2e6]\n"), Contains("got 2e6"));
  // One value written two ways is one case, given twice.
  CHECK_THAT(error_of("kernel:\n  gate_norm: [16, 16.0]\n"), Contains("suite.yaml:2: kernel.gate_norm") &&
                                                                  Contains("duplicate value '16.0'"));
  // The layer's linear branch takes the gated decays (its input gates at gate_norm 16, or gates
  // projected from x: docs/spec.md section 2b), but not the key.
  CHECK_THAT(error_of("layer:\n  gate_norm: 1\n"), Contains("unknown key 'layer.gate_norm'"));
  CHECK(error_of("layer:\n  decay: scalar\n").empty());
  CHECK_THAT(error_of("layer:\n  decay: gated\n"), Contains("unknown decay 'gated'"));
  Overrides bad;
  bad.values["gate_norm"] = "nan";
  CHECK_THROWS_WITH(apply_overrides(c, bad), Contains("--gate-norm") && Contains("expected a number"));
}

// RWKV-6's bonus applies to the additive rule with vector gates, DeltaProduct's householder n > 1 to the
// delta rule without retnet's gamma (docs/spec.md sections 1g, 1h): any other rule or decay is refused
// with one line naming the key and what it met, in both suites that take the keys.
TEST_CASE("bonus and householder are refused with one line beside a rule or decay they do not apply to",
          "[config][errors][bonus][householder]") {
  using Catch::Matchers::Contains;
  for (const std::string suite : {"kernel", "decode"}) {
    INFO(suite);
    const auto error = [&](const std::string& keys) {
      return error_of("suites: [" + suite + "]\n" + suite + ":\n" + keys);
    };
    for (const std::string rule : {"delta", "dplr"}) {
      const std::string why = error("  rule: " + rule + "\n  decay: vector\n  bonus: true\n");
      CHECK_THAT(why, Contains("bonus true") && Contains("rule " + rule));
      CHECK(why.find('\n') == std::string::npos);
    }
    CHECK_THAT(error("  rule: trapezoidal\n  decay: scalar\n  bonus: true\n"),
               Contains("bonus true") && Contains("rule trapezoidal"));
    CHECK_THAT(error("  rule: additive\n  decay: scalar\n  bonus: true\n"), Contains("bonus true") && Contains("decay scalar"));
    for (const std::string rule : {"additive", "dplr"}) {
      const std::string why = error("  rule: " + rule + "\n  decay: vector\n  householder: 2\n");
      CHECK_THAT(why, Contains("householder 2") && Contains("rule " + rule));
      CHECK(why.find('\n') == std::string::npos);
    }
    CHECK_THAT(error("  rule: trapezoidal\n  decay: scalar\n  householder: 3\n"),
               Contains("householder 3") && Contains("rule trapezoidal"));
    CHECK_THAT(error("  rule: delta\n  decay: retnet\n  householder: 2\n"), Contains("householder 2") && Contains("retnet"));
    // A list of rules with the key at its default, and the forms where they apply, are taken.
    CHECK(error("  rule: [additive, delta, dplr]\n  decay: vector\n  bonus: false\n  householder: 1\n").empty());
    CHECK(error("  rule: additive\n  decay: vector\n  bonus: [false, true]\n").empty());
    CHECK(error("  rule: delta\n  decay: [none, scalar, vector]\n  householder: [1, 2]\n").empty());
  }
}

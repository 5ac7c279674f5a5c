// The decode step (docs/spec.md section 1d, kernels/decode) beyond the correctness table: its float64
// reference against the linear-attention op's (o, the new state and every snapshot; grouped heads
// and Dk x Dv states too), its inputs against that op's, the CPU kernel on every vector width and
// thread count and on every grouping and value dim, the in-place state's re-seeding, its scratch, the
// bandwidth figures of its records and the config keys' validation.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "kernels/decode/cpu.hpp"
#include "kernels/decode/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

// The first `tokens` tokens of each of the `heads` (batch x heads) heads of a token tensor
// [B][heads][T][width].
std::vector<float> first_tokens(const std::vector<float>& x, const DecodeProblem& p, std::size_t heads, int width,
                                int tokens) {
  std::vector<float> out;
  for (std::size_t bh = 0; bh < heads; ++bh) {
    const auto start = x.begin() + std::ptrdiff_t(bh * p.tokens * width);
    out.insert(out.end(), start, start + std::ptrdiff_t(tokens) * width);
  }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<Decay> all_decays() { return {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}; }

// A kernel-suite case of the decode problem's shape over `tokens` tokens.
Case kernel_case_of(const DecodeProblem& p, int tokens) {
  Problem kp{p.batch, p.heads, tokens, p.dim, 4, p.decay, p.rule};
  kp.bonus = p.bonus;
  kp.householder = p.householder;
  Case c = test::kernel_case(kp, "scan", Mode::fwd);
  c.options["heads_k"] = std::to_string(p.qk_heads());
  c.options["dim_v"] = std::to_string(p.value_dim());
  return c;
}

}  // namespace

TEST_CASE("decode: the reference is the linear-attention recurrence, snapshots included", "[decode]") {
  // Square; grouped heads with Dv < Dk; one q/k head with Dv > Dk.
  for (const auto& [heads_k, dim_v] : {std::pair{3, 7}, std::pair{1, 4}, std::pair{1, 9}})
    for (Rule rule : {Rule::additive, Rule::delta, Rule::dplr})
      for (Decay decay : all_decays())
      for (int form : {0, 1, 2}) {  // 1: RWKV-6's bonus (additive, vector); 2: DeltaProduct's 2 writes
        const bool bonus = form == 1, product = form == 2;
        if (bonus && (rule != Rule::additive || decay != Decay::vector)) continue;
        if (product && (rule != Rule::delta || decay == Decay::retnet)) continue;
        DecodeProblem p{2, 3, 5, 7, 4, decay, rule, heads_k, dim_v};
        p.bonus = bonus;
        p.householder = product ? 2 : 1;
        const int n = p.householder;
        const Case dc = test::decode_case(p);
        INFO(test::describe(dc) << " heads_k " << heads_k << " dim_v " << dim_v);
        const TensorSet in = make_case_inputs(dc, 11);
        const Reference ref = dc.op->reference(dc, in, false);
        // The same seed draws the same values as a kernel case of seq = tokens.
        const TensorSet kernel_inputs = make_case_inputs(kernel_case_of(p, p.tokens), 11);
        for (const Tensor& t : in) CHECK(t.data == kernel_inputs.at(t.name).data);
        CHECK(in.at("q").shape == std::vector<std::size_t>{2, std::size_t(heads_k), 5, 7});
        CHECK(in.at("v").shape == std::vector<std::size_t>{2, 3, std::size_t(5 * n), std::size_t(dim_v)});
        CHECK(in.at("h0").shape == std::vector<std::size_t>{2, 3, 7, std::size_t(dim_v)});
        // Slot i (0 the new state) against the linear-attention reference over the first T - i tokens.
        const std::size_t key_heads = std::size_t(p.batch) * p.qk_heads();
        for (int slot = 0; slot < p.kept_slots(); ++slot) {
          const int tokens = p.tokens - slot;
          const Case kc = kernel_case_of(p, tokens);
          TensorSet cut;
          // k, v and beta: n rows per token, taken as tokens of n rows.
          cut.add("q", Role::input,
                  {std::size_t(p.batch), std::size_t(p.qk_heads()), std::size_t(tokens), std::size_t(p.dim)})
              .data = first_tokens(in.at("q").data, p, key_heads, p.dim, tokens);
          cut.add("k", Role::input,
                  {std::size_t(p.batch), std::size_t(p.qk_heads()), std::size_t(tokens * n), std::size_t(p.dim)})
              .data = first_tokens(in.at("k").data, p, key_heads, n * p.dim, tokens);
          cut.add("v", Role::input,
                  {std::size_t(p.batch), std::size_t(p.heads), std::size_t(tokens * n), std::size_t(p.value_dim())})
              .data = first_tokens(in.at("v").data, p, p.heads_total(), n * p.value_dim(), tokens);
          cut.add("h0", Role::input, in.at("h0").shape).data = in.at("h0").data;
          if (gated(decay)) {
            const int width = decay == Decay::vector ? p.dim : 1;
            auto shape = in.at("g").shape;
            shape[2] = std::size_t(tokens);
            cut.add("g", Role::input, shape).data = first_tokens(in.at("g").data, p, p.heads_total(), width, tokens);
          }
          if (rule == Rule::delta)
            cut.add("beta", Role::input, {std::size_t(p.batch), std::size_t(p.heads), std::size_t(tokens * n)}).data =
                first_tokens(in.at("beta").data, p, p.heads_total(), n, tokens);
          if (rule == Rule::dplr)
            for (const char* name : {"a", "b"})
              cut.add(name, Role::input,
                      {std::size_t(p.batch), std::size_t(p.heads), std::size_t(tokens), std::size_t(p.dim)})
                  .data = first_tokens(in.at(name).data, p, p.heads_total(), p.dim, tokens);
          if (bonus) cut.add("u", Role::input, in.at("u").shape).data = in.at("u").data;
          const Reference linear = linear_attention_op().reference(kc, cut, false);
          const std::vector<double>& hT = linear.values.at("hT");
          if (slot == 0) {
            CHECK(max_abs_diff(ref.values.at("hT"), hT) < 1e-12);
            CHECK(max_abs_diff(ref.values.at("o"), linear.values.at("o")) < 1e-12);
            continue;
          }
          const std::vector<double>& snaps = ref.values.at("snapshots");
          const std::size_t DD = p.head_state_elems();
          std::vector<double> mine;
          for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
            const auto start = snaps.begin() + std::ptrdiff_t((bh * p.extra_slots() + std::size_t(slot - 1)) * DD);
            mine.insert(mine.end(), start, start + std::ptrdiff_t(DD));
          }
          INFO("slot " << slot);
          CHECK(max_abs_diff(mine, hT) < 1e-12);
        }
      }
}

TEST_CASE("decode: the CPU step matches the reference on every vector width and thread count", "[decode]") {
  // Each shape at every width and count in turn, so that its inputs and reference are made once.
  int checked = 0;
  for (const DecodeProblem& p : test::decode_test_shapes())
    for (const cpu::Vec vec : cpu::available_vecs()) {
      test::VecOverride force(vec);
      for (const int threads : {1, 2, 3}) {
        const Case c = test::decode_case(p);
        INFO(test::describe(c) << " vec " << cpu::to_string(vec) << " threads " << threads);
        const CheckResult r = test::run_cpu_case(c, threads);
        INFO(test::errors(r));
        CHECK(r.passed);
        CHECK(r.rel_err < 1e-5);
        ++checked;
      }
    }
  CHECK(checked >= int(test::decode_test_shapes().size()) * 3);
}

TEST_CASE("decode: the CPU step takes grouped heads and Dk x Dv states on every vector width", "[decode][shapes]") {
  // heads_k 1 (one q/k head for all: Mamba2), heads / 2 (Qwen3-Next's grouping) and heads; dim_v
  // dim / 2, dim and 2 dim; one token, and three with two earlier snapshots. Batch 2, so that the
  // second sequence's value heads find their q/k heads past the first's.
  const int heads = 4, dim = 32;
  int checked = 0;
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (const int heads_k : {1, heads / 2, heads})
      for (const int dim_v : {dim / 2, dim, 2 * dim})
        for (Rule rule : {Rule::additive, Rule::delta, Rule::dplr})
          for (Decay decay : all_decays())
            for (const auto& [tokens, snapshots] : {std::pair{1, 1}, std::pair{3, 3}}) {
              const DecodeProblem p{2, heads, tokens, dim, snapshots, decay, rule, heads_k, dim_v};
              const Case c = test::decode_case(p);
              INFO(test::describe(c) << " heads_k " << heads_k << " dim_v " << dim_v << " vec " << cpu::to_string(vec));
              const CheckResult r = test::run_cpu_case(c, 2);
              INFO(test::errors(r));
              CHECK(r.passed);
              CHECK(r.rel_err < 1e-5);
              ++checked;
            }
  }
  CHECK(checked == int(cpu::available_vecs().size()) * 3 * 3 * 3 * 4 * 2);
}

TEST_CASE("decode: the state is stepped in place and re-seeded before the check", "[decode]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  // Square, and grouped heads with a Dk x Dv state (the scratch is per Dk, whatever Dv).
  for (const DecodeProblem& p : {DecodeProblem{2, 4, 3, 32, 2, Decay::scalar, Rule::additive},
                                 DecodeProblem{2, 4, 3, 32, 2, Decay::scalar, Rule::delta},
                                 DecodeProblem{2, 4, 3, 32, 2, Decay::vector, Rule::delta, 2, 48}}) {
    const Case c = test::decode_case(p);
    const TensorSet all = make_case_inputs(c, 5);
    const Reference ref = c.op->reference(c, all, false);
    auto prepared = backend->find("decode", "step")->prepare(c, all.inputs_for(c.mode));
    // Timed calls step the state further from h0 each time, as an engine does.
    prepared->run();
    prepared->time_ms(7);
    TensorSet outputs = make_case_outputs(c);
    prepared->read_outputs(outputs);
    CHECK(check_outputs(c, outputs, ref).passed);
    // Reading twice gives the same step from h0, not a second step.
    TensorSet again = make_case_outputs(c);
    prepared->read_outputs(again);
    CHECK(again.at("hT").data == outputs.at("hT").data);
    CHECK(again.at("snapshots").data == outputs.at("snapshots").data);
    // The scratch is the row weights of one value head per thread, counted: per token four Dk
    // arrays and two factors.
    const MemoryUsage m = prepared->memory();
    CHECK(m.temp_bytes == cpu::decode_step_workspace_bytes(p, 2));
    CHECK(m.temp_bytes == 2 * 3 * (4 * 32 + 2) * sizeof(float));
  }
}

TEST_CASE("decode: the CPU declines what it does not run, with the reason", "[decode]") {
  auto backend = make_backend("cpu", BackendOptions{1});
  Case c = test::decode_case({1, 1, 1, 8, 1, Decay::none, Rule::delta});
  c.mode = Mode::fwd_bwd;
  REQUIRE(backend->unsupported(c));
  CHECK(backend->unsupported(c)->find("forward only") != std::string::npos);
  c.mode = Mode::fwd;
  c.dtype = "bf16";
  REQUIRE(backend->unsupported(c));
  CHECK(backend->unsupported(c)->find("float32") != std::string::npos);
}

TEST_CASE("decode: records carry the bandwidth figures and the table shows them", "[decode][cli][spawns]") {
  const auto dir = test::fresh_dir("decode-records");
  const std::string out = (dir / "d.json").string();
  const test::ProcessResult r = test::run_process(
      "timeout 300 " + test::binary() + " --suite decode --batch 2 --heads 2 --dim 16 --tokens 1,3 --snapshots 2 "
      "--rule additive,delta --decay vector --cache cold,warm --reps 2 --warmup 0 --min-sample-ms 1 --threads 2 --out " +
      out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  // %peak: the fraction of the measured bandwidth, in percent, where the kernel suite's is of the compute ceiling.
  CHECK(r.output.find(" %peak ") != std::string::npos);
  CHECK(r.output.find("bw_frac") == std::string::npos);
  CHECK(r.output.find("us/token") != std::string::npos);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 8);
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    CHECK(rec["status"] == "ok");
    CHECK(rec["suite"] == "decode");
    CHECK((rec["cache"] == "cold" || rec["cache"] == "warm"));
    CHECK(rec["tokens"] == rec["seq"]);
    const int tokens = rec["tokens"];
    // 2 x 2 heads of 16 x 16 states, in and out, plus the earlier snapshot when tokens > 1; q, k,
    // v, o, the vector gates and (delta) beta per token.
    const double state = 2 * 2 * 16 * 16 * 4.0, rows = 2 * 2 * tokens * 16 * 4.0;
    const double expected = 2 * state + (tokens > 1 ? state : 0.0) + 5 * rows + (rec["rule"] == "delta" ? rows / 16 : 0.0);
    CHECK(rec["bytes"].get<double>() == Approx(expected));
    const double seconds = rec["median_ms"].get<double>() * 1e-3;
    CHECK(rec["gbytes_per_s"].get<double>() == Approx(expected / seconds * 1e-9));
    CHECK(rec["tokens_per_s"].get<double>() == Approx(2 * tokens / seconds));
    CHECK(rec["us_per_token"].get<double>() == Approx(seconds * 1e6 / tokens));
    // Cold: against the DRAM triad. Warm: a few KiB, below the start-up sweep's smallest size,
    // against the sweep's rate there, in its first level where the sweep shows one.
    const auto& device = doc["device"];
    if (rec["cache"] == "cold") {
      CHECK(rec["bandwidth_roof"] == "dram");
      // The larger of the start-up triad and the one re-measured around a cold case.
      const double dram = std::max(device["stream_gbytes_per_s"].get<double>(),
                                   rec.value("stream_gbytes_per_s_now", 0.0));
      CHECK(rec["bandwidth_roof_gbytes_per_s"].get<double>() == Approx(dram));
    } else {
      const auto& sweep = device.at("bandwidth_sweep");
      std::vector<double> rates;
      for (const auto& rate : sweep.at("gbytes_per_s")) rates.push_back(rate.get<double>());
      REQUIRE(!rates.empty());
      CHECK(rec["working_set_bytes"].get<double>() < sweep.at("bytes").at(0).get<double>());
      CHECK(rec["bandwidth_roof_gbytes_per_s"].get<double>() == Approx(*std::max_element(rates.begin(), rates.end())));
      CHECK(rec["bandwidth_roof"] == (device.contains("cache_roof_bytes") ? "l1" : "dram"));
    }
    CHECK(rec["bandwidth_fraction"].get<double>() ==
          Approx(rec["gbytes_per_s"].get<double>() / rec["bandwidth_roof_gbytes_per_s"].get<double>()));
    CHECK(rec["above_roof"] == (rec["bandwidth_fraction"].get<double>() > 1.05));
  }
}

TEST_CASE("decode: grouped records count q and k once per q/k head and name heads_k and dim_v", "[decode][cli][spawns]") {
  const auto dir = test::fresh_dir("decode-grouped");
  const std::string out = (dir / "d.json").string();
  // heads_k 4 and dim_v 16 are heads and dim: the same case as the keys' default, recorded without them.
  const test::ProcessResult r = test::run_process(
      "timeout 300 " + test::binary() +
      " --suite decode --batch 2 --heads 4 --heads-k 2,4 --dim 16 --dim-v 8,16 "
      "--tokens 2 --snapshots 2 --rule delta --decay vector --reps 1 --warmup 0 --min-sample-ms 1 --threads 2 --out " +
      out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  // The table tells the four cases apart: a column for each of the keys that varied.
  CHECK(r.output.find("heads_k") != std::string::npos);
  CHECK(r.output.find("dim_v") != std::string::npos);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 4);
  int square = 0;
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    CHECK(rec["status"] == "ok");
    const int hk = rec.value("heads_k", 4), dv = rec.value("dim_v", 16);
    if (rec.contains("heads_k")) CHECK(hk == 2);
    if (rec.contains("dim_v")) CHECK(dv == 8);
    square += !rec.contains("heads_k") && !rec.contains("dim_v");
    // 2 x 4 value heads of 16 x dv states, in and out, plus the earlier snapshot; q and k per q/k
    // head (16 wide), v and o per value head (dv wide), the vector gates (16 wide) and beta.
    const double state = 2 * 4 * 16 * dv * 4.0, keys = 2.0 * hk * 2 * 16 * 4, values = 2 * 4 * 2 * dv * 4.0;
    const double expected = 3 * state + 2 * keys + 2 * values + 2 * 4 * 2 * (16 + 1) * 4.0;
    CHECK(rec["bytes"].get<double>() == Approx(expected));
  }
  CHECK(square == 1);
}

TEST_CASE("decode: heads_k must divide heads, refused in one line", "[decode][cli][config][spawns]") {
  const test::ProcessResult r = test::run_process("timeout 60 " + test::binary() +
                                                  " --suite decode --heads 4 --heads-k 3 --dim 8 --quiet --out " +
                                                  (test::fresh_dir("decode-refused") / "never.json").string());
  INFO(r.output);
  CHECK(r.exit_status == 2);
  CHECK(r.output.find("heads_k 3 does not divide heads 4") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  heads: 6\n  heads_k: 4\n").find("heads_k 4") !=
        std::string::npos);
}

TEST_CASE("decode: config keys are validated in one line naming where", "[decode][config]") {
  CHECK(test::config_error("suites: [decode]\ndecode:\n  tokens: 0\n").find("tokens") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  snapshots: 65\n").find("snapshots") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  rule: gated\n").find("rule") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  mode: fwd_bwd\n").find("mode") != std::string::npos);
}

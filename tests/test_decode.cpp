// The decode step (docs/spec.md section 1d, kernels/decode) beyond the correctness table: its float64
// reference against the linear-attention op's (o, the new state and every snapshot), its inputs
// against that op's, the CPU kernel on every vector width and thread count, the in-place state's
// re-seeding, its scratch, the bandwidth figures of its records and the config keys' validation.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "kernels/decode/cpu.hpp"
#include "kernels/decode/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

// The first `tokens` tokens of each head of a token tensor [B][H][T][D].
std::vector<float> first_tokens(const std::vector<float>& x, const DecodeProblem& p, int width, int tokens) {
  std::vector<float> out;
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
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

}  // namespace

TEST_CASE("decode: the reference is the linear-attention recurrence, snapshots included", "[decode]") {
  for (Rule rule : {Rule::additive, Rule::delta})
    for (Decay decay : all_decays()) {
      const DecodeProblem p{2, 3, 5, 7, 4, decay, rule};
      const Case dc = test::decode_case(p);
      INFO(test::describe(dc));
      const TensorSet in = make_case_inputs(dc, 11);
      const Reference ref = dc.op->reference(dc, in, false);
      // The same seed draws the same values as a kernel case of seq = tokens.
      const TensorSet kernel_inputs = make_case_inputs(test::kernel_case({2, 3, 5, 7, 4, decay, rule}, "scan", Mode::fwd), 11);
      for (const Tensor& t : in) CHECK(t.data == kernel_inputs.at(t.name).data);
      // Slot i (0 the new state) against the linear-attention reference over the first T - i tokens.
      for (int slot = 0; slot < p.kept_slots(); ++slot) {
        const int tokens = p.tokens - slot;
        const Case kc = test::kernel_case({p.batch, p.heads, tokens, p.dim, 4, decay, rule}, "scan", Mode::fwd);
        TensorSet cut;
        for (const char* name : {"q", "k", "v"})
          cut.add(name, Role::input, {std::size_t(p.batch), std::size_t(p.heads), std::size_t(tokens), std::size_t(p.dim)}).data =
              first_tokens(in.at(name).data, p, p.dim, tokens);
        cut.add("h0", Role::input, in.at("h0").shape).data = in.at("h0").data;
        if (gated(decay)) {
          const int width = decay == Decay::vector ? p.dim : 1;
          auto shape = in.at("g").shape;
          shape[2] = std::size_t(tokens);
          cut.add("g", Role::input, shape).data = first_tokens(in.at("g").data, p, width, tokens);
        }
        if (rule == Rule::delta)
          cut.add("beta", Role::input, {std::size_t(p.batch), std::size_t(p.heads), std::size_t(tokens)}).data =
              first_tokens(in.at("beta").data, p, 1, tokens);
        const Reference linear = linear_attention_op().reference(kc, cut, false);
        const std::vector<double>& hT = linear.values.at("hT");
        if (slot == 0) {
          CHECK(max_abs_diff(ref.values.at("hT"), hT) < 1e-12);
          CHECK(max_abs_diff(ref.values.at("o"), linear.values.at("o")) < 1e-12);
          continue;
        }
        const std::vector<double>& snaps = ref.values.at("snapshots");
        const std::size_t DD = std::size_t(p.dim) * p.dim;
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
  int checked = 0;
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (const int threads : {1, 2, 3})
      for (const DecodeProblem& p : test::decode_test_shapes()) {
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

TEST_CASE("decode: the state is stepped in place and re-seeded before the check", "[decode]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  for (Rule rule : {Rule::additive, Rule::delta}) {
    const DecodeProblem p{2, 4, 3, 32, 2, Decay::scalar, rule};
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
    // The scratch is the row weights of one head per thread, counted.
    const MemoryUsage m = prepared->memory();
    CHECK(m.temp_bytes == cpu::decode_step_workspace_bytes(p, 2));
    CHECK(m.temp_bytes > 0);
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

TEST_CASE("decode: records carry the bandwidth figures and the table shows them", "[decode][cli]") {
  const auto dir = test::fresh_dir("decode-records");
  const std::string out = (dir / "d.json").string();
  const test::ProcessResult r = test::run_process(
      "timeout 300 " + test::binary() + " --suite decode --batch 2 --heads 2 --dim 16 --tokens 1,3 --snapshots 2 "
      "--rule additive,delta --decay vector --reps 2 --warmup 0 --min-sample-ms 1 --threads 2 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  CHECK(r.output.find("bw_frac") != std::string::npos);
  CHECK(r.output.find("us/token") != std::string::npos);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 4);
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    CHECK(rec["status"] == "ok");
    CHECK(rec["suite"] == "decode");
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
    CHECK(rec["bandwidth_fraction"].get<double>() ==
          Approx(rec["gbytes_per_s"].get<double>() / doc["device"]["stream_gbytes_per_s"].get<double>()));
    // A few KiB: in the last-level cache wherever the device block knows the caches.
    const bool caches_known = doc["device"].contains("cache_kib") && !doc["device"]["cache_kib"].empty();
    CHECK(rec["bandwidth_roof"] == (caches_known ? "llc" : "dram"));
  }
}

TEST_CASE("decode: config keys are validated in one line naming where", "[decode][config]") {
  CHECK(test::config_error("suites: [decode]\ndecode:\n  tokens: 0\n").find("tokens") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  snapshots: 65\n").find("snapshots") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  rule: gated\n").find("rule") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  mode: fwd_bwd\n").find("mode") != std::string::npos);
}

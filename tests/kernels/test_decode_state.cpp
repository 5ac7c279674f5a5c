// The decode step's states as an engine keeps them (kernels/decode/problem.hpp): in a pool of slots
// gathered through the seeded index, and stored as bf16. The CPU kernel against itself (a pooled
// step is the contiguous step at other addresses, touching no other slot; a bf16 step is the
// float32 step rounded once), the backend row against the float64 reference, the index's draw,
// the bytes the records count and the config keys' validation.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/random.hpp"
#include "kernels/decode/cpu.hpp"
#include "kernels/decode/op.hpp"
#include "op_table.hpp"
#include "src/run/counting_allocator.hpp"

using namespace lattn;

namespace {

std::vector<Decay> all_decays() { return {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}; }

// The kernel's arguments over a case's inputs, the states where the caller puts them.
DecodeArgs<float> args_over(TensorSet& in, const DecodeProblem& p, float* o, float* snapshots) {
  DecodeArgs<float> a{in.at("q").data.data(), in.at("k").data.data(), in.at("v").data.data(), nullptr, o};
  if (gated(p.decay)) a.g = in.at("g").data.data();
  if (p.delta()) a.beta = in.at("beta").data.data();
  a.snapshots = snapshots;
  return a;
}

float rounded(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace

TEST_CASE("decode state: the pool's index is a seeded draw of distinct slots, not sorted", "[decode][pool]") {
  DecodeProblem p{6, 2, 1, 8, 1, Decay::none, Rule::additive};
  p.state_slots = 16;
  const Case c = test::decode_case(p);
  INFO(test::describe(c) << " pooled " << decode_problem(c).pooled() << " slots " << c.option("state_slots"));
  const TensorSet a = make_case_inputs(c, 3), b = make_case_inputs(c, 3), other = make_case_inputs(c, 4);
  const std::vector<float>& index = a.at("state_index").data;
  REQUIRE(index.size() == 6);
  CHECK(index == b.at("state_index").data);      // the seed decides it
  CHECK(index != other.at("state_index").data);  // and another seed another
  std::set<float> distinct(index.begin(), index.end());
  CHECK(distinct.size() == 6);
  for (float slot : index) CHECK((slot >= 0 && slot < 16 && slot == std::floor(slot)));
  CHECK_FALSE(std::is_sorted(index.begin(), index.end()));
  // No pool, no index tensor: batch slots are the contiguous states.
  p.state_slots = 6;
  CHECK(make_case_inputs(test::decode_case(p), 3).find("state_index") == nullptr);
}

TEST_CASE("decode state: a pooled CPU step is the contiguous step at its slots and touches no other",
          "[decode][pool]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (Rule rule : {Rule::additive, Rule::delta})
      for (Decay decay : all_decays()) {
        DecodeProblem p{3, 2, 3, 24, 2, decay, rule, 1, 40};
        p.state_slots = 9;
        TensorSet in = make_case_inputs(test::decode_case(p), 7);
        INFO("vec " << cpu::to_string(vec) << " rule " << to_string(rule) << " decay " << to_string(decay));
        const std::size_t DD = p.head_state_elems();
        std::vector<int> index;
        for (float slot : in.at("state_index").data) index.push_back(int(slot));
        CountingAllocator allocator;
        // Contiguous: the states in batch order.
        DecodeProblem flat = p;
        flat.state_slots = 0;
        std::vector<float> states = in.at("h0").data, o1(p.value_elems()), s1(p.snapshot_elems());
        DecodeArgs<float> a1 = args_over(in, flat, o1.data(), s1.data());
        a1.state = states.data();
        cpu::decode_step(flat, a1, allocator);
        // Pooled: every slot a sentinel, then the batch's states at their slots.
        std::vector<float> pool(p.pool_elems(), 12345.0f), o2(p.value_elems()), s2(p.snapshot_elems());
        for (std::size_t bh = 0; bh < p.heads_total(); ++bh)
          std::copy_n(in.at("h0").data.begin() + std::ptrdiff_t(bh * DD), DD,
                      pool.begin() + std::ptrdiff_t(p.state_offset(bh, index.data())));
        DecodeArgs<float> a2 = args_over(in, p, o2.data(), s2.data());
        a2.state = pool.data();
        a2.state_index = index.data();
        cpu::decode_step(p, a2, allocator);
        CHECK(o2 == o1);
        CHECK(s2 == s1);
        std::vector<bool> used(std::size_t(p.state_slots), false);
        for (int slot : index) used[std::size_t(slot)] = true;
        for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
          const std::size_t at = p.state_offset(bh, index.data());
          CHECK(std::equal(states.begin() + std::ptrdiff_t(bh * DD), states.begin() + std::ptrdiff_t((bh + 1) * DD),
                           pool.begin() + std::ptrdiff_t(at)));
        }
        const std::size_t slot_elems = std::size_t(p.heads) * DD;
        for (int slot = 0; slot < p.state_slots; ++slot)
          if (!used[std::size_t(slot)])
            CHECK(std::all_of(pool.begin() + std::ptrdiff_t(slot * slot_elems),
                              pool.begin() + std::ptrdiff_t((slot + 1) * slot_elems),
                              [](float x) { return x == 12345.0f; }));
      }
  }
}

TEST_CASE("decode state: a bf16 CPU step is the float32 step rounded once, after its last token",
          "[decode][bf16_state]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (Rule rule : {Rule::additive, Rule::delta})
      for (Decay decay : all_decays())
        // A strip per work item, a head per work item, and a state past kStreamedStateBytes walked
        // in strips as wide as its ragged rows (Dv 100).
        for (const auto [heads, dim, dim_v] : {std::array{2, 36, 36}, std::array{40, 36, 36}, std::array{180, 128, 100}})
          for (const int tokens : {1, 3}) {  // bf16 in and out in one walk; through a float32 copy
            DecodeProblem p{1, heads, tokens, dim, 3, decay, rule, 0, dim_v};
            p.state_bf16 = true;
            TensorSet in = make_case_inputs(test::decode_case(p), 9);  // h0 already bf16 values
            INFO("vec " << cpu::to_string(vec) << " rule " << to_string(rule) << " decay " << to_string(decay)
                        << " heads " << heads << " tokens " << tokens);
            CountingAllocator allocator;
            DecodeProblem f32 = p;
            f32.state_bf16 = false;
            std::vector<float> states = in.at("h0").data, o1(p.value_elems()), s1(p.snapshot_elems());
            DecodeArgs<float> a1 = args_over(in, f32, o1.data(), s1.data());
            a1.state = states.data();
            cpu::decode_step(f32, a1, allocator);
            std::vector<std::uint16_t> bits(p.state_elems());
            std::transform(in.at("h0").data.begin(), in.at("h0").data.end(), bits.begin(), float_to_bf16_bits);
            std::vector<float> o2(p.value_elems()), s2(p.snapshot_elems());
            DecodeArgs<float> a2 = args_over(in, p, o2.data(), s2.data());
            a2.state_bf16 = bits.data();
            cpu::decode_step(p, a2, allocator);
            // The tokens' outputs and the earlier snapshots come from the float32 states in between.
            CHECK(o2 == o1);
            CHECK(s2 == s1);
            std::size_t differ = 0;
            for (std::size_t e = 0; e < states.size(); ++e) differ += bf16_bits_to_float(bits[e]) != rounded(states[e]);
            CHECK(differ == 0);
          }
  }
  // Its scratch: for a step of several tokens, each thread's float32 copy of a head's state beside
  // the row weights; one token reads and writes the bf16 state in its walk and needs no copy.
  DecodeProblem p{1, 2, 3, 36, 1, Decay::none, Rule::delta, 0, 20};
  const std::size_t f32 = cpu::decode_step_workspace_bytes(p, 2);
  p.state_bf16 = true;
  CHECK(cpu::decode_step_workspace_bytes(p, 2) == f32 + 2 * 36 * 20 * sizeof(float));
  p.tokens = 1;
  const std::size_t one = cpu::decode_step_workspace_bytes(p, 2);
  p.state_bf16 = false;
  CHECK(one == cpu::decode_step_workspace_bytes(p, 2));
}

TEST_CASE("decode state: the CPU row's pooled and bf16 steps match the float64 reference",
          "[decode][pool][bf16_state]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  for (Rule rule : {Rule::additive, Rule::delta, Rule::dplr})
    for (Decay decay : all_decays())
      for (const bool bf16 : {false, true})
        for (const int slots : {0, 11}) {
          DecodeProblem p{4, 3, 2, 48, 2, decay, rule, 1, 32};
          p.state_slots = slots;
          p.state_bf16 = bf16;
          const Case c = test::decode_case(p);
          INFO(test::describe(c) << " slots " << slots << " bf16 " << bf16);
          REQUIRE_FALSE(backend->unsupported(c));
          const test::Outcome r = test::run_on(*backend, c, 5);
          INFO(test::errors(r.check));
          CHECK(r.check.passed);
          // o and the snapshots from float32 states; hT rounded once: within 2^-8 of its norm.
          CHECK(r.check.per_output.at("o") < 1e-5);
          CHECK(r.check.per_output.at("snapshots") < 1e-5);
          CHECK(r.check.per_output.at("hT") < (bf16 ? std::ldexp(1.0, -8) : 1e-5));
          if (bf16) CHECK(r.check.per_output.at("hT") > 1e-4);  // the rounding is there
          CHECK(r.check.tolerance == Approx(bf16 ? 1e-4 + std::ldexp(1.0, -8) : 1e-4));
          // The pool's states are the outputs the steps write.
          const std::size_t pool = std::size_t(slots > 0 ? slots : 4) * 3 * 48 * 32 * (bf16 ? 2 : 4);
          const std::size_t rest = (4 * 3 * 2 * 32 + 4 * 3 * 48 * 32) * sizeof(float);  // o, one snapshot
          CHECK(r.memory.out_bytes == pool + rest);
        }
}

TEST_CASE("decode state: records count the states in their dtype and the pool's index", "[decode][cli][spawns]") {
  const auto dir = test::fresh_dir("decode-state-records");
  const std::string out = (dir / "d.json").string();
  const test::ProcessResult r =
      test::run_process("timeout 300 " + test::binary() +
                        " --suite decode --batch 2 --heads 2 --dim 16 --tokens 1 --rule delta "
                        "--decay scalar --state-dtype float32,bf16 --state-slots 0,5 --cache warm --reps 1 --warmup 0 "
                        "--min-sample-ms 1 --threads 2 --out " +
                        out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 4);
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    CHECK(rec["status"] == "ok");
    const bool bf16 = rec.value("state_dtype", "float32") == "bf16", pooled = rec.value("state_slots", 0) == 5;
    // States in and out in their dtype; the index (4 bytes a sequence); q, k, v, o; the gates, beta.
    const double state = 2 * 2 * 16 * 16 * (bf16 ? 2.0 : 4.0), rows = 2 * 2 * 16 * 4.0;
    const double expected = 2 * state + (pooled ? 2 * 4.0 : 0.0) + 4 * rows + 2 * 2 * 4.0 * 2;
    CHECK(rec["bytes"].get<double>() == Approx(expected));
    CHECK(rec["rel_errs"]["hT"].get<double>() < (bf16 ? std::ldexp(1.0, -8) : 1e-5));
  }
}

TEST_CASE("decode state: the keys are validated in one line naming where", "[decode][config][spawns]") {
  CHECK(test::config_error("suites: [decode]\ndecode:\n  state_dtype: fp8\n").find("state_dtype") != std::string::npos);
  CHECK(test::config_error("suites: [decode]\ndecode:\n  state_slots: -1\n").find("state_slots") != std::string::npos);
  const test::ProcessResult r = test::run_process("timeout 60 " + test::binary() +
                                                  " --suite decode --batch 8 --state-slots 4 --dim 8 --quiet --out " +
                                                  (test::fresh_dir("decode-slots-refused") / "never.json").string());
  INFO(r.output);
  CHECK(r.exit_status == 2);
  CHECK(r.output.find("state_slots 4 is below batch 8") != std::string::npos);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

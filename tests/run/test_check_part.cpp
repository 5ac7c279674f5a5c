// A run's check_heads (src/run/case_run.cpp, ReferenceCache; Op::check_part): the linear-attention
// op's part of a case is its first (sequence, head) pairs, whose inputs and float64 outputs are the
// first elements of the whole case's; the runner checks only those, says so in the record
// (checked_pairs) and still fails a kernel whose part is wrong.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cases.hpp"
#include "kernels/linear_attention/op.hpp"
#include "process_util.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

// Every tensor of `part` equals the first elements of the same tensor of `whole`.
void check_prefixes(const TensorSet& part, const TensorSet& whole) {
  for (const Tensor& t : part) {
    INFO("tensor " << t.name);
    const std::vector<float>& w = whole.at(t.name).data;
    REQUIRE(t.data.size() < w.size());
    CHECK(std::equal(t.data.begin(), t.data.end(), w.begin()));
  }
}

void check_prefixes(const Reference& part, const Reference& whole) {
  for (const auto& [name, values] : part.values) {
    INFO("reference " << name);
    const std::vector<double>& w = whole.values.at(name);
    REQUIRE(values.size() < w.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, std::abs(values[i] - w[i]));
      scale = std::max(scale, std::abs(w[i]));
    }
    CHECK(worst <= 1e-12 * std::max(scale, 1.0));
  }
}

}  // namespace

TEST_CASE("check part: a linear-attention case's first pairs are a case whose tensors are its first elements",
          "[check_part]") {
  const Op& op = linear_attention_op();
  REQUIRE(op.check_part);
  struct Shape {
    Problem p;
    int pairs, batch, heads;
  };
  const Shape shapes[] = {
      {{3, 4, 40, 8, 16, Decay::vector, Rule::delta, 2, 12}, 3, 1, 4},   // grouped: whole groups, Dk != Dv
      {{3, 4, 40, 8, 16, Decay::retnet, Rule::additive}, 1, 1, 1},        // the decay's per-head gamma
      {{3, 4, 40, 8, 16, Decay::scalar, Rule::delta}, 6, 2, 4},           // whole sequences past one
      {{2, 6, 33, 8, 16, Decay::vector, Rule::additive, 3}, 2, 1, 2},
  };
  for (const Shape& s : shapes) {
    const Case c = test::kernel_case(s.p, "scan", Mode::fwd_bwd);
    INFO(test::describe(c) << " pairs " << s.pairs);
    const std::optional<Case> part = op.check_part(c, s.pairs);
    REQUIRE(part);
    CHECK(part->batch == s.batch);
    CHECK(part->heads == s.heads);
    const TensorSet whole_in = make_case_inputs(c, 11), part_in = make_case_inputs(*part, 11);
    check_prefixes(part_in, whole_in);
    check_prefixes(op.reference(*part, part_in, true), op.reference(c, whole_in, true));
    // The outputs' shapes too: the check cuts them by the part's.
    check_prefixes(make_case_outputs(*part), make_case_outputs(c));
  }
  // Nothing to cut: the whole case, or packed documents (their states are per document).
  const Case small = test::kernel_case({2, 3, 16, 8, 16}, "scan", Mode::fwd);
  CHECK_FALSE(op.check_part(small, 6));
  CHECK_FALSE(op.check_part(small, 100));
  CHECK(op.check_part(small, 3)->batch == 1);  // the first sequence, every head
  Problem packed{1, 2, 30, 8, 16};
  packed.cu_seqlens = {0, 10, 30};
  CHECK_FALSE(op.check_part(test::kernel_case(packed, "scan", Mode::fwd), 1));
}

TEST_CASE("check part: --check-heads checks the first pairs, records how many, and passes a correct kernel",
          "[check_part][cli][spawns]") {
  const auto dir = test::fresh_dir("check-part");
  const std::string out = (dir / "r.json").string();
  const test::ProcessResult r = test::run_process(
      test::binary() +
      " --suite kernel --impl scan,chunked --mode fwd,fwd_bwd --rule delta --decay vector --batch 3 --heads 4"
      " --heads-k 2 --seq 70 --dim 16 --chunk 32 --reps 1 --warmup 0 --min-sample-ms 1 --threads 2 --quiet"
      " --check-heads 3 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  const nlohmann::json doc = test::read_json(out);
  CHECK(doc["config"]["check_heads"] == 3);
  REQUIRE(doc["results"].size() == 4);
  for (const auto& rec : doc["results"]) {
    CHECK(rec["status"] == "ok");
    CHECK(rec["checked_pairs"] == 4);  // three pairs asked, whole groups of two value heads
    CHECK(rec["rel_err"].get<double>() > 0);  // compared, not skipped
  }
  // Without it every element is checked and the record says nothing.
  const test::ProcessResult all = test::run_process(test::binary() +
                                                    " --suite kernel --impl scan --mode fwd --batch 2 --heads 2"
                                                    " --seq 16 --dim 8 --reps 1 --warmup 0 --threads 1 --quiet --out " +
                                                    out);
  REQUIRE(all.exit_status == 0);
  const nlohmann::json plain = test::read_json(out);
  CHECK_FALSE(plain["config"].contains("check_heads"));
  CHECK_FALSE(plain["results"][0].contains("checked_pairs"));
  // A kernel whose part is wrong (a plugin that writes zeros) still fails its check.
  const test::ProcessResult zeros = test::run_process(
      test::binary() + " --suite kernel --plugin " LATTN_PLUGIN_wrong " --impl test_wrong:zeros --mode fwd --batch 2 --heads 2"
                       " --seq 16 --dim 8 --reps 1 --warmup 0 --threads 1 --quiet --check-heads 1 --out " + out);
  INFO(zeros.output);
  const nlohmann::json wrong = test::read_json(out);
  REQUIRE(wrong["results"].size() == 1);
  CHECK(wrong["results"][0]["status"] == "failed");
  CHECK(wrong["results"][0]["checked_pairs"] == 1);
  // A value out of range: one line naming the key, exit 2.
  const test::ProcessResult bad =
      test::run_process(test::binary() + " --suite kernel --impl scan --check-heads -1 --out " + out);
  CHECK(bad.exit_status == 2);
  CHECK_THAT(bad.output, Catch::Contains("check"));
}

// --shard K/N: deterministic, balanced by cost, and together the shards are the plan exactly.
#include <catch2/catch.hpp>

#include <set>

#include "src/run/cost.hpp"
#include "core/error.hpp"
#include "src/config/config.hpp"
#include "src/config/plan.hpp"
#include "src/run/shard.hpp"

using namespace lattn;

TEST_CASE("the union of shards K/N for K = 1..N is the plan, no case twice", "[shard]") {
  const std::vector<Case> plan = expand_plan(embedded_default_config());
  for (int count : {1, 2, 3, 5, 7, 36, 50}) {
    INFO("N = " << count);
    std::multiset<std::size_t> seen;
    for (int index = 1; index <= count; ++index) {
      const auto shard = select_shard(plan, Shard{index, count});
      for (std::size_t i = 1; i < shard.size(); ++i) CHECK(shard[i - 1].plan_index < shard[i].plan_index);
      for (const auto& c : shard) seen.insert(c.plan_index);
    }
    CHECK(seen.size() == plan.size());
    CHECK(std::set<std::size_t>(seen.begin(), seen.end()).size() == plan.size());
  }
}

TEST_CASE("shards are balanced by estimated cost, not by count", "[shard]") {
  const std::vector<Case> plan = expand_plan(embedded_default_config());
  double total = 0, biggest = 0;
  for (const auto& c : plan) {
    total += case_cost_estimate(c);
    biggest = std::max(biggest, case_cost_estimate(c));
  }
  const int count = 4;
  for (int index = 1; index <= count; ++index) {
    double load = 0;
    for (const auto& c : select_shard(plan, Shard{index, count})) load += case_cost_estimate(c);
    // Greedy LPT: no shard exceeds the even share by more than the largest single case.
    CHECK(load <= total / count + biggest);
  }
}

TEST_CASE("the costliest case goes first, to the least-loaded shard", "[shard]") {
  // Three cases of increasing cost: seq 8192 fills shard 1 alone, 2048 and 512 go to shard 2.
  Config c = parse_config("suites: [kernel]\nkernel:\n  seq: [512, 2048, 8192]\n  dim: 64\n  impl: scan\n  mode: fwd\n",
                          "s.yaml");
  const std::vector<Case> plan = expand_plan(c);
  REQUIRE(plan.size() == 3);
  const auto first = select_shard(plan, Shard{1, 2}), second = select_shard(plan, Shard{2, 2});
  REQUIRE(first.size() == 1);
  CHECK(first[0].seq == 8192);
  REQUIRE(second.size() == 2);
  CHECK(second[0].seq == 512);
  CHECK(second[1].seq == 2048);
}

TEST_CASE("bad --shard values are refused", "[shard][errors]") {
  for (const char* bad : {"0/3", "4/3", "1/0", "a/b", "2", "1/3/4", "-1/2", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_shard(bad), UsageError);
  }
  CHECK(parse_shard("3/8").index == 3);
  CHECK(parse_shard("3/8").count == 8);
}

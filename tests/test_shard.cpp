// --shard K/N: deterministic, balanced by cost, and together the shards are the plan exactly.
#include <catch2/catch.hpp>

#include <set>

#include "cost_model.hpp"
#include "error.hpp"
#include "shard.hpp"

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
  CHECK(select_shard(plan, Shard{2, 3}).size() == select_shard(plan, Shard{2, 3}).size());
}

TEST_CASE("bad --shard values are refused", "[shard][errors]") {
  for (const char* bad : {"0/3", "4/3", "1/0", "a/b", "2", "1/3/4", "-1/2", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_shard(bad), UsageError);
  }
  CHECK(parse_shard("3/8").index == 3);
  CHECK(parse_shard("3/8").count == 8);
}

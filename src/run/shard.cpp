#include "src/run/shard.hpp"

#include <algorithm>
#include <charconv>
#include <numeric>

#include "src/run/cost.hpp"
#include "core/error.hpp"

namespace lattn {

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  Shard shard;
  auto parse = [&](std::string_view part, int& value) {
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    return ec == std::errc() && ptr == part.data() + part.size() && !part.empty();
  };
  if (slash == std::string::npos || !parse(std::string_view(text).substr(0, slash), shard.index) ||
      !parse(std::string_view(text).substr(slash + 1), shard.count) || shard.count < 1 || shard.count > 10000 ||
      shard.index < 1 || shard.index > shard.count)
    throw UsageError("--shard", "expected K/N with 1 <= K <= N <= 10000, got '" + text + "'");
  return shard;
}

std::vector<Case> select_shard(const std::vector<Case>& plan, const Shard& shard) {
  if (!shard.active()) return plan;
  std::vector<std::size_t> order(plan.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return case_cost_estimate(plan[a]) > case_cost_estimate(plan[b]);
  });
  std::vector<double> load(std::size_t(shard.count), 0.0);
  std::vector<int> owner(plan.size(), 0);
  for (std::size_t i : order) {
    const auto lightest = std::size_t(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = int(lightest) + 1;
    load[lightest] += case_cost_estimate(plan[i]);
  }
  std::vector<Case> mine;
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (owner[i] == shard.index) mine.push_back(plan[i]);
  return mine;
}

}  // namespace lattn

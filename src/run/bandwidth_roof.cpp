#include "src/run/bandwidth_roof.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace lattn {

std::vector<double> sweep_envelope(const std::vector<BandwidthPoint>& sweep) {
  std::vector<double> envelope(sweep.size());
  double best = 0;
  for (std::size_t i = sweep.size(); i-- > 0;) envelope[i] = best = std::max(best, sweep[i].gbytes_per_s);
  return envelope;
}

namespace {

// The size between `a` and `b` (bytes, a < b) at which a rate going from `rate_a` to `rate_b`,
// linearly in log size, reaches `rate` (between the two).
double log_size_at(double a, double b, double rate_a, double rate_b, double rate) {
  const double t = rate_a == rate_b ? 0.0 : (rate_a - rate) / (rate_a - rate_b);
  return std::exp(std::log(a) + t * (std::log(b) - std::log(a)));
}

}  // namespace

std::vector<CacheRoof> cache_levels_from_sweep(const std::vector<BandwidthPoint>& sweep, const LevelRule& rule) {
  const std::vector<double> envelope = sweep_envelope(sweep);
  const std::size_t n = sweep.size();
  std::vector<CacheRoof> levels;
  std::size_t i = 0;
  while (i + 1 < n) {
    // The sizes that keep `keep` of the first one's rate; their median is the plateau (a first
    // size still on the fall from the level before reads above it), and the level holds the
    // sizes that keep `keep` of that.
    std::size_t last = i;
    while (last + 1 < n && envelope[last + 1] >= rule.keep * envelope[i]) ++last;
    std::vector<double> rates(envelope.begin() + long(i), envelope.begin() + long(last) + 1);
    std::nth_element(rates.begin(), rates.begin() + long(rates.size() / 2), rates.end());
    const double plateau = rates[rates.size() / 2], floor = rule.keep * plateau;
    while (last + 1 < n && envelope[last + 1] >= floor) ++last;
    if (last + 1 == n) break;  // it holds to the end: the memory's plateau
    const double capacity = log_size_at(double(sweep[last].bytes), double(sweep[last + 1].bytes), envelope[last],
                                        envelope[last + 1], floor);
    if (capacity >= rule.min_span * double(sweep[i].bytes))
      levels.push_back({"L" + std::to_string(levels.size() + 1), std::size_t(std::llround(capacity)), plateau});
    // The next plateau: past the sizes where the rate is still falling steeply.
    i = last + 1;
    while (i + 1 < n && envelope[i + 1] < rule.settled * envelope[i]) ++i;
  }
  return levels;
}

std::optional<double> sweep_rate_at(const std::vector<BandwidthPoint>& sweep, double working_set_bytes) {
  if (sweep.empty()) return std::nullopt;
  const std::vector<double> envelope = sweep_envelope(sweep);
  if (working_set_bytes <= double(sweep.front().bytes)) return envelope.front();
  for (std::size_t i = 1; i < sweep.size(); ++i) {
    const double a = double(sweep[i - 1].bytes), b = double(sweep[i].bytes);
    if (working_set_bytes > b) continue;
    if (b <= a) return envelope[i];
    const double t = (std::log(working_set_bytes) - std::log(a)) / (std::log(b) - std::log(a));
    return envelope[i - 1] + t * (envelope[i] - envelope[i - 1]);
  }
  return envelope.back();
}

BandwidthRoof bandwidth_roof(bool cold, double working_set_bytes, const std::vector<BandwidthPoint>& sweep,
                             const std::vector<CacheRoof>& levels, double dram_gbytes_per_s) {
  const auto measured = [](double rate) { return rate > 0 ? std::optional<double>(rate) : std::nullopt; };
  if (cold || sweep.empty()) return {"dram", measured(dram_gbytes_per_s)};
  std::string name = "dram";
  for (const CacheRoof& level : levels)
    if (double(level.capacity_bytes) >= working_set_bytes) {
      name = level.level;
      for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      break;
    }
  return {name, measured(sweep_rate_at(sweep, working_set_bytes).value_or(0.0))};
}

std::size_t cold_span_bytes(std::size_t last_level_bytes) {
  constexpr std::size_t kCap = std::size_t(1) << 30;
  return std::max(2 * last_level_bytes, std::min(16 * last_level_bytes, kCap));
}

}  // namespace lattn

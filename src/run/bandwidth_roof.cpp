#include "src/run/bandwidth_roof.hpp"

#include <algorithm>
#include <cctype>

namespace lattn {

BandwidthRoof bandwidth_roof(bool cold, double working_set_bytes, const std::vector<CacheRoof>& levels,
                             double dram_gbytes_per_s) {
  const auto dram = [&] {
    return BandwidthRoof{"dram", dram_gbytes_per_s > 0 ? std::optional<double>(dram_gbytes_per_s) : std::nullopt};
  };
  if (cold) return dram();
  for (std::size_t i = 0; i < levels.size(); ++i) {
    if (double(levels[i].capacity_bytes) < working_set_bytes) continue;
    std::string name = i + 1 == levels.size() ? "llc" : levels[i].level;
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return {name, levels[i].gbytes_per_s > 0 ? std::optional<double>(levels[i].gbytes_per_s) : std::nullopt};
  }
  if (!levels.empty() && working_set_bytes <= double(cold_span_bytes(levels.back().capacity_bytes))) {
    const double rate = levels.back().gbytes_per_s;
    return {"llc", rate > 0 ? std::optional<double>(rate) : std::nullopt};
  }
  return dram();
}

std::size_t cold_span_bytes(std::size_t last_level_bytes) {
  constexpr std::size_t kCap = std::size_t(1) << 30;
  return std::max(2 * last_level_bytes, std::min(16 * last_level_bytes, kCap));
}

}  // namespace lattn

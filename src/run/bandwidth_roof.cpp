#include "src/run/bandwidth_roof.hpp"

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
  return dram();
}

}  // namespace lattn

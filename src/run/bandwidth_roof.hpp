// Which bandwidth a memory-bound case is held against (docs/harness.md, "Cold and warm"): a cold
// case reads its inputs from DRAM, so its roof is the DRAM triad; a warm one finds them where the
// call before left them, so its roof is the smallest cache level its working set fits in, at that
// level's triad rate, or DRAM when it fits in none. The record's `bandwidth_roof` names the roof and
// its `bandwidth_fraction` is taken against it: a fraction above kAboveCeiling then means a roof was
// mismeasured or misnamed, and the record says so (`above_roof`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/results/device_info.hpp"

namespace lattn {

struct BandwidthRoof {
  std::string name;                    // "dram", or a cache level lowercased ("l1d", "l2"), "llc" for the last
  std::optional<double> gbytes_per_s;  // its measured rate; none where it was not measured
};

// `levels` smallest first (DeviceInfo::cache_roofs); `working_set_bytes`: what a call keeps touching.
BandwidthRoof bandwidth_roof(bool cold, double working_set_bytes, const std::vector<CacheRoof>& levels,
                             double dram_gbytes_per_s);

}  // namespace lattn

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

// The bytes that pass through between two touches of the same line for a call to find nothing of it
// in a last-level cache of `last_level_bytes`: sixteen times it, at most 1 GiB, at least twice it.
// Current last levels keep part of a working set that loops through them (thrash- and
// scan-resistant replacement, as RRIP policies are), so a 64 MiB state stepped again and again on
// a 32 MiB L3 (Zen 5) still found part of itself there; at sixteen times the cache a line comes
// back after the whole cache has turned over many times. A cold case passes this span between two
// calls (backends/cpu/cold.hpp); a warm working set within it is partly served by the last level.
std::size_t cold_span_bytes(std::size_t last_level_bytes);

// `levels` smallest first (DeviceInfo::cache_roofs); `working_set_bytes`: what a call keeps touching.
// A warm working set past every level but within the last level's cold span is held against the
// last level (named "llc"): part of it is served from there, and DRAM's rate would be passed.
BandwidthRoof bandwidth_roof(bool cold, double working_set_bytes, const std::vector<CacheRoof>& levels,
                             double dram_gbytes_per_s);

}  // namespace lattn

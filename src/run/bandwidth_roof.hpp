// Which bandwidth a memory-bound case is held against (docs/harness.md, "Cold and warm"): a cold
// case reads its inputs from DRAM, so its roof is the DRAM triad; a warm one finds them where the
// call before left them, so its roof is the rate the start-up bandwidth sweep
// (backends/cpu/roofline.hpp) measured at the case's own working set, interpolated between the
// sweep's sizes. Where a cache ends is where the sweep's rate falls, whatever sysfs says: a VM may
// report its host's whole L3 (480 MiB on one), where a triad over arrays of that size runs from
// DRAM and a warm 128 MiB state steps at twice the DRAM rate. The record's `bandwidth_roof` names
// the roof, and its `bandwidth_fraction` is taken against it: a fraction above kAboveCeiling then
// means a roof was mismeasured, and the record says so (`above_roof`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/results/device_info.hpp"

namespace lattn {

struct BandwidthRoof {
  std::string name;                    // "dram", or the sweep's level that holds the working set ("l1", "l2", ...)
  std::optional<double> gbytes_per_s;  // its rate; none where it was not measured
};

// How a sweep's levels are read off it (on its envelope, sweep_envelope). From a level's first size,
// the sizes that keep `keep` of its rate are its plateau, and the plateau's rate their median (a
// first size still on the fall from the level before reads above it); the level holds up to the
// working set at which the rate falls below `keep` of that median: its effective capacity,
// interpolated on the logarithm of the size. The next level starts once the rate stops falling, at
// the first size whose next step keeps at least `settled` of its rate. A level that holds to the
// sweep's end is the memory's, not a cache's; one whose capacity is under `min_span` times its
// first size is a step in a noisy fall, not a cache (real levels differ by 8x and more).
struct LevelRule {
  double keep = 0.8;
  double settled = 0.9;
  double min_span = 2.0;
};

// The sweep as a roof: at each size the best rate measured at that size or any larger one. A rate
// cannot rise with the working set, so a point below a larger one was a busy moment; the roof
// takes the larger (a roof errs high rather than flag a case that reached it).
std::vector<double> sweep_envelope(const std::vector<BandwidthPoint>& sweep);

// The cache levels a sweep (smallest size first, the DRAM triad last) shows, smallest first, named
// "L1", "L2", ... in that order; none where the rate never falls by 1 - keep before the end.
std::vector<CacheRoof> cache_levels_from_sweep(const std::vector<BandwidthPoint>& sweep, const LevelRule& rule = {});

// The envelope's rate at `working_set_bytes`, linear in the logarithm of the size between the two
// sweep sizes around it; the first size's rate below the sweep, the last's (DRAM) past it; none for
// an empty sweep.
std::optional<double> sweep_rate_at(const std::vector<BandwidthPoint>& sweep, double working_set_bytes);

// The bytes that pass through between two touches of the same line for a call to find nothing of it
// in a last-level cache of `last_level_bytes`: sixteen times it, at most 1 GiB, at least twice it.
// Current last levels keep part of a working set that loops through them (thrash- and
// scan-resistant replacement, as RRIP policies are), so a 64 MiB state stepped again and again on
// a 32 MiB L3 (Zen 5) still found part of itself there; at sixteen times the cache a line comes
// back after the whole cache has turned over many times. A cold case passes this span between two
// calls (backends/cpu/cold.hpp). The last level's size comes from sysfs
// (machine_last_level_cache_bytes): a VM that reports its host's whole L3 makes the span larger
// than it needs to be, and a cold case only rotates over more copies.
std::size_t cold_span_bytes(std::size_t last_level_bytes);

// `working_set_bytes`: what a call keeps touching. Cold: DRAM at `dram_gbytes_per_s`. Warm: the
// sweep's rate at the working set (sweep_rate_at), named after the smallest of `levels`
// (cache_levels_from_sweep) whose capacity holds it, or "dram" past them all; DRAM where there is
// no sweep.
BandwidthRoof bandwidth_roof(bool cold, double working_set_bytes, const std::vector<BandwidthPoint>& sweep,
                             const std::vector<CacheRoof>& levels, double dram_gbytes_per_s);

}  // namespace lattn

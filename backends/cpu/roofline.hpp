// The attainable rates of this machine that every CPU result is held against (docs/performance.md):
// OpenBLAS sgemm GFLOP/s, the FMA (and AMX) rates, a streaming (triad) memory bandwidth and the
// same triad's rate over working sets from 16 KiB to past the last cache (the bandwidth sweep),
// measured once per process with the run's threads, then cached.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "src/results/device_info.hpp"

namespace lattn {

struct Roofline {
  int threads = 0;
  int sgemm_n = 0;                  // each thread multiplies its own n x n matrices
  double sgemm_gflops = 0;          // all threads together, best of the products
  int sgemm_products = 0;           // how many products the start-up measurement took
  double sgemm_median_gflops = 0;   // their median: how far the machine's moments spread
  double sgemm_seconds = 0;         // how long it took
  std::size_t stream_bytes = 0;     // bytes one triad pass moves (2 arrays read, 1 written), all threads
  double stream_gbytes_per_s = 0;   // best of the repetitions
  double fma_gflops = 0;            // vector FMAs on registers only, all threads, best of 50; 0 without AVX2
  double amx_gflops = 0;            // tdpbf16ps on registers only, likewise; 0 without AMX-BF16 (kernels/cpu/amx.hpp)
  // The in-place triad over working sets from a few KiB to past the last cache (measure_bandwidth_sweep),
  // the DRAM triad above its last point: the roofs of warm cases, and how long it took.
  std::vector<BandwidthPoint> bandwidth_sweep;
  double sweep_seconds = 0;
  std::vector<CacheRoof> cache_levels;  // the levels the sweep shows (cache_levels_from_sweep)
  std::vector<CacheRoof> sysfs_caches;  // what sysfs says (sysfs_cache_levels), for comparison
};

// The largest cache of cpu0 in bytes (sysfs), 0 where the system does not say.
std::size_t last_level_cache_bytes();
// The last-level cache of the whole machine in bytes: cpu0's largest cache times the distinct copies
// of it (one per socket, or per CCD on AMD), from sysfs; kAssumedLastLevelCacheBytes where sysfs says
// nothing, which is more than any CPU's today so that a cold case errs on the cold side. A cold
// case (core/op.hpp, cache_axis) rotates over more than twice this, or evicts it.
constexpr std::size_t kAssumedLastLevelCacheBytes = std::size_t(512) << 20;
std::size_t machine_last_level_cache_bytes();

// The data cache levels of cpu0 as sysfs reports them, with the bytes `threads` threads hold in each
// together (a private level's per-core size times the threads; the last level's size as it is),
// smallest first, no rates; empty where sysfs says nothing. Recorded beside the sweep's levels, and
// not used for any roof: a VM may report its host's whole L3, or none.
std::vector<CacheRoof> sysfs_cache_levels(int threads);

// The start-up bandwidth sweep's working sets (all threads' arrays together): from 16 KiB (at least
// 8 KiB a thread) up to, not including, `end_bytes`, in steps of 2^(1/3), each a whole number of
// 64-byte lines per array and thread.
std::vector<std::size_t> bandwidth_sweep_sizes(int threads, std::size_t end_bytes);

// Whether the sweep has reached the memory's rate, so that its larger sizes would only repeat the
// DRAM triad: its last two rates each within 1.25 times `dram_gbytes_per_s`, at `min_bytes` or
// more (the start-up sweep: an eighth of the DRAM triad's working set, twice the last-level cache
// sysfs names, so that a busy moment inside a cache does not end it there).
bool sweep_reached_dram(const std::vector<BandwidthPoint>& points, double dram_gbytes_per_s, std::size_t min_bytes);

// Elements of each of the in-place triad's two float arrays: together eight times the last-level
// cache, so that a pass streams from memory with (almost) nothing left in the cache from the pass
// before, between 8 and 256 MiB per array (256 MiB when the cache size is unknown). The arrays are
// freed once measured; a fixed 3 x 128 MiB once made a one-case run of a few KiB peak at 400 MB.
std::size_t triad_elems_for_cache(std::size_t llc_bytes);

// Measures on the first call (one to three seconds), returns the cached figures after. `threads`
// is the OpenMP thread count of the run; OpenBLAS stays single-threaded inside each thread.
const Roofline& cpu_roofline(int threads);

// When the start-up sgemm has seen enough (`product_seconds`: each product's wall time, in order;
// `elapsed_seconds`: since the first): at least `min_products` products over at least
// `min_seconds`, and then the last quarter of them (at least 25) bettered the best of those before
// by under 1%; or `max_seconds` have passed. On a shared host a fixed 0.2 s window can fall wholly
// in a busy stretch (one run here read 157 GFLOP/s against ~300 minutes apart, and its cases then
// read above the peak); waiting until the best stops improving keeps looking while it still moves.
struct PeakRule {
  int min_products = 100;
  double min_seconds = 0.5;
  double max_seconds = 2.5;
};
bool sgemm_peak_settled(const std::vector<double>& product_seconds, double elapsed_seconds, const PeakRule& rule);

// A short re-measurement of the same sgemm rate: the best of `products` products (each ~2 ms at
// n = 512). The runner takes one on each side of a case so that a record's rate can also be held
// against the peak of the same seconds: on a shared host the attainable rate moves by tens of
// percent from one minute to the next, and the start-up best-of-100 is its quietest moment.
double cpu_sgemm_check(int threads, int products);
// The start-up triad again (the same arrays' size, best of 4 passes): the DRAM rate now.
double cpu_stream_check(int threads);

}  // namespace lattn

// Why this shape of measurement: the kernels call single-threaded OpenBLAS from inside an OpenMP
// loop (one level of threading), so the peak they can reach is what `threads` OpenMP threads each
// running their own sgemm reach together, not what OpenBLAS's own thread pool reaches (whose
// spinning workers would also linger into the first cases). n = 512 per thread is past the size
// where OpenBLAS's packing overhead matters (n = 256 and 1024 ran at the same rate on one core
// here) and its three matrices (3 MiB) do not fit in L2; one product takes ~2 ms, and the best of
// many finds windows where no other job held either core: a best of 4 over 1024^3 products came
// out 30% low under load, a best of 30 still read 210 instead of ~300 GFLOP/s once on an idle
// two-core VM, and a best of 100 (0.2 s) read 157 once; the start-up measurement now runs until
// its best settles (sgemm_peak_settled).
// The DRAM bandwidth is a triad in place, a = a + s b, over two arrays together eight times the
// last-level cache (a last level that resists thrashing keeps part of a smaller loop), counted as
// the 3 words per element it moves: a and b read, a written back. STREAM's a = b + s c moves a
// fourth (the write-allocate read of a) that it does not count, which made its rate 3/4 of what
// the memory moves and an in-place kernel's fraction of it read up to 4/3.
// Below DRAM, the same in-place triad runs on each thread's own two arrays over working sets from
// 16 KiB to past the last cache (the bandwidth sweep): a warm case is held against the sweep's rate
// at its own working set, and the sweep's falls say where each cache ends (docs/harness.md, "Cold
// and warm"). Sysfs's sizes are not trusted for this: a VM may report its host's whole L3 (480 MiB
// on one), and a triad over arrays of that size runs from DRAM while a warm 128 MiB state steps at
// twice the DRAM rate.
// The FMA rate (registers only) is the compute ceiling beside them: sgemm at ~0.9 of it is
// OpenBLAS at its best, and two runs whose FMA rates differ ran on different CPUs, whatever
// their model names say.
#include "backends/cpu/roofline.hpp"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/amx.hpp"
#include "src/run/bandwidth_roof.hpp"

namespace lattn {
namespace {

constexpr int kSgemmN = 512;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Per product of all threads together: wall seconds, in product order, until
// done(times, seconds since the first product) says so.
template <class Done>
std::vector<double> sgemm_times(int threads, int n, Done&& done) {
  std::vector<double> times;
  bool stop = false;
  std::chrono::steady_clock::time_point first;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = float(i % 7) * 0.25f;
      b[i] = float(i % 5) * 0.5f;
    }
    for (int r = -1; !stop; ++r) {  // r = -1: warm-up
      std::chrono::steady_clock::time_point start;
#pragma omp barrier
#pragma omp master
      {
        start = std::chrono::steady_clock::now();
        if (r == 0) first = start;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                  c.data(), n);
#pragma omp barrier
#pragma omp master
      if (r >= 0) {
        times.push_back(seconds_since(start));
        stop = done(times, seconds_since(first));
      }
#pragma omp barrier
    }
  }
  return times;
}

double sgemm_rate(int threads, int n, double seconds) { return 2.0 * n * n * n * threads / seconds * 1e-9; }

double measure_sgemm(int threads, int n, int reps) {
  const std::vector<double> times =
      sgemm_times(threads, n, [reps](const std::vector<double>& t, double) { return int(t.size()) >= reps; });
  return sgemm_rate(threads, n, *std::min_element(times.begin(), times.end()));
}

double measure_triad(int threads, std::size_t elems, int reps) {
  std::vector<float> a(elems), b(elems);
  double best = 1e30;
  const long n = long(elems);
#pragma omp parallel num_threads(threads)
  {
    // First touch by the thread that streams the same range later.
#pragma omp for schedule(static)
    for (long i = 0; i < n; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
    }
    for (int r = -1; r < reps; ++r) {
      std::chrono::steady_clock::time_point start;
#pragma omp master
      start = std::chrono::steady_clock::now();
      // In place: a's lines are read before they are written, so the three words counted per
      // element are the three the memory moves (a = b + s c would also read a's lines first).
#pragma omp for schedule(static)
      for (long i = 0; i < n; ++i) a[i] = a[i] + 0.5f * b[i];
#pragma omp master
      if (r >= 0) best = std::min(best, seconds_since(start));
    }
  }
  return 3.0 * sizeof(float) * elems / best * 1e-9;
}

// The sweep (bandwidth_sweep_sizes up to `end_bytes`): at each working set, each thread streams its
// own two arrays in place (a = a + 0.5 b, three words counted per element, as the DRAM triad), one
// untimed pass to bring them in, one timed pass that sets how many passes make a timing of about
// 1 ms, then the best of the timings: all threads' bytes over the time from the barrier
// before to the barrier after. It stops once sweep_reached_dram says the rate is the memory's
// past an eighth of `end_bytes`.
// The arrays are made once at the largest size and first touched as the sizes grow.
std::vector<BandwidthPoint> measure_bandwidth_sweep(int threads, std::size_t end_bytes, double dram_gbytes_per_s) {
  const std::vector<std::size_t> sizes = bandwidth_sweep_sizes(threads, end_bytes);
  std::vector<BandwidthPoint> points;
  if (sizes.empty()) return points;
  const std::size_t per_thread = 2 * sizeof(float) * std::size_t(threads);  // bytes per element index, all threads
  constexpr double kTimingSeconds = 1e-3;
  int passes = 1;
  bool stop = false;
  double best = 0;
#pragma omp parallel num_threads(threads)
  {
    const std::size_t capacity = sizes.back() / per_thread;
    std::unique_ptr<float[]> a(new float[capacity]), b(new float[capacity]);
    float* pa = a.get();
    const float* pb = b.get();
    std::size_t touched = 0;
    for (std::size_t size : sizes) {
      const std::size_t elems = size / per_thread;
      if (touched < elems) {  // zeros and ones: no denormals, no overflow over any number of passes
        std::fill(a.get() + touched, a.get() + elems, 0.0f);
        std::fill(b.get() + touched, b.get() + elems, 1.0f);
        touched = elems;
      }
      // Round -1: untimed; 0: one pass, timed, which sets `passes`; then the timings: three of
      // about 1 ms, or one more of one pass where a pass takes that long already (the largest
      // sizes are the memory's, whose best the DRAM triad beyond them takes over 8 passes).
      int last = 3;
      for (int r = -1; r <= last; ++r) {
        std::chrono::steady_clock::time_point start;
        const int n = r <= 0 ? 1 : passes;
#pragma omp barrier
#pragma omp master
        start = std::chrono::steady_clock::now();
        for (int pass = 0; pass < n; ++pass) {
          for (std::size_t i = 0; i < elems; ++i) pa[i] = pa[i] + 0.5f * pb[i];
          asm volatile("" : : "r"(pa) : "memory");  // each pass is done, not folded into the last
        }
#pragma omp barrier
#pragma omp master
        {
          const double seconds = seconds_since(start);
          if (r == 0) {
            passes = int(std::clamp(std::ceil(kTimingSeconds / std::max(seconds, 1e-9)), 1.0, 65536.0));
            best = seconds;
          } else if (r > 0) {
            best = std::min(best, seconds / n);
          }
        }
#pragma omp barrier
        if (r == 0 && passes == 1) last = 1;
      }
#pragma omp master
      {
        points.push_back({elems * per_thread, 3.0 * sizeof(float) * double(elems) * threads / best * 1e-9});
        stop = sweep_reached_dram(points, dram_gbytes_per_s, end_bytes / 8);
      }
#pragma omp barrier
      if (stop) break;
    }
  }
  return points;
}

// The FMA units' rate with nothing but registers in play: 12 independent accumulators (more than
// latency x throughput on current x86 cores) of the widest vector this build compiles for.
#if defined(__AVX512F__)
using FmaVec = __m512;
inline FmaVec fma_set1(float x) { return _mm512_set1_ps(x); }
inline FmaVec fma_madd(FmaVec a, FmaVec b, FmaVec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
using FmaVec = __m256;
inline FmaVec fma_set1(float x) { return _mm256_set1_ps(x); }
inline FmaVec fma_madd(FmaVec a, FmaVec b, FmaVec c) { return _mm256_fmadd_ps(a, b, c); }
#endif

#if defined(__AVX2__) && defined(__FMA__)
constexpr int kFmaLanes = int(sizeof(FmaVec) / sizeof(float));

// Seconds one thread takes for `iters` rounds of 12 vector FMAs. Optimised whatever the build's
// level: at -O1 (the sanitizer build) GCC stores the accumulators to the stack every round.
#if defined(__GNUC__) && !defined(__clang__)
#define LATTN_OPTIMISED [[gnu::optimize("O2")]]
#else
#define LATTN_OPTIMISED
#endif
LATTN_OPTIMISED double fma_loop_seconds(long iters) {
#define LATTN_ACCUMULATORS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define LATTN_DECLARE(i) FmaVec acc##i = fma_set1(float(i) * 1e-3f);
#define LATTN_FMA(i) acc##i = fma_madd(acc##i, b, c);
  LATTN_ACCUMULATORS(LATTN_DECLARE)
  const FmaVec b = fma_set1(0.9999f), c = fma_set1(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (long k = 0; k < iters; ++k) {
    LATTN_ACCUMULATORS(LATTN_FMA)
    // Volatile uses of every accumulator: the loop cannot be folded away, and they stay in registers.
    asm volatile("" : "+v"(acc0), "+v"(acc1), "+v"(acc2), "+v"(acc3), "+v"(acc4), "+v"(acc5));
    asm volatile("" : "+v"(acc6), "+v"(acc7), "+v"(acc8), "+v"(acc9), "+v"(acc10), "+v"(acc11));
  }
  const double seconds = seconds_since(start);
#undef LATTN_ACCUMULATORS
#undef LATTN_DECLARE
#undef LATTN_FMA
#undef LATTN_OPTIMISED
  return seconds;
}

// All threads together, best of `reps` rounds of ~2 ms each: per round, all threads' FMAs over the
// slowest thread's own loop time, as the sgemm peak counts (the barriers' wake-ups left out: on a
// loaded machine they take milliseconds).
double measure_fma(int threads, int reps) {
  constexpr long kIters = 600000;  // 7.2M FMAs per thread and round, ~2 ms at one a cycle
  std::vector<double> slowest(std::size_t(reps + 1), 0.0);
  std::mutex mutex;
#pragma omp parallel num_threads(threads)
  for (int r = 0; r <= reps; ++r) {  // round 0: warm-up (the vector units may start slow)
#pragma omp barrier
    const double seconds = fma_loop_seconds(kIters);
    const std::lock_guard<std::mutex> lock(mutex);
    slowest[std::size_t(r)] = std::max(slowest[std::size_t(r)], seconds);
  }
  const double best = *std::min_element(slowest.begin() + 1, slowest.end());
  return 2.0 * kFmaLanes * 12 * kIters * threads / best * 1e-9;
}
#else
double measure_fma(int, int) { return 0.0; }
#endif

}  // namespace

std::size_t last_level_cache_bytes() {
  std::size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream size_file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string size;
    if (!(size_file >> size) || size.empty()) continue;
    std::size_t bytes = std::size_t(std::atol(size.c_str())) * 1024;  // "32768K"
    if (size.back() == 'M') bytes *= 1024;
    largest = std::max(largest, bytes);
  }
  return largest;
}

namespace {

struct SysCache {
  int level = 0;
  std::string type, shared_cpus;
  std::size_t bytes = 0;
};

std::optional<SysCache> sys_cache(int cpu, int index) {
  const std::string dir =
      "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(index) + "/";
  std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size"),
      shared_file(dir + "shared_cpu_list");
  SysCache c;
  std::string size;
  if (!(level_file >> c.level) || !(type_file >> c.type) || !(size_file >> size) || size.empty()) return std::nullopt;
  c.bytes = std::size_t(std::atol(size.c_str())) * 1024;  // "32768K"
  if (size.back() == 'M') c.bytes *= 1024;
  shared_file >> c.shared_cpus;
  return c;
}

}  // namespace

std::size_t machine_last_level_cache_bytes() {
  int top_level = 0;
  std::size_t top_bytes = 0;
  for (int index = 0; index < 8; ++index)
    if (const auto c = sys_cache(0, index); c && c->type != "Instruction" && c->level >= top_level) {
      top_level = c->level;
      top_bytes = c->bytes;
    }
  if (top_bytes == 0) return kAssumedLastLevelCacheBytes;
  // The distinct copies of the last level: each CPU's names the CPUs that share it.
  std::set<std::string> copies;
  for (int cpu = 0; std::filesystem::exists("/sys/devices/system/cpu/cpu" + std::to_string(cpu)); ++cpu)
    for (int index = 0; index < 8; ++index)
      if (const auto c = sys_cache(cpu, index); c && c->level == top_level && c->type != "Instruction")
        copies.insert(c->shared_cpus);
  return top_bytes * std::max<std::size_t>(1, copies.size());
}

std::vector<CacheRoof> sysfs_cache_levels(int threads) {
  std::vector<SysCache> data;
  for (int index = 0; index < 8; ++index)
    if (const auto c = sys_cache(0, index); c && c->type != "Instruction") data.push_back(*c);
  std::sort(data.begin(), data.end(), [](const SysCache& a, const SysCache& b) { return a.level < b.level; });
  std::vector<CacheRoof> levels;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const bool last = i + 1 == data.size();
    CacheRoof level;
    level.level = "L" + std::to_string(data[i].level) + (data[i].type == "Data" ? "d" : "");
    level.capacity_bytes = last ? data[i].bytes : data[i].bytes * std::size_t(std::max(threads, 1));
    levels.push_back(level);
  }
  return levels;
}

std::vector<std::size_t> bandwidth_sweep_sizes(int threads, std::size_t end_bytes) {
  const std::size_t thread_count = std::size_t(std::max(threads, 1));
  const std::size_t line_set = std::size_t(2 * 64) * thread_count;  // a line per array and thread
  const double first = double(std::max<std::size_t>(std::size_t(16) << 10, (std::size_t(8) << 10) * thread_count));
  std::vector<std::size_t> sizes;
  for (int step = 0;; ++step) {
    const double target = first * std::exp2(step / 3.0);
    const std::size_t size = std::max<std::size_t>(1, std::size_t(std::llround(target / double(line_set)))) * line_set;
    if (size >= end_bytes) break;
    if (sizes.empty() || size > sizes.back()) sizes.push_back(size);
  }
  return sizes;
}

bool sweep_reached_dram(const std::vector<BandwidthPoint>& points, double dram_gbytes_per_s, std::size_t min_bytes) {
  constexpr std::size_t kPoints = 2;
  if (dram_gbytes_per_s <= 0 || points.size() < kPoints || points.back().bytes < min_bytes) return false;
  return std::all_of(points.end() - long(kPoints), points.end(),
                     [&](const BandwidthPoint& p) { return p.gbytes_per_s <= 1.25 * dram_gbytes_per_s; });
}

std::size_t triad_elems_for_cache(std::size_t llc_bytes) {
  constexpr std::size_t kMinElems = std::size_t(1) << 21, kMaxElems = std::size_t(1) << 26;  // 8 and 256 MiB
  if (llc_bytes == 0) return kMaxElems;
  return std::clamp(8 * llc_bytes / (2 * sizeof(float)), kMinElems, kMaxElems);
}

bool sgemm_peak_settled(const std::vector<double>& product_seconds, double elapsed_seconds, const PeakRule& rule) {
  if (elapsed_seconds >= rule.max_seconds) return true;
  const std::size_t count = product_seconds.size();
  if (int(count) < rule.min_products || elapsed_seconds < rule.min_seconds) return false;
  const std::size_t recent = std::max<std::size_t>(25, count / 4);
  if (recent >= count) return false;
  const auto split = product_seconds.end() - long(recent);
  const double before = *std::min_element(product_seconds.begin(), split);
  const double lately = *std::min_element(split, product_seconds.end());
  return lately > before / 1.01;  // the recent best is not 1% faster than the earlier best
}

const Roofline& cpu_roofline(int threads) {
  static std::once_flag once;
  static Roofline roofline;
  std::call_once(once, [&] {
    const std::size_t triad_elems = triad_elems_for_cache(last_level_cache_bytes());
    openblas_set_num_threads(1);
    roofline.threads = threads;
    roofline.sgemm_n = kSgemmN;
    const auto start = std::chrono::steady_clock::now();
    std::vector<double> times = sgemm_times(threads, kSgemmN, [](const std::vector<double>& t, double elapsed) {
      return sgemm_peak_settled(t, elapsed, PeakRule{});
    });
    roofline.sgemm_seconds = seconds_since(start);
    roofline.sgemm_products = int(times.size());
    std::sort(times.begin(), times.end());
    roofline.sgemm_gflops = sgemm_rate(threads, kSgemmN, times.front());
    roofline.sgemm_median_gflops = sgemm_rate(threads, kSgemmN, times[times.size() / 2]);
    roofline.stream_bytes = 3 * sizeof(float) * triad_elems;
    roofline.stream_gbytes_per_s = measure_triad(threads, triad_elems, 8);
    roofline.fma_gflops = measure_fma(threads, 50);
    roofline.amx_gflops = cpu::amx::measure_amx_gflops(threads, 50).value_or(0.0);
    // The sweep up to the DRAM triad's working set, that triad its last point: a warm case past
    // every size the sweep took is held against the memory's rate.
    const std::size_t dram_working_set = 2 * sizeof(float) * triad_elems;
    const auto sweep_start = std::chrono::steady_clock::now();
    roofline.bandwidth_sweep = measure_bandwidth_sweep(threads, dram_working_set, roofline.stream_gbytes_per_s);
    roofline.sweep_seconds = seconds_since(sweep_start);
    roofline.bandwidth_sweep.push_back({dram_working_set, roofline.stream_gbytes_per_s});
    roofline.cache_levels = cache_levels_from_sweep(roofline.bandwidth_sweep);
    roofline.sysfs_caches = sysfs_cache_levels(threads);
  });
  return roofline;
}

double cpu_stream_check(int threads) { return measure_triad(threads, triad_elems_for_cache(last_level_cache_bytes()), 4); }

double cpu_sgemm_check(int threads, int products) {
  openblas_set_num_threads(1);
  return measure_sgemm(threads, kSgemmN, products);
}

}  // namespace lattn

// The `device` block of a result file as typed data: what ran the cases (host, build, backend,
// device) and the rates every record is held against. Backends fill it; src/results/record_json.cpp makes
// it JSON (docs/results.md lists the keys).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lattn {

// What every backend shares: the host and the build.
struct HostInfo {
  std::string cpu_model;
  unsigned cpu_cores = 0;
  int threads = 0;
  std::string hostname, os, compiler, build_type, cxx_flags, version, git_revision;
  bool git_dirty = false;
  // "<vendor> family F model M stepping S": a hypervisor may report one model name for several
  // CPU generations, and the signature tells them apart. Empty where the CPU has none.
  std::string cpu_signature;
  std::optional<double> cpu_mhz;
  std::map<std::string, long> cache_kib;  // "L1d", "L2", ... of cpu0
  bool cpu_scaling_enabled = false;       // a core's frequency governor is not "performance"
  std::vector<double> load_avg;           // 1, 5, 15 minutes, when the run started
};

// The runtime choices the CPU kernels ran with (kernels/cpu/tuning.hpp) and where they came from
// (backends/cpu/tuning.hpp): the device block's `tuning`.
struct TuningInfo {
  std::string source;        // "shipped", "calibrated", "exhaustive", "cached" or "default"
  std::string vector_width;  // the width the choices are for
  std::optional<std::string> microarchitecture;  // shipped: the table's entry
  struct Choice {
    std::string kernel, name;
    int value = 0;
    std::string label;  // a structural choice's name for its value ("packed", "blas"); empty: the number
  };
  std::vector<Choice> choices;
  // --tuning exhaustive (backends/cpu/tuning.hpp): per kernel, every combination of its choices
  // timed on the suites' shapes, the quick calibration's plan among them and the best.
  struct PlanGap {
    std::string kernel;      // the choices' group ("scan", "layer", "chunked")
    int combinations = 0;    // how many were timed
    double quick_ms = 0;     // the quick plan's time on the group's shapes
    double best_ms = 0;      // the best combination's
    std::vector<Choice> best;  // the best combination's values (the group's choices)
  };
  std::vector<PlanGap> exhaustive;
  std::optional<double> exhaustive_s;  // how long the search took
  std::optional<std::string> cache;     // the cache file read or written
  std::optional<double> calibration_s;  // how long the calibration took (this run's, or the cached one's)
  std::optional<std::string> note;      // why a cache was not used or not written
};

// One point of the start-up bandwidth sweep (backends/cpu/roofline.hpp): the in-place triad over a
// working set of `bytes` (all threads' arrays together) and the rate it reached there.
struct BandwidthPoint {
  std::size_t bytes = 0;
  double gbytes_per_s = 0;
};

// A cache level as a bandwidth roof. From the sweep (src/run/bandwidth_roof.hpp, cache_levels_from_sweep):
// the working set up to which the rate keeps most of its plateau, and that plateau. As sysfs names
// it (for comparison only): what the run's threads hold in it together, with no rate.
struct CacheRoof {
  std::string level;            // sweep: "L1", "L2", ... in the order found; sysfs: "L1d", "L2", "L3"
  std::size_t capacity_bytes = 0;
  double gbytes_per_s = 0;
};

// The CPU backend: its BLAS, threading environment, vector width, and the roofline it measured at
// start-up (backends/cpu/roofline.hpp).
struct CpuDeviceInfo {
  std::string blas, blas_version, blas_core;
  int blas_threads_inside_kernels = 1;
  std::optional<std::string> blas_coretype_env, blas_core_detected;
  std::string omp_wait_policy;
  std::optional<std::string> gomp_spincount, env_set_by_lattnbench;
  std::string scan_vector_width;
  double sgemm_gflops = 0;  // what the BLAS reaches here: every record's blas_fraction is taken against it
  int sgemm_n = 0, sgemm_threads = 0, sgemm_products = 0;
  double sgemm_median_gflops = 0, sgemm_seconds = 0;
  double stream_gbytes_per_s = 0;
  std::size_t stream_bytes = 0;
  // The triad over working sets from a few KiB to past the last cache, smallest first, the start-up
  // DRAM triad its last point: a warm case is held against its rate at the case's working set.
  std::vector<BandwidthPoint> bandwidth_sweep;
  double bandwidth_sweep_seconds = 0;
  std::vector<CacheRoof> cache_roofs;   // the levels the sweep shows, smallest first
  std::vector<CacheRoof> sysfs_caches;  // the data cache levels sysfs reports, smallest first
  std::optional<double> fma_gflops;
  // tdpbf16ps on registers only (kernels/cpu/amx.hpp), where the CPU has AMX-BF16: the ceiling of
  // the bf16 cases an AMX variant runs.
  std::optional<double> amx_gflops;
  // The packed products (kernels/cpu/packed_gemm.hpp) on sgemm's products, where they have a vector
  // kernel here, and the products the hybrid layer ran: "openblas" or "packed_<micro-kernel>".
  std::string layer_products;
  std::optional<TuningInfo> tuning;
};

struct GpuInfo {
  int device_index = 0;
  std::string name, compute_capability;
  int sm_count = 0, memory_bus_width_bits = 0;
  double memory_gb = 0, l2_cache_mb = 0, shared_memory_per_block_optin_kb = 0;
  std::optional<double> sm_clock_mhz, memory_clock_mhz;
};

// The compute ceiling every record's peak_fraction is taken against: the larger of the measured FMA
// rate and the measured sgemm. The FMA rate is the hardware's; sgemm can sit far below it where the
// BLAS runs a narrower kernel than the CPU has (Debian's OpenBLAS runs its Haswell AVX2 sgemm on
// AMD Zen 4 and Zen 5: about half of Zen 5's AVX-512 FMA rate), and a kernel of this project that
// uses the wider vectors then beats "the peak". sgemm stands in where no FMA rate was measured, or where
// a busy moment during the FMA loop left it below sgemm.
struct ComputeCeiling {
  double gflops = 0;
  std::string source;  // "fma" or "sgemm"; empty when neither was measured
};
inline ComputeCeiling compute_ceiling(std::optional<double> fma_gflops, double sgemm_gflops) {
  const double fma = fma_gflops.value_or(0.0);
  if (fma <= 0 && sgemm_gflops <= 0) return {};
  return fma >= sgemm_gflops ? ComputeCeiling{fma, "fma"} : ComputeCeiling{sgemm_gflops, "sgemm"};
}

// The CUDA backend: the build's targets and toolchain, the driver, and the GPU when there is one.
struct CudaDeviceInfo {
  std::string cuda_targets, nvcc;
  std::optional<std::string> cuda_runtime, driver_cuda_version, driver;
  std::optional<std::string> unavailable;  // why no GPU is usable
  std::optional<GpuInfo> gpu;
};

struct TimerInfo {
  double resolution_ns = 0;  // smallest non-zero step seen between two readings
  double overhead_ns = 0;    // mean cost of one reading
};

// The embedded Python interpreter, when a Python plugin was loaded (src/plugins/python_plugin.hpp).
struct PythonInfo {
  std::string version;     // sys.version's first word
  std::string executable;  // the interpreter whose sys.path the plugins were loaded with
  double bridge_call_us = 0;  // the median cost of one call of an empty impl through the bridge
  int bridge_calls = 0;       // calls per batch behind that median
};

struct DeviceInfo {
  std::string backend;
  HostInfo host;
  std::optional<CpuDeviceInfo> cpu;
  std::optional<CudaDeviceInfo> cuda;
  std::optional<TimerInfo> timer;  // the runner's clock
  std::optional<PythonInfo> python;

  // The rates records are held against; 0 where the backend measured none.
  ComputeCeiling ceiling() const { return cpu ? compute_ceiling(cpu->fma_gflops, cpu->sgemm_gflops) : ComputeCeiling{}; }
  double peak_gflops() const { return ceiling().gflops; }
  // A record's ceiling: the AMX rate for a bf16 case whose variant runs on AMX tiles (its name
  // begins with an AMX row's, "chunked_amx", or is a bf16 layer's, "products amx"), where it was
  // measured; peak_gflops() otherwise.
  double peak_gflops_for(const std::string& dtype, const std::string& variant) const {
    if (cpu && cpu->amx_gflops && dtype == "bf16" &&
        (variant.rfind("chunked_amx", 0) == 0 || variant.rfind("products amx", 0) == 0))
      return *cpu->amx_gflops;
    return peak_gflops();
  }
  double blas_gflops() const { return cpu ? cpu->sgemm_gflops : 0.0; }
  double sgemm_median_gflops() const { return cpu ? cpu->sgemm_median_gflops : 0.0; }
  double stream_gbytes_per_s() const { return cpu ? cpu->stream_gbytes_per_s : 0.0; }
  std::vector<CacheRoof> cache_roofs() const { return cpu ? cpu->cache_roofs : std::vector<CacheRoof>{}; }
  std::vector<BandwidthPoint> bandwidth_sweep() const {
    return cpu ? cpu->bandwidth_sweep : std::vector<BandwidthPoint>{};
  }
};

}  // namespace lattn

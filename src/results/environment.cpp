#include "src/results/environment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace lattn {

TimerInfo measure_steady_clock() {
  using clock = std::chrono::steady_clock;
  TimerInfo info;
  constexpr int kReadings = 20000;
  const auto start = clock::now();
  auto last = start;
  double smallest = 1e18;
  for (int i = 0; i < kReadings; ++i) {
    const auto now = clock::now();
    const double step = std::chrono::duration<double, std::nano>(now - last).count();
    if (step > 0) smallest = std::min(smallest, step);
    last = now;
  }
  info.overhead_ns = std::chrono::duration<double, std::nano>(last - start).count() / kReadings;
  info.resolution_ns = smallest < 1e18 ? smallest : 0.0;
  return info;
}

std::vector<std::string> environment_warnings(const std::string& build_type) {
  std::vector<std::string> warnings;
  if (build_type != "Release")
    warnings.push_back("lattnbench was built as '" + build_type + "', not Release: timings are not representative");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (const auto g = frequency_scaling())
    warnings.push_back("CPU frequency scaling is on (cpu" + std::to_string(g->cpu) + " governor '" + g->name +
                       "'): timings may vary; set the governor to 'performance'");
  double load[1] = {0};
  if (getloadavg(load, 1) == 1 && load[0] > 0.5 * cores)
    warnings.push_back(fmt::format("the machine is loaded (1-minute load average {:.2f} on {} cores): timings may be noisy",
                                   load[0], cores));
  return warnings;
}

std::optional<ScalingGovernor> frequency_scaling() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned cpu = 0; cpu < cores; ++cpu) {
    std::ifstream governor(fmt::format("/sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor", cpu));
    std::string name;
    if (governor >> name && name != "performance") return ScalingGovernor{cpu, name};
  }
  return std::nullopt;
}

std::vector<double> load_averages() {
  double load[3] = {0, 0, 0};
  const int n = getloadavg(load, 3);
  return n > 0 ? std::vector<double>(load, load + n) : std::vector<double>{};
}

namespace {
std::size_t meminfo_bytes(const std::string& wanted) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == wanted) return kib * 1024;
  return std::size_t(-1);
}
}  // namespace

std::size_t available_host_memory() { return meminfo_bytes("MemAvailable:"); }
std::size_t total_host_memory() { return meminfo_bytes("MemTotal:"); }

}  // namespace lattn

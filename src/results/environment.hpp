// What can make numbers untrustworthy, measured or read at start-up: the timer's resolution and
// overhead, and the warnings google/benchmark gives (debug build, frequency scaling, a loaded
// machine).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "src/results/device_info.hpp"

namespace lattn {

TimerInfo measure_steady_clock();

// A CPU whose frequency governor is not "performance": (cpu, governor), or nothing (all are, or
// the machine does not say).
struct ScalingGovernor {
  unsigned cpu = 0;
  std::string name;
};
std::optional<ScalingGovernor> frequency_scaling();

// The 1, 5 and 15-minute load averages (empty where the system does not give them).
std::vector<double> load_averages();

// Warnings for this run: build type not Release, CPU frequency scaling not pinned, load average
// over half the cores.
std::vector<std::string> environment_warnings(const std::string& build_type);

// Host memory available for new allocations (MemAvailable), in bytes.
std::size_t available_host_memory();
// The host's physical memory (MemTotal), in bytes.
std::size_t total_host_memory();

}  // namespace lattn

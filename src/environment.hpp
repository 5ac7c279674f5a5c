// What can make numbers untrustworthy, measured or read at start-up: the timer's resolution and
// overhead, and the warnings google/benchmark gives (debug build, frequency scaling, a loaded
// machine).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace lattn {

struct TimerInfo {
  double resolution_ns = 0;  // smallest non-zero step seen between two readings
  double overhead_ns = 0;    // mean cost of one reading
};

TimerInfo measure_steady_clock();
nlohmann::json to_json(const TimerInfo& timer);

// Warnings for this run: build type not Release, CPU frequency scaling not pinned, load average
// over half the cores.
std::vector<std::string> environment_warnings(const std::string& build_type);

// Host memory available for new allocations (MemAvailable), in bytes.
std::size_t available_host_memory();

}  // namespace lattn

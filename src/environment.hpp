// What can make numbers untrustworthy, measured or read at start-up: the timer's resolution and
// overhead, and the warnings google/benchmark gives (debug build, frequency scaling, a loaded
// machine).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "device_info.hpp"

namespace lattn {

TimerInfo measure_steady_clock();

// Warnings for this run: build type not Release, CPU frequency scaling not pinned, load average
// over half the cores.
std::vector<std::string> environment_warnings(const std::string& build_type);

// Host memory available for new allocations (MemAvailable), in bytes.
std::size_t available_host_memory();

}  // namespace lattn

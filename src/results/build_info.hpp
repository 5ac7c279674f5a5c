// What built and runs lattnbench: the part of the `device` block every backend shares.
#pragma once

#include <string>

#include "src/results/device_info.hpp"

namespace lattn {

extern const char* const kVersion;      // project version (CMake)
extern const char* const kGitRevision;  // at build time, "unknown" outside a checkout
extern const bool kGitDirty;

std::string cpu_model();
// "<vendor> family F model M stepping S" from /proc/cpuinfo (x86), or "" where it has none.
std::string cpu_signature();
HostInfo host_info(int threads);

}  // namespace lattn

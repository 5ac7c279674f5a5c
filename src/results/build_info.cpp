#include "src/results/build_info.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "src/results/environment.hpp"

namespace lattn {

const char* const kVersion = LATTN_VERSION;

namespace {

// The value of the first "key<spaces>: value" line of /proc/cpuinfo for `key`, or "".
std::string cpuinfo_field(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.compare(0, key.size(), key) != 0) continue;
    if (line.find_first_not_of(" \t", key.size()) != colon) continue;  // "model" is not "model name"
    const auto value = line.find_first_not_of(' ', colon + 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

// KiB per cache level of cpu0 ("L1d", "L1i", "L2", "L3"), from sysfs; empty where it is not there.
std::map<std::string, long> cache_kib() {
  std::map<std::string, long> caches;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size) || size.empty()) continue;
    long kib = std::atol(size.c_str());
    if (size.back() == 'M') kib *= 1024;
    const std::string suffix = type == "Data" ? "d" : type == "Instruction" ? "i" : "";
    caches["L" + std::to_string(level) + suffix] = kib;
  }
  return caches;
}

}  // namespace

std::string cpu_model() {
  const std::string name = cpuinfo_field("model name");
  return name.empty() ? "unknown" : name;
}

std::string cpu_signature() {
  const std::string vendor = cpuinfo_field("vendor_id"), family = cpuinfo_field("cpu family"),
                    model = cpuinfo_field("model"), stepping = cpuinfo_field("stepping");
  if (vendor.empty() || family.empty() || model.empty()) return "";
  return vendor + " family " + family + " model " + model + (stepping.empty() ? "" : " stepping " + stepping);
}

HostInfo host_info(int threads) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  utsname uts{};
  uname(&uts);
  HostInfo info;
  info.cpu_model = cpu_model();
  info.cpu_cores = std::thread::hardware_concurrency();
  info.threads = threads;
  info.hostname = host;
  info.os = std::string(uts.sysname) + " " + uts.release + " " + uts.machine;
  info.compiler = LATTN_COMPILER;
  info.build_type = LATTN_BUILD_TYPE;
  info.cxx_flags = LATTN_CXX_FLAGS;
  info.version = kVersion;
  info.git_revision = kGitRevision;
  info.git_dirty = kGitDirty;
  info.cpu_signature = cpu_signature();
  if (const std::string mhz = cpuinfo_field("cpu MHz"); !mhz.empty()) info.cpu_mhz = std::atof(mhz.c_str());
  info.cache_kib = cache_kib();
  info.cpu_scaling_enabled = frequency_scaling().has_value();
  info.load_avg = load_averages();
  return info;
}

}  // namespace lattn

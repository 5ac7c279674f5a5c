#include "build_info.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <thread>

namespace lattn {

const char* const kVersion = LATTN_VERSION;

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

nlohmann::json host_info(int threads) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  utsname uts{};
  uname(&uts);
  return {
      {"cpu_model", cpu_model()},
      {"cpu_cores", std::thread::hardware_concurrency()},
      {"threads", threads},
      {"hostname", host},
      {"os", std::string(uts.sysname) + " " + uts.release + " " + uts.machine},
      {"compiler", LATTN_COMPILER},
      {"build_type", LATTN_BUILD_TYPE},
      {"cxx_flags", LATTN_CXX_FLAGS},
      {"lattnbench_version", kVersion},
      {"git_revision", kGitRevision},
      {"git_dirty", kGitDirty},
  };
}

}  // namespace lattn

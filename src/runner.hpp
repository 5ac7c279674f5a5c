// One benchmark run: the plan's cases through one backend, each timed, checked and recorded, and
// the result file written at the end (also when a case failed).
#pragma once

#include <string>
#include <vector>

#include "config.hpp"

namespace lattn {

struct RunRequest {
  Config config;
  std::vector<std::string> argv;
  std::string out_path;   // empty: results/lattnbench-<backend>-<UTC time>.json
  std::string dump_dir;   // empty: no .npy dump
  bool quiet = false;     // no progress lines
};

// Exit status of the run: 0 every case ran and passed its check (or was skipped as unsupported),
// 1 some case failed its check or broke. Throws UsageError for what the user must fix.
int run_benchmarks(const RunRequest& request);

std::string default_out_path(const std::string& backend, const std::string& utc_compact);

}  // namespace lattn

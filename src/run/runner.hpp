// One benchmark run: the plan's cases (or one shard of them) through one backend, each timed,
// checked and recorded; a journal line per finished case; the result file written at the end,
// also when a case failed or the run was interrupted.
#pragma once

#include <string>
#include <vector>

#include "src/config/config.hpp"
#include "src/results/formats.hpp"
#include "src/plugins/plugins.hpp"
#include "src/run/shard.hpp"

namespace lattn {

struct RunRequest {
  Config config;
  std::vector<std::string> argv;
  // The first --out (format by extension; "-" or /dev/stdout: the JSON on stdout); empty: with the
  // table on stdout, results/lattnbench-<backend>-<UTC time>.json, else no result file.
  std::string out_path;
  std::vector<std::string> more_out_paths;  // the further --out paths, each as out_path
  std::string gbench_path;   // empty: no Google Benchmark export
  std::string dump_dir;      // empty: no .npy dump
  std::string resume_path;   // a journal to continue
  bool force = false;        // start over although an unfinished run's journal is at the path
  OutputFormat stdout_format = OutputFormat::table;
  Shard shard;
  bool quiet = false;        // no progress lines
  Plugins plugins;           // loaded (src/plugins/plugins.hpp); their impls are rows of the backend
  bool isolate = false;      // each CPU plugin case in a child process (--isolate)
  std::string filter;        // --filter: only the cases whose name this regular expression matches
  bool list_cases = false;   // --list-cases: print the plan with estimated times, run nothing
  std::string tuning = "default";  // --tuning / --retune / LATTN_TUNING (BackendOptions::tuning)
  std::string amx_tiles;           // LATTN_AMX (BackendOptions::amx_tiles); empty: the CPU's own
};

// Exit status of the run: 0 every case ran and passed its check (or was skipped), 1 some case
// failed its check or broke, 128 + signal when interrupted. Throws UsageError for what the user
// must fix, EnvironmentError when the disk would not take the journal, a dump or the result file
// (the finished cases are kept in the journal for --resume).
int run_benchmarks(const RunRequest& request);

// --list-cases: the plan (after --filter and --shard), each case's name and estimated time from the
// cost model, and their total; nothing is run or written.
std::string list_cases(const RunRequest& request);

std::string default_out_path(const std::string& backend, const std::string& utc_compact);
std::string journal_path_for(const std::string& out_path);

}  // namespace lattn

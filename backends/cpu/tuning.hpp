// Which values the CPU kernels' runtime choices (kernels/cpu/tuning.hpp) take in this process, and
// where they came from: the device block's `tuning` (docs/performance.md, "Tuning per CPU"). The
// choices are the plan, in the manner of FFTW's planner: constants inside the kernels and
// structures (whether a kernel's products run on this project's kernels or on OpenBLAS's sgemm).
//
//   --tuning default     the kernels' defaults (today's choices, measured on Zen 4): deterministic,
//                        what the tests and CI run
//   --tuning shipped     the table below for this CPU's microarchitecture, else the defaults
//   --tuning auto        (the default) the cached plan of this cpu_signature, else the shipped
//                        table, else a calibration now (seconds), written to the cache
//   --tuning calibrate   (--retune) a calibration now, written to the cache
//   --tuning exhaustive  a calibration now, then every combination of each kernel's choices timed
//                        on the suites' own shapes (minutes); the best runs and is cached, and how
//                        far the calibration's plan is from it is printed and recorded
// LATTN_TUNING gives the mode where --tuning is not given.
//
// The cache is $XDG_CACHE_HOME/lattnbench/tuning-<signature>.json (~/.cache without it). It is
// the program's own file, not the user's input: one that cannot be read, is malformed, or names
// values this build does not offer is reported in one warning line and replaced by a new
// calibration, and the run goes on (exit status 2 is for what the user wrote).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/tuning.hpp"
#include "src/results/device_info.hpp"

namespace lattn::cpu {

enum class TuningMode { automatic, shipped, defaults, calibrate, exhaustive };
// "auto", "shipped", "default", "calibrate", "exhaustive": what --tuning and LATTN_TUNING take.
const std::vector<std::string>& tuning_mode_names();
std::optional<TuningMode> tuning_mode_from(const std::string& name);

// The shipped table's entry for this signature ("<vendor> family F model M stepping S") at this
// width: the microarchitecture's name and its setting; nullopt where the table has none.
struct ShippedTuning {
  std::string microarchitecture;
  tuning::Setting setting;
};
std::optional<ShippedTuning> shipped_tuning(const std::string& signature, Vec vec);

// The cache file of a signature: under $XDG_CACHE_HOME, else $HOME/.cache; empty when neither is
// set or the signature is empty (no cache then: a calibration is not kept).
std::string tuning_cache_path(const std::string& signature);

struct CachedTuning {
  std::optional<tuning::Setting> setting;  // a usable entry
  std::optional<double> calibration_s;
  // A plan --tuning exhaustive wrote: its search's groups (kept as written) and time.
  std::vector<TuningInfo::PlanGap> exhaustive;
  std::optional<double> exhaustive_s;
  std::string problem;  // why the file was not usable (empty: usable, or no file at all)
};
CachedTuning read_tuning_cache(const std::string& path, const std::string& signature, Vec vec);
struct Calibration {
  tuning::Setting setting;
  double seconds = 0;
  // Each candidate tried against the incumbent: the best call of each over the rounds, the rounds
  // the candidate won, and whether it was kept (written to the cache file, for a reader to see the
  // margins a choice rests on).
  struct Trial {
    tuning::Knob knob;
    int incumbent = 0, candidate = 0;
    double incumbent_s = 0, candidate_s = 0;
    int wins = 0, rounds = 0;
    bool kept = false;
  };
  std::vector<Trial> trials;
};
// The exhaustive search's result: the best plan (the calibration's, each group's choices replaced
// by the group's best combination) and, per group, the quick plan's time beside the best's.
struct ExhaustiveSearch {
  tuning::Setting setting;
  double seconds = 0;
  std::vector<TuningInfo::PlanGap> groups;
};
// Writes a calibration (and the exhaustive search that followed it, whose plan is then the one
// cached) atomically (a temporary file renamed over the old one), creating the folder. Returns
// what went wrong, empty on success.
std::string write_tuning_cache(const std::string& path, const std::string& signature, Vec vec,
                               const Calibration& calibration, const ExhaustiveSearch* search = nullptr);
// Times each kernel's candidates on one thread, one choice at a time starting from the defaults,
// keeping a candidate only where its best beats the incumbent's by 3% and it wins 4 of 5
// alternating rounds (so that noise keeps the default); stops trying more once `budget_s` has passed.
// The kernels: the scan, the packed products, the layer's product path (after the packed
// products' constants), the chunked form's product path and its tiles' prefetch.
Calibration calibrate_tuning(Vec vec, double budget_s = 4.0);
using Calibrator = std::function<Calibration(Vec)>;

// The exhaustive search from the calibration's plan `quick`, on the run's threads: per group of
// choices (scan; layer: the packed products' constants and the layer's product path; chunked: its
// product path and the tiles' prefetch), every combination of the group's candidates at vec, the
// rest of the plan as `quick` has it, each timed as the best of two calls (after one to warm) on
// the suites' shapes: the kernel suite's B 2, H 4, T 8192, D 64 and 128, fwd and bwd (the scan:
// the additive rule, no decay, scalar and vector gates; the chunked form: additive with no decay
// and vector gates, the delta rule with scalar gates), the layer suite's projections (B 2, T 2048,
// model width 512). Groups with one combination at vec are not timed. A test gives shorter
// sequences (kernel_seq for the kernel suite's, layer_seq for the layer's).
ExhaustiveSearch search_tuning(Vec vec, const tuning::Setting& quick, int kernel_seq = 8192, int layer_seq = 2048);
using Searcher = std::function<ExhaustiveSearch(Vec, const tuning::Setting&)>;

// The decision, every input given (tests give their own calibrator, searcher and cache folder).
TuningInfo decide_tuning(TuningMode mode, const std::string& signature, Vec vec, const std::string& cache_path,
                         const Calibrator& calibrate, const Searcher& search = nullptr);
// The device block's record of a setting.
TuningInfo tuning_info(const std::string& source, Vec vec, const tuning::Setting& setting);

// Decides once per process (the mode of the first call; later calls return that decision) for
// this CPU and the active width, sets it (tuning::set), and says so on stderr when it calibrated
// or ignored a cache.
const TuningInfo& apply_tuning(TuningMode mode);

}  // namespace lattn::cpu

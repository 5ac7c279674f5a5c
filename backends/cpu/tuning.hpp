// Which values the CPU kernels' runtime choices (kernels/cpu/tuning.hpp) take in this process, and
// where they came from: the device block's `tuning` (docs/performance.md, "Tuning per CPU").
//
//   --tuning default     the kernels' defaults (today's choices, measured on Zen 4): deterministic,
//                        what the tests and CI run
//   --tuning shipped     the table below for this CPU's microarchitecture, else the defaults
//   --tuning auto        (the default) the cached calibration of this cpu_signature, else the
//                        shipped table, else a calibration now (seconds), written to the cache
//   --tuning calibrate   (--retune) a calibration now, written to the cache
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

enum class TuningMode { automatic, shipped, defaults, calibrate };
// "auto", "shipped", "default", "calibrate": what --tuning and LATTN_TUNING take.
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
// Writes a calibration atomically (a temporary file renamed over the old one), creating the
// folder. Returns what went wrong, empty on success.
std::string write_tuning_cache(const std::string& path, const std::string& signature, Vec vec,
                               const Calibration& calibration);
// Times each kernel's candidates on one thread, one choice at a time starting from the defaults,
// keeping a candidate only where its best beats the incumbent's by 3% and it wins 4 of 5
// alternating rounds (so that noise keeps the default); stops trying more once `budget_s` has passed.
Calibration calibrate_tuning(Vec vec, double budget_s = 4.0);
using Calibrator = std::function<Calibration(Vec)>;

// The decision, every input given (tests give their own calibrator and cache folder).
TuningInfo decide_tuning(TuningMode mode, const std::string& signature, Vec vec, const std::string& cache_path,
                         const Calibrator& calibrate);
// The device block's record of a setting.
TuningInfo tuning_info(const std::string& source, Vec vec, const tuning::Setting& setting);

// Decides once per process (the mode of the first call; later calls return that decision) for
// this CPU and the active width, sets it (tuning::set), and says so on stderr when it calibrated
// or ignored a cache.
const TuningInfo& apply_tuning(TuningMode mode);

}  // namespace lattn::cpu

// Timing of one prepared case: a cold call, warm-up, a calibrated inner loop, then samples until
// the case's noise target, its most samples or its timeout stops it; quartiles over the samples
// (method in docs/harness.md). A Sampler takes one sample at a time, so that the runner can take
// the samples of several cases in rounds (--interleave); measure() takes all of one case's.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "src/run/backend.hpp"

namespace lattn {

struct SampleStats {
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0, mean = 0;
};

// Quantile p in [0, 1] of sorted values by linear interpolation between closest ranks
// (Hyndman-Fan type 7, numpy's default): h = (n - 1) p.
double quantile_sorted(const std::vector<double>& sorted, double p);
SampleStats summarize(std::vector<double> samples);

// The relative spread of the samples' median, in percent of the median: the half-width of the
// distribution-free confidence interval of the median from order statistics, [x_(l), x_(n+1-l)]
// with the largest l whose coverage is at least 95% (binomial, p = 1/2); with 5 samples or fewer,
// where no such l exists, the half-range (coverage 1 - 2^(1-n)). 0 for fewer than 2 samples.
double median_noise_pct(const std::vector<double>& samples);

struct TimingSettings {
  int warmup = 2;
  int reps = 10;             // the most samples a case takes
  double min_sample_ms = 25.0;
  int min_samples = 5;       // the fewest samples before the noise target may stop a case (at most reps)
  double max_noise_pct = 1;  // stop once median_noise_pct is at most this; 0: never (take reps samples)
  double timeout_s = 60;     // stop once the case's own measuring time passes this; 0: no limit
  double slowdown_pct = 0;   // testing aid: every call made this % slower (a spin after it)
};

// Why a case took no more samples; interrupted: a stop request (SIGINT, SIGTERM) came first, and
// the samples so far are kept as a partial measurement.
enum class StopReason { samples, noise, timeout, interrupted };
std::string to_string(StopReason reason);

struct Timing {
  double compile_s = 0;             // the first, cold call
  int inner = 1;                    // calls per sample
  std::vector<double> samples_ms;   // per-call time of each sample
  // Per-call process CPU time of each sample (all threads together): the Google Benchmark
  // export's cpu_time. Above samples_ms when several threads work, below it while a call waits.
  std::vector<double> samples_cpu_ms;
  SampleStats stats;
  // Samples that lasted less than min_sample_ms although inner was re-calibrated (a machine whose
  // speed kept changing under the case); 0 when the minimum held for every sample.
  int short_samples = 0;
  double noise_pct = 0;  // median_noise_pct of the samples
  StopReason stopped_on = StopReason::samples;
};

// Picks calls per sample so that one sample lasts at least `min_sample_ms`, from a measured
// per-call time; never below 1, and capped so that calibration cannot run away on a 0 reading.
int calibrate_inner(double per_call_ms, double min_sample_ms);

// A sample shorter than the minimum means the calibration was made in a slower stretch than the
// samples ran in: inner grows and the samples start over, at most this many times per case.
inline constexpr int kMaxRecalibrations = 3;

// One case's measurement, a step at a time: start() makes the cold call, the warm-up and the
// calibration; sample() takes one sample (a stop request is answered before it); done() says
// whether a stop rule holds. The case's own measuring time, for the timeout, counts start() and
// its samples, not what runs between them.
class Sampler {
 public:
  Sampler(PreparedCase& kase, const TimingSettings& settings);
  void start();
  void sample();
  bool done() const { return done_; }
  // A stop request ended the case: its samples so far are all it gets.
  void interrupt() {
    timing_.stopped_on = StopReason::interrupted;
    done_ = true;
  }
  // The samples so far, their statistics and the stop reason.
  Timing timing() const;

 private:
  void decide();
  PreparedCase& kase_;
  TimingSettings settings_;
  Timing timing_;
  int recalibrations_ = 0;
  bool done_ = false;
  std::chrono::steady_clock::duration own_time_{};
};

Timing measure(PreparedCase& kase, const TimingSettings& settings);

// The testing aid --slowdown (docs/harness.md): a case whose every call, the cold one included, is
// followed by a spin of `pct` percent of the time the call took, inside the timed region, so that
// the measurement sees a kernel that much slower. `kase` is returned as it is for pct 0.
std::unique_ptr<PreparedCase> with_slowdown(std::unique_ptr<PreparedCase> kase, double pct);

}  // namespace lattn

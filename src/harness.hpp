// Timing of one prepared case: a cold call, warm-up, a calibrated inner loop, and quartiles over
// the samples (method in docs/harness.md).
#pragma once

#include <vector>

#include "backend.hpp"

namespace lattn {

struct SampleStats {
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0, mean = 0;
};

// Quantile p in [0, 1] of sorted values by linear interpolation between closest ranks
// (Hyndman-Fan type 7, numpy's default): h = (n - 1) p.
double quantile_sorted(const std::vector<double>& sorted, double p);
SampleStats summarize(std::vector<double> samples);

struct TimingSettings {
  int warmup = 2;
  int reps = 10;
  double min_sample_ms = 25.0;
};

struct Timing {
  double compile_s = 0;             // the first, cold call
  int inner = 1;                    // calls per sample
  std::vector<double> samples_ms;   // per-call time of each sample
  SampleStats stats;
  // Samples that lasted less than min_sample_ms although inner was re-calibrated (a machine whose
  // speed kept changing under the case); 0 when the minimum held for every sample.
  int short_samples = 0;
};

// Picks calls per sample so that one sample lasts at least `min_sample_ms`, from a measured
// per-call time; never below 1, and capped so that calibration cannot run away on a 0 reading.
int calibrate_inner(double per_call_ms, double min_sample_ms);

// A sample shorter than the minimum means the calibration was made in a slower stretch than the
// samples ran in: inner grows and the samples start over, at most this many times per case.
inline constexpr int kMaxRecalibrations = 3;

Timing measure(PreparedCase& kase, const TimingSettings& settings);

}  // namespace lattn

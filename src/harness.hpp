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
};

// Picks calls per sample so that one sample lasts at least `min_sample_ms`, from a measured
// per-call time; never below 1, and capped so that calibration cannot run away on a 0 reading.
int calibrate_inner(double per_call_ms, double min_sample_ms);

Timing measure(PreparedCase& kase, const TimingSettings& settings);

}  // namespace lattn

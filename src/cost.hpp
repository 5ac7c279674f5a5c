// What the plan and the records count beyond each op's flop model (core/op.hpp): the bytes a call
// must move at the least, the relative cost that balances shards, and the time a case is expected
// to take, from which the run's ETA starts before any case has finished.
#pragma once

#include "backend.hpp"
#include "core/case.hpp"

namespace lattn {

// Bytes one call must move at the least: its inputs once and its outputs once.
double case_min_bytes(const MemoryUsage& memory);
// Proportional to the case's flops, with a per-token floor so that tiny cases are not taken as free.
double case_cost_estimate(const Case& kase);

struct RunSettings;

// The seconds a case is expected to take, from the cost model: a call's flops at `peak_gflops`
// (the run's sgemm peak; a call is taken as free when it is 0), a sample at least min_sample_ms.
// The float64 reference and the check are not counted.
struct TimeEstimate {
  double start_s = 0;   // the cold call, the warm-up and the calibration trial
  double sample_s = 0;  // one sample
  int samples = 0;      // the most samples (reps), fewer where the timeout ends them
  double total_s() const { return start_s + samples * sample_s; }
};
TimeEstimate estimate_case_time(const Case& kase, const RunSettings& run, double peak_gflops);

// The time left of a run: the estimated seconds of the work not yet done, scaled by how the work
// done so far compares with its estimate. The scale starts at 1 (the cost model alone) and moves
// to the measured ratio as work is done, the model weighing as much as a tenth of the run's work:
// scale = (elapsed + P) / (done + P), P = total / 10.
class Progress {
 public:
  explicit Progress(double total_estimate_s) : total_(total_estimate_s) {}
  void advance(double estimate_s) { done_ += estimate_s; }
  double total_s() const { return total_; }
  double eta_s(double elapsed_s) const;

 private:
  double total_ = 0, done_ = 0;
};

}  // namespace lattn

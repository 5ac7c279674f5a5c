// What the plan and the records count beyond each op's flop model (core/op.hpp): the bytes a call
// must move at the least, the relative cost that balances shards, and the time a case is expected
// to take, from which the run's ETA starts before any case has finished.
#pragma once

#include "src/run/backend.hpp"
#include "core/case.hpp"

namespace lattn {

// Bytes one call must move at the least: its inputs once and its outputs once.
double case_min_bytes(const MemoryUsage& memory);
// Proportional to the case's flops, with a per-token floor so that tiny cases are not taken as free.
double case_cost_estimate(const Case& kase);

struct RunSettings;

// The machine's paces the time estimate holds a case against, measured at start-up under the load
// of that moment (src/run/runner.cpp): a kernel's call at its flops over `kernel_gflops` or its
// compulsory bytes over `stream_gbytes_per_s`, whichever is slower; a float64 reference at its
// flops over `reference_gflops`, after its inputs at `input_elems_per_s`; and `check_s` of sgemm
// re-measurements around each case. A pace of 0 counts that part as free. `sgemm_spread`, one less
// the start-up sgemm's median product over its best, is how noisy the machine is: on a quiet one
// (within 2%) the noise target stops a case at min_samples, on a busy one (10% and more) it takes
// reps, and the samples expected go from one to the other in between.
struct CostRates {
  double kernel_gflops = 0;
  double stream_gbytes_per_s = 0;
  double reference_gflops = 0;
  double input_elems_per_s = 0;
  double check_s = 0;
  double sgemm_spread = 0;
};

// The seconds a case is expected to take, from the cost model.
struct TimeEstimate {
  double prepare_s = 0;  // its inputs and float64 reference (when it makes them), the sgemm checks around it
  double start_s = 0;    // the cold call, the warm-up and the calibration trial
  double sample_s = 0;   // one sample
  int samples = 0;       // the samples expected: reps without a noise target, else by CostRates::sgemm_spread
  double total_s() const { return prepare_s + start_s + samples * sample_s; }
};
// The samples a case is expected to take (TimeEstimate::samples).
int expected_samples(const RunSettings& run, const CostRates& rates);

// `reference_flops`: the flops of the float64 reference this case makes (the first case of a
// reference key, which makes its inputs too; 0 for the others, which share them).
TimeEstimate estimate_case_time(const Case& kase, const RunSettings& run, const CostRates& rates, double reference_flops = 0);

// The flops of the float64 reference of `kase`'s inputs: its forward, or forward and backward, by
// the op's first form's model whatever the case's impl (the reference is one algorithm for all).
double reference_flops(const Case& kase, bool backward);

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

#include "src/run/cost.hpp"

#include <algorithm>
#include <cmath>

#include "core/op.hpp"
#include "src/config/config.hpp"

namespace lattn {

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& c) {
  return c.op->flops(c) + 64.0 * double(c.batch) * c.heads * c.seq * c.dim;
}

double reference_flops(const Case& c, bool backward) {
  Case as = c;
  as.mode = backward ? Mode::fwd_bwd : Mode::fwd;
  if (!as.op->forms.empty()) as.impl = as.op->forms.front().name;
  return as.op->flops(as);
}

int expected_samples(const RunSettings& run, const CostRates& rates) {
  if (!(run.max_noise > 0)) return run.reps;
  const int least = std::min(run.min_samples, run.reps);
  const double busy = std::clamp((rates.sgemm_spread - 0.02) / 0.08, 0.0, 1.0);
  return least + int(std::lround(busy * (run.reps - least)));
}

TimeEstimate estimate_case_time(const Case& c, const RunSettings& run, const CostRates& rates, double reference_flops) {
  const double flops = c.op->flops(c);
  const double bytes = 4.0 * double(case_input_elems(c) + case_output_elems(c));
  const double compute_s = rates.kernel_gflops > 0 ? flops / (rates.kernel_gflops * 1e9) : 0.0;
  const double memory_s = rates.stream_gbytes_per_s > 0 ? bytes / (rates.stream_gbytes_per_s * 1e9) : 0.0;
  const double call_s = std::max(compute_s, memory_s);
  TimeEstimate e;
  e.prepare_s = rates.check_s;
  if (reference_flops > 0) {
    if (rates.reference_gflops > 0) e.prepare_s += reference_flops / (rates.reference_gflops * 1e9);
    if (rates.input_elems_per_s > 0) e.prepare_s += double(case_input_elems(c, true)) / rates.input_elems_per_s;
  }
  // A sample is at least min_sample_ms; the calibration aims 10% above it, and a sample holds a
  // whole number of calls.
  e.sample_s = std::max(run.min_sample_ms * 1.1e-3, call_s);
  // The cold call and the warm-up, then a calibration trial of a sample's calls where a call is
  // shorter than min_sample_ms (a longer one is a sample by itself, and needs no trial).
  e.start_s = (1 + run.warmup) * call_s + (call_s < run.min_sample_ms * 1e-3 ? e.sample_s : 0.0);
  e.samples = expected_samples(run, rates);
  if (run.timeout > 0) e.samples = std::clamp(int(run.timeout / e.sample_s) + 1, 1, e.samples);
  return e;
}

double Progress::eta_s(double elapsed_s) const {
  const double prior = total_ / 10;
  if (!(prior > 0)) return 0.0;
  return std::max(0.0, total_ - done_) * (elapsed_s + prior) / (done_ + prior);
}

}  // namespace lattn

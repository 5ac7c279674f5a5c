#include "src/run/cost.hpp"

#include <algorithm>

#include "src/config/config.hpp"
#include "core/op.hpp"

namespace lattn {

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& c) {
  return c.op->flops(c) + 64.0 * double(c.batch) * c.heads * c.seq * c.dim;
}

double reference_flops(const Case& c, bool backward) {
  Case as = c;
  as.mode = backward ? Mode::fwd_bwd : Mode::fwd;
  return as.op->flops(as);
}

TimeEstimate estimate_case_time(const Case& c, const RunSettings& run, const CostRates& rates, double reference_flops) {
  const double flops = c.op->flops(c);
  const double bytes = 4.0 * double(case_input_elems(c) + case_output_elems(c));
  const double compute_s = rates.kernel_gflops > 0 ? flops / (rates.kernel_gflops * 1e9) : 0.0;
  const double memory_s = rates.stream_gbytes_per_s > 0 ? bytes / (rates.stream_gbytes_per_s * 1e9) : 0.0;
  const double call_s = std::max(compute_s, memory_s);
  TimeEstimate e;
  e.prepare_s = rates.check_s + (rates.reference_gflops > 0 ? reference_flops / (rates.reference_gflops * 1e9) : 0.0);
  // A sample is at least min_sample_ms; the calibration aims 10% above it, and a sample holds a
  // whole number of calls.
  e.sample_s = std::max(run.min_sample_ms * 1.1e-3, call_s);
  e.start_s = (1 + run.warmup) * call_s + e.sample_s;
  e.samples = run.max_noise > 0 ? (std::min(run.min_samples, run.reps) + run.reps + 1) / 2 : run.reps;
  if (run.timeout > 0) e.samples = std::clamp(int(run.timeout / e.sample_s) + 1, 1, e.samples);
  return e;
}

double Progress::eta_s(double elapsed_s) const {
  const double prior = total_ / 10;
  if (!(prior > 0)) return 0.0;
  return std::max(0.0, total_ - done_) * (elapsed_s + prior) / (done_ + prior);
}

}  // namespace lattn

#include "cost.hpp"

#include <algorithm>

#include "config.hpp"
#include "core/op.hpp"

namespace lattn {

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& c) {
  return c.op->flops(c) + 64.0 * double(c.batch) * c.heads * c.seq * c.dim;
}

TimeEstimate estimate_case_time(const Case& c, const RunSettings& run, double peak_gflops) {
  const double call_s = peak_gflops > 0 ? c.op->flops(c) / (peak_gflops * 1e9) : 0.0;
  TimeEstimate e;
  e.sample_s = std::max(run.min_sample_ms * 1e-3, call_s);
  e.start_s = (1 + run.warmup) * call_s + e.sample_s;
  e.samples = run.reps;
  if (run.timeout > 0) e.samples = std::clamp(int(run.timeout / e.sample_s) + 1, 1, run.reps);
  return e;
}

double Progress::eta_s(double elapsed_s) const {
  const double prior = total_ / 10;
  if (!(prior > 0)) return 0.0;
  return std::max(0.0, total_ - done_) * (elapsed_s + prior) / (done_ + prior);
}

}  // namespace lattn

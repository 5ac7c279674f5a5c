#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "interrupt.hpp"

namespace lattn {

double quantile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double h = (double(sorted.size()) - 1.0) * p;
  const std::size_t lo = std::size_t(std::floor(h));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - double(lo)) * (sorted[hi] - sorted[lo]);
}

SampleStats summarize(std::vector<double> samples) {
  SampleStats s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.median = quantile_sorted(samples, 0.5);
  s.q1 = quantile_sorted(samples, 0.25);
  s.q3 = quantile_sorted(samples, 0.75);
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size());
  return s;
}

int calibrate_inner(double per_call_ms, double min_sample_ms) {
  constexpr int kMaxInner = 1 << 20;
  if (!(per_call_ms > 0)) return kMaxInner;
  const double calls = std::ceil(min_sample_ms / per_call_ms);
  return int(std::clamp(calls, 1.0, double(kMaxInner)));
}

namespace {

// The warm-up calls in batches of about kWarmupBatchMs each, with a stop request checked between
// them (a million warm-up calls can take minutes); the mean time of a call. The first batch is one
// call, and each next one is sized from the calls so far.
double warm_up(PreparedCase& kase, int calls) {
  constexpr double kWarmupBatchMs = 50;
  double total_ms = 0;
  int done = 0, batch = 1;
  while (done < calls) {
    throw_if_stop_requested();
    batch = std::min(batch, calls - done);
    total_ms += kase.time_ms(batch);
    done += batch;
    batch = calibrate_inner(total_ms / done, kWarmupBatchMs);
  }
  return total_ms / done;
}

}  // namespace

Timing measure(PreparedCase& kase, const TimingSettings& settings) {
  Timing timing;
  const auto cold_start = std::chrono::steady_clock::now();
  kase.run();
  timing.compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - cold_start).count();

  // The warm-up calls double as the first estimate of a call's time; a second pass at the chosen
  // inner count corrects it, since tiny cases run faster in a loop than alone.
  double per_call_ms = timing.compile_s * 1e3;
  if (settings.warmup > 0) per_call_ms = warm_up(kase, settings.warmup);
  timing.inner = calibrate_inner(per_call_ms, settings.min_sample_ms);
  if (timing.inner > 1) {
    const double trial_ms = kase.time_ms(timing.inner);
    if (trial_ms < settings.min_sample_ms)
      timing.inner = calibrate_inner(trial_ms / timing.inner, settings.min_sample_ms * 1.1);
  }

  // The samples keep the promise of a minimum length: one slow warm-up call can make inner 1 for
  // a case whose steady calls are far shorter, and no trial above re-checks that.
  timing.samples_ms.reserve(std::size_t(settings.reps));
  int recalibrations = 0;
  while (int(timing.samples_ms.size()) < settings.reps) {
    throw_if_stop_requested();  // a stop request lets the sample under way finish, then ends the case
    const double sample_ms = kase.time_ms(timing.inner);
    if (sample_ms < settings.min_sample_ms) {
      if (recalibrations < kMaxRecalibrations) {
        ++recalibrations;
        timing.inner = std::max(timing.inner + 1, calibrate_inner(sample_ms / timing.inner, settings.min_sample_ms * 1.1));
        timing.samples_ms.clear();
        continue;
      }
      ++timing.short_samples;
    }
    timing.samples_ms.push_back(sample_ms / timing.inner);
  }
  timing.stats = summarize(timing.samples_ms);
  return timing;
}

}  // namespace lattn

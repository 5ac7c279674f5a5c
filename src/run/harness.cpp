#include "src/run/harness.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "src/run/interrupt.hpp"

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

std::string to_string(StopReason reason) {
  switch (reason) {
    case StopReason::samples: return "samples";
    case StopReason::noise: return "noise";
    case StopReason::timeout: return "timeout";
    case StopReason::interrupted: return "interrupted";
  }
  return "?";
}

double median_noise_pct(const std::vector<double>& samples) {
  const std::size_t n = samples.size();
  if (n < 2) return 0.0;
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const double median = quantile_sorted(sorted, 0.5);
  if (!(median > 0)) return 0.0;
  // The interval [x_(l), x_(n+1-l)] (1-based) misses the median with probability 2 P(X < l),
  // X ~ Binomial(n, 1/2); l is the largest with 2 P(X < l) <= 5%, at least 1 (the whole range).
  std::size_t l = 1;
  double below = 0, term = std::pow(0.5, double(n));  // P(X = k), from k = 0
  for (std::size_t k = 0; k + 1 < n; ++k) {
    below += term;  // P(X <= k) = P(X < k + 1)
    if (2 * below > 0.05) break;
    l = k + 1;
    term = term * double(n - k) / double(k + 1);
  }
  return (sorted[n - l] - sorted[l - 1]) / 2 / median * 100;
}

namespace {

// The CPU time the process has used, every thread's, in ms.
double process_cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

}  // namespace

Sampler::Sampler(PreparedCase& kase, const TimingSettings& settings) : kase_(kase), settings_(settings) {}

void Sampler::start() {
  const auto start = std::chrono::steady_clock::now();
  kase_.run();
  timing_.compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // The warm-up calls double as the first estimate of a call's time; a second pass at the chosen
  // inner count corrects it, since tiny cases run faster in a loop than alone.
  double per_call_ms = timing_.compile_s * 1e3;
  if (settings_.warmup > 0) per_call_ms = warm_up(kase_, settings_.warmup);
  timing_.inner = calibrate_inner(per_call_ms, settings_.min_sample_ms);
  if (timing_.inner > 1) {
    const double trial_ms = kase_.time_ms(timing_.inner);
    if (trial_ms < settings_.min_sample_ms)
      timing_.inner = calibrate_inner(trial_ms / timing_.inner, settings_.min_sample_ms * 1.1);
  }
  timing_.samples_ms.reserve(std::size_t(settings_.reps));
  own_time_ += std::chrono::steady_clock::now() - start;
}

// The samples keep the promise of a minimum length: one slow warm-up call can make inner 1 for a
// case whose steady calls are far shorter, and no trial in start() re-checks that.
void Sampler::sample() {
  throw_if_stop_requested();  // a stop request lets the sample under way finish, then ends the case
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start_ms = process_cpu_ms();
  const double sample_ms = kase_.time_ms(timing_.inner);
  const double sample_cpu_ms = process_cpu_ms() - cpu_start_ms;
  own_time_ += std::chrono::steady_clock::now() - start;
  if (sample_ms < settings_.min_sample_ms) {
    if (recalibrations_ < kMaxRecalibrations) {
      ++recalibrations_;
      timing_.inner = std::max(timing_.inner + 1, calibrate_inner(sample_ms / timing_.inner, settings_.min_sample_ms * 1.1));
      timing_.samples_ms.clear();
      timing_.samples_cpu_ms.clear();
      timing_.short_samples = 0;
      decide();
      return;
    }
    ++timing_.short_samples;
  }
  timing_.samples_ms.push_back(sample_ms / timing_.inner);
  timing_.samples_cpu_ms.push_back(sample_cpu_ms / timing_.inner);
  decide();
}

// After each sample: the noise target once the fewest samples are in, then the most samples,
// then the timeout (which may end a case below its fewest samples, but never before one sample).
void Sampler::decide() {
  const int n = int(timing_.samples_ms.size());
  const int fewest = std::min(settings_.min_samples, settings_.reps);
  timing_.noise_pct = median_noise_pct(timing_.samples_ms);
  if (settings_.max_noise_pct > 0 && n >= fewest && n >= 2 && timing_.noise_pct <= settings_.max_noise_pct) {
    timing_.stopped_on = StopReason::noise;
    done_ = true;
  } else if (n >= settings_.reps) {
    timing_.stopped_on = StopReason::samples;
    done_ = true;
  } else if (settings_.timeout_s > 0 && n >= 1 && std::chrono::duration<double>(own_time_).count() >= settings_.timeout_s) {
    timing_.stopped_on = StopReason::timeout;
    done_ = true;
  }
}

Timing Sampler::timing() const {
  Timing t = timing_;
  t.stats = summarize(t.samples_ms);
  return t;
}

Timing measure(PreparedCase& kase, const TimingSettings& settings) {
  Sampler sampler(kase, settings);
  sampler.start();
  while (!sampler.done()) sampler.sample();
  return sampler.timing();
}

namespace {

void spin_for(std::chrono::steady_clock::duration how_long) {
  const auto until = std::chrono::steady_clock::now() + how_long;
  while (std::chrono::steady_clock::now() < until) {
  }
}

class SlowedCase final : public PreparedCase {
 public:
  SlowedCase(std::unique_ptr<PreparedCase> kase, double pct) : kase_(std::move(kase)), fraction_(pct / 100) {}
  void run() override {
    const auto start = std::chrono::steady_clock::now();
    kase_->run();
    spin_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>((std::chrono::steady_clock::now() - start) * fraction_));
  }
  // The calls' time by the backend's clock, and the spin's by the host's, as it ran.
  double time_ms(int calls) override {
    const double ms = kase_->time_ms(calls);
    const auto start = std::chrono::steady_clock::now();
    spin_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms * fraction_)));
    return ms + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  void watch_scratch() override { kase_->watch_scratch(); }
  MemoryUsage memory() const override { return kase_->memory(); }
  void read_outputs(TensorSet& outputs) override { kase_->read_outputs(outputs); }
  std::string bwd_states() const override { return kase_->bwd_states(); }

 private:
  std::unique_ptr<PreparedCase> kase_;
  double fraction_;
};

}  // namespace

std::unique_ptr<PreparedCase> with_slowdown(std::unique_ptr<PreparedCase> kase, double pct) {
  if (!(pct > 0)) return kase;
  return std::make_unique<SlowedCase>(std::move(kase), pct);
}

}  // namespace lattn

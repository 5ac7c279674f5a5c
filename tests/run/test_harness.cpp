// Harness statistics and calibration on synthetic samples and a synthetic clock.
#include <catch2/catch.hpp>

#include "core/op.hpp"
#include "src/config/config.hpp"
#include "src/run/cost.hpp"
#include "src/config/plan.hpp"
#include "src/run/harness.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

using namespace lattn;

TEST_CASE("quartiles interpolate between closest ranks (numpy's default)", "[harness]") {
  // numpy.quantile([1, 2, 3, 4], [0.25, 0.5, 0.75]) == [1.75, 2.5, 3.25]
  SampleStats s = summarize({4, 1, 3, 2});
  CHECK(s.q1 == Approx(1.75));
  CHECK(s.median == Approx(2.5));
  CHECK(s.q3 == Approx(3.25));
  CHECK(s.min == 1);
  CHECK(s.max == 4);
  CHECK(s.mean == Approx(2.5));
  // numpy.quantile([10, 20, 30, 40, 100], [0.25, 0.5, 0.75]) == [20, 30, 40]
  s = summarize({100, 10, 40, 30, 20});
  CHECK(s.q1 == Approx(20));
  CHECK(s.median == Approx(30));
  CHECK(s.q3 == Approx(40));
  s = summarize({7});
  CHECK(s.q1 == 7);
  CHECK(s.q3 == 7);
}

TEST_CASE("calibration picks enough calls for a sample to last the minimum", "[harness]") {
  CHECK(calibrate_inner(10.0, 25.0) == 3);
  CHECK(calibrate_inner(30.0, 25.0) == 1);
  CHECK(calibrate_inner(0.001, 25.0) == 25000);
  CHECK(calibrate_inner(0.0, 25.0) == 1 << 20);
}

namespace {
// A case whose every call takes exactly `ms` on its clock, except the first (cold) call.
class SyntheticCase final : public PreparedCase {
 public:
  explicit SyntheticCase(double ms) : ms_(ms) {}
  void run() override { ++calls; }
  double time_ms(int n) override {
    calls += n;
    ++timed_batches;
    return n * ms_;
  }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet&) override {}
  long calls = 0;
  int timed_batches = 0;

 private:
  double ms_;
};
}  // namespace

TEST_CASE("measure runs cold, warm-up, calibrated samples, and reports per-call times", "[harness]") {
  SyntheticCase kase(0.5);
  TimingSettings settings{3, 7, 10.0};
  settings.max_noise_pct = 0;  // all seven samples, though the first five already agree
  const Timing t = measure(kase, settings);
  CHECK(t.inner == 20);
  REQUIRE(t.samples_ms.size() == 7);
  for (double s : t.samples_ms) CHECK(s == Approx(0.5));
  CHECK(t.stats.median == Approx(0.5));
  CHECK(t.compile_s >= 0);
  // cold call + 3 warm-up + one calibration trial of 20 + 7 samples of 20
  CHECK(kase.calls == 1 + 3 + 20 + 7 * 20);
}

namespace {
// A case whose first `slow_batches` timed batches take `slow_ms` per call and every later one
// `fast_ms`: the first calls of a real case fault pages in, fill caches, or meet a busy machine.
class SlowStartCase final : public PreparedCase {
 public:
  SlowStartCase(double slow_ms, double fast_ms, int slow_batches)
      : slow_ms_(slow_ms), fast_ms_(fast_ms), slow_batches_(slow_batches) {}
  void run() override {}
  double time_ms(int n) override { return n * (batches_++ < slow_batches_ ? slow_ms_ : fast_ms_); }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet&) override {}

 private:
  double slow_ms_, fast_ms_;
  int slow_batches_, batches_ = 0;
};

// A case that runs faster at every batch, so that no calibration holds for long.
class ShrinkingCase final : public PreparedCase {
 public:
  void run() override {}
  double time_ms(int n) override { return n * 8.0 * std::pow(0.5, batches_++); }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet&) override {}

 private:
  int batches_ = 0;
};
}  // namespace

TEST_CASE("a slow warm-up does not leave samples shorter than the minimum", "[harness]") {
  // The warm-up reads 30 ms per call, so inner starts at 1; the steady calls take 2 ms, and a
  // 2 ms sample of a 10 ms minimum must not be kept: inner grows and the samples start over.
  SlowStartCase kase(30.0, 2.0, 1);
  const Timing t = measure(kase, TimingSettings{2, 5, 10.0});
  CHECK(t.inner == 6);  // ceil(11 / 2): the minimum with a tenth to spare
  REQUIRE(t.samples_ms.size() == 5);
  for (double s : t.samples_ms) CHECK(s * t.inner >= 10.0);
  CHECK(t.short_samples == 0);
}

TEST_CASE("samples that stay short after the re-calibrations are counted", "[harness]") {
  ShrinkingCase kase;
  const Timing t = measure(kase, TimingSettings{1, 4, 10.0});
  REQUIRE(t.samples_ms.size() == 4);
  int short_by_hand = 0;
  for (double s : t.samples_ms) short_by_hand += s * t.inner < 10.0;
  CHECK(short_by_hand == 4);
  CHECK(t.short_samples == short_by_hand);
}

TEST_CASE("the median's noise is the half-width of its order-statistic 95% interval", "[harness][noise]") {
  CHECK(median_noise_pct({}) == 0);
  CHECK(median_noise_pct({3.0}) == 0);
  // Five samples have no 95% interval of order statistics (the range covers 93.75%): the half-range.
  CHECK(median_noise_pct({10, 11, 9, 10, 12}) == Approx((12.0 - 9.0) / 2 / 10 * 100));
  // Ten: P(X <= 1) = 11/1024, P(X <= 2) = 56/1024, so [x_(2), x_(9)] (97.9%) is the interval.
  CHECK(median_noise_pct({1, 2, 3, 4, 5, 6, 7, 8, 9, 100}) == Approx((9.0 - 2.0) / 2 / 5.5 * 100));
  CHECK(median_noise_pct(std::vector<double>(20, 4.0)) == 0);
}

TEST_CASE("a quiet case stops on the noise target once it has its fewest samples", "[harness][noise]") {
  SyntheticCase kase(0.5);
  TimingSettings settings{1, 50, 5.0};
  settings.min_samples = 6;
  settings.max_noise_pct = 1;
  const Timing t = measure(kase, settings);
  CHECK(t.samples_ms.size() == 6);
  CHECK(t.stopped_on == StopReason::noise);
  CHECK(t.noise_pct == 0);
  CHECK(to_string(t.stopped_on) == "noise");
}

TEST_CASE("without a noise target a case takes reps samples, and the fewest never exceed reps", "[harness][noise]") {
  SyntheticCase kase(0.5);
  TimingSettings settings{1, 7, 5.0};
  settings.max_noise_pct = 0;
  Timing t = measure(kase, settings);
  CHECK(t.samples_ms.size() == 7);
  CHECK(t.stopped_on == StopReason::samples);
  settings.reps = 3;  // min_samples 5 > reps 3: reps wins
  settings.max_noise_pct = 50;
  t = measure(kase, settings);
  CHECK(t.samples_ms.size() == 3);
}

namespace {
// A case whose calls take real time: each batch sleeps `ms` per call (the timeout counts real time).
class SleepingCase final : public PreparedCase {
 public:
  explicit SleepingCase(double ms) : ms_(ms) {}
  void run() override { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_)); }
  double time_ms(int n) override {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) run();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  MemoryUsage memory() const override { return {}; }
  void read_outputs(TensorSet&) override {}

 private:
  double ms_;
};
}  // namespace

TEST_CASE("the timeout ends a case's samples, after one sample at least", "[harness][noise]") {
  SleepingCase kase(20);
  TimingSettings settings{0, 100000, 1.0};
  settings.max_noise_pct = 0;
  settings.timeout_s = 0.05;  // three calls of 20 ms or more pass it
  const Timing t = measure(kase, settings);
  CHECK(t.stopped_on == StopReason::timeout);
  CHECK(t.samples_ms.size() >= 1);
  CHECK(t.samples_ms.size() < 100000);
}

TEST_CASE("the slowdown testing aid spins a share of each call's time inside the timed region", "[harness][slowdown]") {
  auto slowed = with_slowdown(std::make_unique<SyntheticCase>(10.0), 20);
  // The synthetic calls take no real time but report 10 ms each; the spin adds 20% of that, really
  // spent, to what the batch reports.
  CHECK(slowed->time_ms(1) >= 12.0);
  CHECK(slowed->time_ms(2) >= 24.0);
  auto plain = std::make_unique<SyntheticCase>(10.0);
  PreparedCase* raw = plain.get();
  CHECK(with_slowdown(std::move(plain), 0).get() == raw);
}

TEST_CASE("the ETA starts from the cost model and moves to the measured pace", "[harness][eta]") {
  Progress progress(100);
  // Before any work is done: the model's total, whatever a first slow moment took.
  CHECK(progress.eta_s(0) == Approx(100));
  CHECK(progress.eta_s(5) == Approx(100 * (5 + 10) / 10.0));
  // Half the work done in twice its estimate: the model weighs as much as a tenth of the run.
  progress.advance(50);
  CHECK(progress.eta_s(100) == Approx(50 * (100 + 10) / (50 + 10.0)));
  progress.advance(50);
  CHECK(progress.eta_s(200) == 0);
}

TEST_CASE("the time estimate counts the reference, the checks, the start and the samples expected", "[harness][eta]") {
  Config config;
  config.suites = {"kernel"};
  Overrides o;
  o.values = {{"seq", "4096"}, {"dim", "64"}, {"batch", "2"}, {"heads", "4"}, {"impl", "scan"}, {"mode", "fwd"}};
  apply_overrides(config, o);
  const Case c = expand_plan(config).front();
  RunSettings run;  // warmup 2, reps 10, min_samples 5, max_noise 1, min_sample_ms 25
  const double flops = c.op->flops(c);
  CostRates rates;
  rates.kernel_gflops = flops / 0.1 * 1e-9;  // 0.1 s a call
  rates.reference_gflops = 2.0;
  rates.input_elems_per_s = 1e7;
  rates.check_s = 0.05;
  const double ref = reference_flops(c, true);
  CHECK(ref > reference_flops(c, false));  // the gradients cost more than the forward alone
  Case chunked = c;
  chunked.impl = "chunked";
  CHECK(reference_flops(chunked, true) == ref);  // one reference algorithm, whatever the impl
  const TimeEstimate first = estimate_case_time(c, run, rates, ref);
  // The checks, the inputs (by the element: fwd_bwd's superset, as the cache makes them), the reference.
  CHECK(first.prepare_s == Approx(0.05 + double(case_input_elems(c, true)) / 1e7 + ref / 2e9));
  CHECK(first.sample_s == Approx(0.1));              // a call longer than min_sample_ms
  CHECK(first.start_s == Approx(3 * 0.1));           // cold call, two warm-up calls; no trial (a call is a sample)
  CHECK(first.samples == 5);                         // a quiet machine (no sgemm spread): min_samples
  CHECK(first.total_s() == Approx(first.prepare_s + first.start_s + 5 * 0.1));
  // A busy machine (sgemm's median 10% or more under its best) takes reps, one in between in proportion.
  rates.sgemm_spread = 0.12;
  CHECK(estimate_case_time(c, run, rates).samples == 10);
  rates.sgemm_spread = 0.07;
  CHECK(estimate_case_time(c, run, rates).samples == 8);  // 5 + 0.625 x 5, rounded
  rates.sgemm_spread = 0.0;
  // A case sharing its key's reference pays the checks alone.
  CHECK(estimate_case_time(c, run, rates).prepare_s == Approx(0.05));
  // Without a noise target every case takes reps; a timeout caps them.
  run.max_noise = 0;
  CHECK(estimate_case_time(c, run, rates).samples == 10);
  run.timeout = 0.35;
  CHECK(estimate_case_time(c, run, rates).samples == 4);
  // A memory-bound call: its bytes at the triad's rate when slower than its flops.
  rates.kernel_gflops = 1e6;
  rates.stream_gbytes_per_s = 1.0;
  const double bytes = 4.0 * double(case_input_elems(c) + case_output_elems(c));
  CHECK(estimate_case_time(c, run, rates).sample_s == Approx(std::max(bytes / 1e9, 0.0275)));
  // A short call: the sample is min_sample_ms and the calibration's 10% above it.
  rates = CostRates{1e6};
  CHECK(estimate_case_time(c, run, rates).sample_s == Approx(0.0275));
  // Its start: the short calls, then a calibration trial of a sample's length.
  const double call_s = c.op->flops(c) / 1e15;
  CHECK(estimate_case_time(c, run, rates).start_s == Approx(3 * call_s + 0.0275));
}

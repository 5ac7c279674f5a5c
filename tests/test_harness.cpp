// Harness statistics and calibration on synthetic samples and a synthetic clock.
#include <catch2/catch.hpp>

#include "src/harness.hpp"

#include <cmath>

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
  const Timing t = measure(kase, TimingSettings{3, 7, 10.0});
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

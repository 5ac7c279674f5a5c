// Harness statistics and calibration on synthetic samples and a synthetic clock.
#include <catch2/catch.hpp>

#include "harness.hpp"

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
  void read_outputs(KernelTensors&) override {}
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

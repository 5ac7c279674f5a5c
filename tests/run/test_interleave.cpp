// Interleaving (docs/harness.md): a batch's cases are prepared one after another, then sampled in
// rounds, each round over every case still sampling, so that a busy stretch of the machine meets
// several cases' samples rather than all of one case's; each case is checked and recorded right
// after its last sample.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/cancel.hpp"
#include "src/run/case_run.hpp"
#include "src/config/plan.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

Config small_config(int reps) {
  Config config;
  config.suites = {"kernel"};
  Overrides o;
  o.values = {{"seq", "16,24"}, {"dim", "4"}, {"batch", "1"}, {"heads", "1"}, {"chunk", "8"}, {"mode", "fwd"},
              {"reps", std::to_string(reps)}, {"warmup", "1"}, {"min_sample_ms", "0.05"}, {"max_noise", "0"},
              {"timeout", "0"}, {"threads", "1"}};
  apply_overrides(config, o);
  return config;
}

// Every case of the plan in one batch; `events.finished` keeps each record in `records`.
void run_plan(RunContext& ctx, const std::vector<Case>& plan, BatchEvents& events, std::map<std::size_t, CaseRecord>& records) {
  events.finished = [&](const Case& c, CaseRecord r, const std::string&) {
    records[c.plan_index] = std::move(r);
    return true;
  };
  std::vector<const Case*> batch;
  for (const Case& c : plan) batch.push_back(&c);
  run_batch(ctx, batch, events);
}

}  // namespace

TEST_CASE("a batch takes its cases' samples in rounds, each round over every case still sampling", "[interleave]") {
  RunRequest request;
  request.config = small_config(4);
  const std::vector<Case> plan = expand_plan(request.config);
  REQUIRE(plan.size() == 4);  // two seqs x scan, chunked
  auto backend = make_backend("cpu", BackendOptions{1});
  const DeviceInfo device;
  RunContext ctx{request, *backend, device, ReferenceCache(plan), TimerInfo{}};

  std::vector<std::size_t> sampled;        // plan index of each sample, in the order taken
  std::vector<std::size_t> round_ends;     // sampled.size() when each round ended
  std::vector<std::size_t> started;
  std::map<std::size_t, CaseRecord> records;
  BatchEvents events;
  events.started = [&](const Case& c) {
    CHECK(sampled.empty());  // every case is prepared before the first sample of any
    started.push_back(c.plan_index);
  };
  events.sampled = [&](const Case& c) { sampled.push_back(c.plan_index); };
  events.round_done = [&](int round, std::size_t) {
    CHECK(round == int(round_ends.size()) + 1);
    round_ends.push_back(sampled.size());
  };
  run_plan(ctx, plan, events, records);

  CHECK(started.size() == 4);
  REQUIRE(records.size() == 4);
  REQUIRE(round_ends.size() >= 4);
  // Each round holds each case still sampling once: the first four rounds hold all four cases
  // (a sample too short for its minimum starts a case's samples over, so there may be more).
  std::size_t begin = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const std::set<std::size_t> in_round(sampled.begin() + long(begin), sampled.begin() + long(round_ends[r]));
    CHECK(round_ends[r] - begin == 4);
    CHECK(in_round.size() == 4);
    begin = round_ends[r];
  }
  for (const auto& [index, r] : records) {
    INFO(case_slug(r.kase) << ": " << r.error);
    CHECK(r.status == Status::ok);
    REQUIRE(r.measured);
    CHECK(r.measured->samples_ms.size() == 4);
    CHECK(r.measured->reps == 4);
    CHECK(r.measured->stopped_on == "samples");
  }
}

TEST_CASE("a case that stops on its noise leaves the rounds while the others go on", "[interleave][noise]") {
  RunRequest request;
  request.config = small_config(6);
  request.config.run.max_noise = 100;  // every case meets it at its fewest samples
  request.config.run.min_samples = 2;
  const std::vector<Case> plan = expand_plan(request.config);
  auto backend = make_backend("cpu", BackendOptions{1});
  const DeviceInfo device;
  RunContext ctx{request, *backend, device, ReferenceCache(plan), TimerInfo{}};
  std::map<std::size_t, CaseRecord> records;
  BatchEvents events;
  run_plan(ctx, plan, events, records);
  REQUIRE(records.size() == plan.size());
  for (const auto& [index, r] : records) {
    REQUIRE(r.measured);
    CHECK(r.measured->samples_ms.size() == 2);
    CHECK(r.measured->stopped_on == "noise");
  }
}

TEST_CASE("a stop request in a batch keeps every case that has a sample, stopped_on interrupted", "[interleave][signals]") {
  RunRequest request;
  request.config = small_config(50);
  const std::vector<Case> plan = expand_plan(request.config);
  REQUIRE(plan.size() == 4);
  auto backend = make_backend("cpu", BackendOptions{1});
  const DeviceInfo device;
  RunContext ctx{request, *backend, device, ReferenceCache(plan), TimerInfo{}};
  std::map<std::size_t, CaseRecord> records;
  BatchEvents events;
  // Ten rounds, then the request a signal handler would make. (A sample too short for its
  // minimum starts a case's samples over, at most three times: ten rounds leave each case some.)
  events.round_done = [&](int round, std::size_t) {
    if (round == 10) request_stop(SIGINT);
  };
  CHECK_THROWS_AS(run_plan(ctx, plan, events, records), Interrupted);
  clear_stop_request();
  REQUIRE(records.size() == 4);  // every case had a sample: all are kept
  for (const auto& [index, r] : records) {
    INFO(case_slug(r.kase));
    CHECK(r.status == Status::ok);  // checked against the reference with the outputs of its last call
    REQUIRE(r.measured);
    CHECK(r.measured->stopped_on == "interrupted");
    CHECK(r.measured->samples_ms.size() >= 1);
    CHECK(r.measured->samples_ms.size() < 50);
    CHECK(r.measured->median_ms > 0);
    CHECK(r.measured->rel_err <= r.measured->tolerance);
    CHECK_FALSE(r.measured->blas_gflops_now);  // no sgemm re-measurement after a stop request
  }
}

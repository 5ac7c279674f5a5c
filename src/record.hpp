// What a run produces, as typed data: one record per planned case (SPEC section 4), the summary
// that answers which impl wins, and the document that holds them with the device block. Every
// figure is set once, where it is measured (src/runner.cpp); src/record_json.cpp is the one place
// these become JSON, and the one place a journal's JSON becomes records again (--resume).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "device_info.hpp"

namespace lattn {

enum class Status { ok, failed, skipped };
std::string to_string(Status status);

// The figures of a case that ran.
struct Measurement {
  double compile_s = 0;
  int warmup = 0, inner = 1, reps = 0;  // reps: the samples taken (samples_ms' length)
  std::vector<double> samples_ms;
  double noise_pct = 0;    // the median's noise the samples reached (docs/harness.md)
  std::string stopped_on = "samples";  // why no more samples were taken: "samples", "noise" or "timeout"
  double median_ms = 0, q1_ms = 0, q3_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
  int short_samples = 0;
  double rel_err = 0;  // +inf when an output held NaN or Inf
  std::map<std::string, double> rel_errs;
  double tolerance = 0;
  std::string check_failure;  // empty when the check passed
  double temp_mb = 0, arg_mb = 0, out_mb = 0;
  std::string temp_unknown;   // why temp_mb is not known (written as null beside this reason); empty when it is
  double flops = 0, gflops = 0, bytes = 0, gbytes_per_s = 0;
  std::string bwd_states;     // chunked fwd_bwd: "kept" or "recomputed"
  std::string timer_warning;  // the per-call time is near the clock's resolution
  bool cold = false;          // the L2 was flushed before each call (CUDA)
  // Against the start-up peak, the roofline, and the peak re-measured around the case (CPU).
  std::optional<double> peak_gflops, peak_fraction, roofline_gflops, roofline_fraction, peak_gflops_now,
      peak_fraction_now;
};

struct CaseRecord {
  Case kase;
  Status status = Status::skipped;
  std::string skip_reason;  // skipped: why
  std::string error;        // failed without a check: what broke
  std::optional<Measurement> measured;
};

// Per shape and mode, the fastest impl and the next, by median time.
struct Comparison {
  const CaseRecord* fastest = nullptr;
  const CaseRecord* other = nullptr;
  double speedup = 0;  // other's median over the fastest's
  // With more than two impls of the shape (a plugin's beside the built-in ones): every impl, fastest
  // first; empty otherwise.
  std::vector<const CaseRecord*> ranking = {};
};

struct WinnerChange {
  int after_seq = 0, by_seq = 0;
  std::string from, to;
};

// Along seq, for one shape without seq: who wins where.
struct Crossover {
  const CaseRecord* series = nullptr;  // a record of the series, for its shape
  std::vector<std::pair<int, std::string>> winners;  // (seq, fastest impl) in increasing seq
  std::vector<WinnerChange> changes;
};

struct Summary {
  std::vector<Comparison> comparisons;
  std::vector<Crossover> crossovers;
};

// From the records (skipped and broken ones are ignored). The summary points into `records`.
Summary build_summary(const std::vector<CaseRecord>& records);

struct Totals {
  std::size_t cases = 0, ok = 0, failed = 0, skipped = 0;
  std::size_t not_planned = 0;  // cases of the config that --filter left out
};

struct RunDocument {
  std::string version;  // lattnbench's
  std::string created_utc;
  std::vector<std::string> argv;
  nlohmann::json config;  // the resolved config, as src/config.cpp writes it
  DeviceInfo device;
  std::vector<CaseRecord> results;
  Totals totals;
  std::vector<std::string> warnings;
  std::optional<std::pair<int, int>> shard;  // (index, count)
  std::string interrupted_by;                // "SIGINT" / "SIGTERM" when interrupted
  std::string filter;                        // --filter's expression, when given
};

}  // namespace lattn

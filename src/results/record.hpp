// What a run produces, as typed data: one record per planned case (docs/spec.md section 4), the summary
// that answers which impl wins, and the document that holds them with the device block. Every
// figure is set once, where it is measured (src/run/runner.cpp); src/results/record_json.cpp is the one place
// these become JSON, and the one place a journal's JSON becomes records again (--resume).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "src/results/device_info.hpp"

namespace lattn {

// unchecked: ran and was timed, its outputs not checked because they are not results (a case on
// counted AMX tiles, kernels/cpu/amx_counted.hpp); never a pass.
enum class Status { ok, failed, skipped, unchecked };

// A case this far above its compute ceiling is flagged (Measurement::above_ceiling): timing noise
// can lift a kernel at the ceiling a few percent over it, but not more.
inline constexpr double kAboveCeiling = 1.05;
std::string to_string(Status status);

// The figures of a case that ran.
struct Measurement {
  double compile_s = 0;
  int warmup = 0, inner = 1, reps = 0;  // reps: the samples taken (samples_ms' length)
  std::vector<double> samples_ms;
  std::vector<double> samples_cpu_ms;  // per-call process CPU time of each sample; empty in older journals
  double noise_pct = 0;    // the median's noise the samples reached (docs/harness.md)
  std::string stopped_on = "samples";  // why no more samples were taken: "samples", "noise" or "timeout"
  double median_ms = 0, q1_ms = 0, q3_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
  int short_samples = 0;
  double rel_err = 0;  // +inf when an output held NaN or Inf
  std::map<std::string, double> rel_errs;
  double tolerance = 0;
  std::string check_failure;  // empty when the check passed
  std::string unchecked;      // why the outputs were not checked (Status::unchecked), or empty
  // The (sequence, head) pairs whose outputs were checked when the run checked a part (check_heads,
  // docs/harness.md); 0: every output element was checked.
  int checked_pairs = 0;
  double temp_mb = 0, arg_mb = 0, out_mb = 0;
  std::string temp_unknown;   // why temp_mb is not known (written as null beside this reason); empty when it is
  // What counted temp_mb when it is known: "counting_allocator" (lattnbench's, every built-in kernel
  // and C plugin), or a Python impl's library: "tracemalloc" (the Python heap's peak, NumPy's
  // buffers among it), "torch.cuda", "jax.memory_stats" (docs/plugins.md).
  std::string temp_source;
  std::string layout;         // the layout a plugin impl took its tensors in, where not lattnbench's ("BTHD")
  std::optional<double> layout_copy_mb;  // MiB converted into and out of that layout, untimed
  double flops = 0, gflops = 0, bytes = 0, gbytes_per_s = 0;
  std::string bwd_states;     // chunked fwd_bwd: "kept" or "recomputed"
  std::string variant;        // the kernel variant that ran the case (ImplRow::variant), or ""
  // A variant on AMX tiles (Backend::amx_tiles): which ran, "hardware", "emulated" or "counted".
  std::string amx_tiles;
  // On counted tiles: the tile instructions one call executes ("tdpbf16ps", "tileloadd",
  // "tileloadd_bytes", "tilestored", "tilestored_bytes", "tilezero"), and the time the tdpbf16ps
  // would take at tile_rate_gflops, which tile_rate_source names: "amx_gflops" (the device block's,
  // measured), or the documented 1024 flops a cycle a core at the host's cpu_mhz and the run's
  // threads, where no AMX rate was measured.
  std::map<std::string, std::uint64_t> tile_counts;
  std::optional<double> tile_model_ms, tile_rate_gflops;
  std::string tile_rate_source;
  std::string timer_warning;  // the per-call time is near the clock's resolution
  // An op with a byte model (the decode step): the rate against the run's measured bandwidth, the
  // tokens stepped per second (batch x tokens per call) and the time per token of one sequence
  // (the call's time over its tokens); bandwidth_roof names the roof the fraction is taken against
  // (src/run/bandwidth_roof.hpp): "dram" for a cold case; for a warm one the start-up sweep's level
  // that holds its working set ("l1", "l2", ...), or "dram" past them all, at the sweep's rate at
  // that working set.
  std::optional<double> bandwidth_fraction, tokens_per_s, us_per_token;
  // A cold case's DRAM rate re-measured just before and after it (the larger; Backend::stream_check):
  // its `dram` roof is the larger of this and the start-up triad.
  std::optional<double> stream_gbytes_per_s_now;
  std::string bandwidth_roof;
  // The roof's rate (bandwidth_fraction's denominator) and the working set it was read at: what a
  // call keeps touching, its outputs (the states stepped in place among them) and its scratch.
  std::optional<double> bandwidth_roof_gbytes_per_s, working_set_bytes;
  // bandwidth_fraction above kAboveCeiling: faster than the roof, so the roof was mismeasured.
  bool above_roof = false;
  // Against the compute ceiling (the device block's peak_gflops), the roofline, the BLAS's start-up
  // sgemm, and the sgemm re-measured around the case (CPU).
  std::optional<double> peak_gflops, peak_fraction, roofline_gflops, roofline_fraction, blas_gflops, blas_fraction,
      blas_gflops_now, blas_fraction_now;
  // peak_fraction above kAboveCeiling: faster than the hardware can be, so the ceiling was mismeasured.
  bool above_ceiling = false;
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
  // The records that did not pass (failed, skipped, or recorded without a sample), in run order:
  // out of every comparison, named beside them.
  std::vector<const CaseRecord*> not_compared;
};

// Whether a record takes part in the summary's comparisons: it ran, passed its check and has samples.
// A kernel that computes the wrong answer, or was not measured, wins and loses nothing.
bool passed(const CaseRecord& record);

// Why a record did not pass (its check failure, error or skip reason), "" when it passed.
std::string why_not_passed(const CaseRecord& record);

// From the records that passed; the rest are listed in not_compared. The summary points into `records`.
Summary build_summary(const std::vector<CaseRecord>& records);

struct Totals {
  std::size_t cases = 0, ok = 0, failed = 0, skipped = 0, unchecked = 0;
  std::size_t not_planned = 0;  // cases of the config that --filter left out
};

struct RunDocument {
  std::string version;  // lattnbench's
  std::string created_utc;
  std::vector<std::string> argv;
  nlohmann::json config;  // the resolved config, as src/config/config.cpp writes it
  DeviceInfo device;
  std::vector<CaseRecord> results;
  Totals totals;
  std::vector<std::string> warnings;
  std::optional<std::pair<int, int>> shard;  // (index, count)
  std::string interrupted_by;                // "SIGINT" / "SIGTERM" when interrupted
  std::string filter;                        // --filter's expression, when given
};

}  // namespace lattn

#include "runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "backend.hpp"
#include "check.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "cost.hpp"
#include "environment.hpp"
#include "harness.hpp"
#include "interrupt.hpp"
#include "isolate.hpp"
#include "journal.hpp"
#include "npy.hpp"
#include "plan.hpp"
#include "record_json.hpp"
#include "report.hpp"
#include "run_files.hpp"
#include "summary.hpp"

namespace lattn {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, format, &tm);
  return buffer;
}

std::string describe(const Case& c) {
  const Op& op = *c.op;
  std::string out = fmt::format("{} {} {} B{} H{} T{} D{}", op.suite, c.impl, to_string(c.mode), c.batch, c.heads,
                                c.seq, c.dim);
  if (op.has(Param::chunk)) out += fmt::format(" C{}", c.chunk);
  if (op.has(Param::window)) out += fmt::format(" W{}", c.window);
  if (op.has(Param::decay)) out += " decay=" + c.decay;
  for (const auto& [name, value] : c.options) out += " " + name + "=" + value;
  return out;
}

// The case's folder name under --dump: its plan index and identity.
std::string case_slug(const Case& c) {
  const Op& op = *c.op;
  std::string slug = fmt::format("{:03d}-{}-{}-{}-b{}h{}t{}d{}", c.plan_index, op.suite, c.impl, to_string(c.mode),
                                 c.batch, c.heads, c.seq, c.dim);
  if (op.has(Param::chunk)) slug += fmt::format("c{}", c.chunk);
  if (op.has(Param::window)) slug += fmt::format("w{}", c.window);
  if (op.has(Param::decay)) slug += "-" + c.decay;
  for (const auto& [name, value] : c.options) slug += "-" + name + value;
  return slug;
}

std::string format_duration(double seconds) {
  const long s = std::lround(seconds);
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

// What a case's inputs and float64 reference depend on: its op, shape, decay, window, options, dtype;
// never its impl, mode or chunk (every form computes the same thing).
std::string reference_key(const Case& c) {
  std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", c.op->name, c.batch, c.heads, c.seq, c.dim, c.window,
                                c.decay, c.dtype);
  for (const auto& [name, value] : c.options) key += "|" + name + "=" + value;
  return key;
}

// Inputs and the float64 reference for the key last seen: the forms and modes of one shape come
// one after another in the plan and share them. The first case of a key computes the gradients
// too when any case of that key needs them, so that the (slow) float64 reference runs once.
class ReferenceCache {
 public:
  struct Entry {
    TensorSet inputs;  // every input and cotangent (fwd_bwd's superset)
    Reference reference;
  };

  explicit ReferenceCache(const std::vector<Case>& plan) {
    for (const Case& c : plan)
      if (c.backward()) backward_keys_.insert(reference_key(c));
  }

  const Entry& get(const Case& c, std::uint64_t seed) {
    const std::string key = reference_key(c);
    const bool backward = c.backward() || backward_keys_.count(key);
    if (!entry_ || key != key_ || (backward && !entry_->reference.has_backward)) {
      entry_.reset();  // free the old shape's tensors before making the new ones
      auto entry = std::make_unique<Entry>();
      entry->inputs = make_case_inputs(c, seed);
      entry->reference = c.op->reference(c, entry->inputs, backward);
      entry_ = std::move(entry);
      key_ = key;
    }
    return *entry_;
  }

 private:
  std::set<std::string> backward_keys_;
  std::string key_;
  std::unique_ptr<Entry> entry_;
};

// Host bytes the run itself holds for a case beyond the backend: the cached inputs (float32), their
// float64 copies and the case's own input copy; the float64 reference outputs and the outputs read
// back. Counted for fwd_bwd's tensors whatever the mode, as the cache holds them.
std::size_t host_estimate(const Case& c) {
  return case_input_elems(c, true) * (4 + 8 + 4) + case_output_elems(c, true) * (8 + 4);
}

std::optional<std::string> memory_guard(const Backend& backend, const ImplRow& row, const Case& c) {
  const double backend_need = row.memory_estimate ? double(row.memory_estimate(c)) : 0.0;
  const double host_need = double(host_estimate(c)) + (backend.memory_is_host ? backend_need : 0.0);
  const double host_free = double(available_host_memory());
  if (host_need > host_free)
    return fmt::format("needs about {:.0f} MiB of host memory, {:.0f} MiB available", host_need / kMiB, host_free / kMiB);
  if (!backend.memory_is_host && backend.memory_available) {
    const double free = double(backend.memory_available());
    if (backend_need > free)
      return fmt::format("needs about {:.0f} MiB of {} memory, {:.0f} MiB free", backend_need / kMiB, backend.name,
                         free / kMiB);
  }
  return std::nullopt;
}

void dump_case(const std::string& dir, const Case& c, const TensorSet& inputs, const TensorSet& outputs) {
  const std::filesystem::path folder = std::filesystem::path(dir) / case_slug(c);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw_file_error("cannot make the dump folder " + folder.string(), ec.value());
  for (const TensorSet* set : {&inputs, &outputs})
    for (const Tensor& t : *set) write_npy((folder / (t.name + ".npy")).string(), t.data.data(), t.shape);
}

struct RunContext {
  const RunRequest& request;
  Backend& backend;
  const DeviceInfo& device;
  ReferenceCache cache;
  TimerInfo timer;
};

// Times, checks and measures one case the row can run: the record of SPEC section 4.
Measurement run_case(RunContext& ctx, const ImplRow& row, const Case& c) {
  const auto& run = ctx.request.config.run;
  const auto& shared = ctx.cache.get(c, run.seed);
  throw_if_stop_requested();
  const TensorSet inputs = shared.inputs.inputs_for(c.mode);
  auto prepared = row.prepare(c, inputs);
  const Timing timing = measure(*prepared, TimingSettings{run.warmup, run.reps, run.min_sample_ms});
  TensorSet outputs = make_case_outputs(c);
  prepared->read_outputs(outputs);
  const CheckResult check = check_outputs(c, outputs, shared.reference);
  const MemoryUsage memory = prepared->memory();

  Measurement m;
  m.check_failure = check.failure();
  m.compile_s = timing.compile_s;
  m.warmup = run.warmup;
  m.inner = timing.inner;
  m.reps = run.reps;
  m.samples_ms = timing.samples_ms;
  m.median_ms = timing.stats.median;
  m.q1_ms = timing.stats.q1;
  m.q3_ms = timing.stats.q3;
  m.min_ms = timing.stats.min;
  m.max_ms = timing.stats.max;
  m.mean_ms = timing.stats.mean;
  m.short_samples = timing.short_samples;
  m.rel_err = check.rel_err;
  m.rel_errs = check.per_output;
  m.tolerance = check.tolerance;
  m.temp_mb = double(memory.temp_bytes) / kMiB;
  m.arg_mb = double(memory.arg_bytes) / kMiB;
  m.out_mb = double(memory.out_bytes) / kMiB;
  const double seconds = timing.stats.median * 1e-3;
  m.flops = c.op->flops(c);
  m.bytes = case_min_bytes(memory);
  m.gflops = seconds > 0 ? m.flops / seconds * 1e-9 : 0.0;
  m.gbytes_per_s = seconds > 0 ? m.bytes / seconds * 1e-9 : 0.0;
  m.bwd_states = prepared->bwd_states();
  if (timing.stats.median * 1e6 < 10 * ctx.timer.resolution_ns)
    m.timer_warning = fmt::format("per-call time {:.1f} ns is within 10x of the timer's resolution ({:.1f} ns)",
                                  timing.stats.median * 1e6, ctx.timer.resolution_ns);
  m.cold = run.cold;

  // Against the start-up peak, and the roofline: the rate a case of this arithmetic intensity can
  // reach at the measured bandwidth, if that is below the compute peak (memory-bound: small D,
  // long sequences).
  const double peak = ctx.device.peak_gflops(), stream = ctx.device.stream_gbytes_per_s();
  if (peak > 0) {
    m.peak_gflops = peak;
    m.peak_fraction = m.gflops / peak;
    if (stream > 0 && m.bytes > 0 && m.flops > 0) {
      const double roof = std::min(peak, m.flops / m.bytes * stream);
      m.roofline_gflops = roof;
      m.roofline_fraction = m.gflops / roof;
    }
  }
  if (!ctx.request.dump_dir.empty()) dump_case(ctx.request.dump_dir, c, inputs, outputs);
  return m;
}

CaseRecord skipped(const Case& c, std::string why) {
  CaseRecord r;
  r.kase = c;
  r.status = Status::skipped;
  r.skip_reason = std::move(why);
  return r;
}

}  // namespace

std::string default_out_path(const std::string& backend, const std::string& utc_compact) {
  return "results/lattnbench-" + backend + "-" + utc_compact + ".json";
}

std::string journal_path_for(const std::string& out_path) { return out_path + ".journal.jsonl"; }

int run_benchmarks(const RunRequest& request) {
  const Config& config = request.config;
  std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  std::vector<std::string> argv = request.argv;
  const bool resuming = !request.resume_path.empty();
  if (resuming && request.force)
    throw UsageError("--force", "starts over, and --resume continues the journal: give one of them");

  // A resumed run keeps the start time, command line and result path of the run it continues.
  nlohmann::json resumed_header;
  if (resuming) resumed_header = read_journal(request.resume_path).header;
  std::string out_path = request.out_path;
  if (resuming) {
    const std::string theirs = resumed_header.value("out_path", "");
    if (!out_path.empty() && !theirs.empty() &&
        std::filesystem::path(out_path).lexically_normal() != std::filesystem::path(theirs).lexically_normal())
      throw UsageError("--out", "the journal " + request.resume_path + " is of the run writing " + theirs +
                                    ": resume it with that --out (or none)");
    if (out_path.empty()) out_path = theirs;
  }
  if (out_path.empty()) out_path = default_out_path(config.run.backend, utc_now("%Y%m%dT%H%M%SZ"));
  const OutputFormat out_format = format_for_path(out_path, "--out");
  const RunFiles files{out_path, request.gbench_path, request.dump_dir,
                       resuming ? request.resume_path : journal_path_for(out_path)};
  check_run_files(files, resuming);

  BackendOptions options{config.run.threads, config.run.device, config.run.cold, config.run.bwd_states == "kept"};
  options.plugins = request.plugins;
  auto backend = make_backend(config.run.backend, options);
  const Availability availability = backend->availability();
  if (!availability.available) throw UsageError("--backend " + config.run.backend, availability.reason);
  RunDocument document;
  document.device = backend->describe();
  const DeviceInfo& device = document.device;

  const std::vector<Case> full_plan = expand_plan(config);
  const std::vector<Case> plan = select_shard(full_plan, request.shard);
  const nlohmann::json shard_json =
      request.shard.active() ? nlohmann::json{{"index", request.shard.index}, {"count", request.shard.count}} : nlohmann::json();

  nlohmann::json header = {{"journal", "lattnbench"}, {"schema_version", kSchemaVersion}, {"created_utc", started},
                           {"argv", argv},           {"out_path", out_path},            {"config", to_json(config)},
                           {"shard", shard_json},     {"plan_size", full_plan.size()},   {"device", device_fingerprint(device)}};
  // From here on the run writes: its folders, then the lock, then the journal.
  PreparedFolders folders(files);
  const RunLock lock(files);
  std::map<std::size_t, CaseRecord> done;
  if (resuming) {
    const JournalContents contents = read_journal(files.journal);
    done = resumed_records(contents, header, full_plan, plan, files.journal);
    cut_partial_line(files.journal, contents);
    started = resumed_header.value("created_utc", started);
    argv = resumed_header.value("argv", argv);
  } else {
    check_no_unfinished_journal(files.journal, request.force);
  }
  Journal journal(files.journal, header, resuming);
  folders.keep();

  const double peak_gflops = device.peak_gflops(), sgemm_median_gflops = device.sgemm_median_gflops();
  std::vector<std::string> warnings = environment_warnings(device.host.build_type);
  if (std::string w = peak_spread_warning(peak_gflops, sgemm_median_gflops); !w.empty()) warnings.push_back(std::move(w));
  for (const auto& w : warnings) fmt::print(stderr, "lattnbench: warning: {}\n", w);

  RunContext ctx{request, *backend, device, ReferenceCache(plan), measure_steady_clock()};
  double total_cost = 0, done_cost = 0;
  for (const auto& c : plan) total_cost += case_cost_estimate(c);

  install_interrupt_handlers();
  std::vector<CaseRecord>& results = document.results;
  results.reserve(plan.size());
  document.totals.cases = plan.size();
  const auto run_start = std::chrono::steady_clock::now();
  bool any_failed = false;
  std::size_t position = 0;
  std::string write_failure;  // what the disk refused (EnvironmentError): the run stops there

  for (const Case& c : plan) {
    ++position;
    if (stop_requested()) break;
    CaseRecord record;
    std::string note;
    const ImplRow* row = backend->find(c.op->name, c.impl);
    if (auto it = done.find(c.plan_index); it != done.end()) {
      record = it->second;
      note = "from the journal";
    } else if (auto why = backend->unsupported(c)) {
      record = skipped(c, *why);
      note = "skipped: " + *why;
    } else if (auto too_big = memory_guard(*backend, *row, c)) {
      record = skipped(c, "memory: " + *too_big);
      note = "skipped: memory: " + *too_big;
    } else {
      record.kase = c;
      try {
        const std::optional<double> peak_before = backend->peak_check ? backend->peak_check() : std::nullopt;
        // --isolate: a plugin's case in a child process, its inputs and reference made here first.
        const bool isolated = request.isolate && is_plugin_impl_name(c.impl);
        if (isolated) ctx.cache.get(c, config.run.seed);
        Measurement m = isolated ? run_isolated(c, [&] { return run_case(ctx, *row, c); }) : run_case(ctx, *row, c);
        const std::optional<double> peak_after = backend->peak_check ? backend->peak_check() : std::nullopt;
        if (peak_before && peak_after) {
          m.peak_gflops_now = std::max(*peak_before, *peak_after);
          m.peak_fraction_now = m.gflops / *m.peak_gflops_now;
        }
        record.status = m.check_failure.empty() ? Status::ok : Status::failed;
        note = fmt::format("median {:.4f} ms, rel_err {:.2e}", m.median_ms, m.rel_err);
        if (record.status == Status::failed) note += " FAILED: " + m.check_failure;
        record.measured = std::move(m);
      } catch (const Interrupted&) {
        break;
      } catch (const EnvironmentError& e) {  // its dump did not fit: the case runs again on --resume
        write_failure = e.what();
        break;
      } catch (const std::bad_alloc&) {
        record = skipped(c, "memory: an allocation failed");
        note = "skipped: memory: an allocation failed";
      } catch (const std::exception& e) {
        record.status = Status::failed;
        record.error = e.what();
        record.measured.reset();
        note = std::string("FAILED: ") + e.what();
      }
    }
    if (!done.count(c.plan_index)) {
      try {
        journal.append(to_json(record));
      } catch (const EnvironmentError& e) {  // the case finished: the result file keeps it if it can
        write_failure = e.what();
      }
    }
    switch (record.status) {
      case Status::ok: ++document.totals.ok; break;
      case Status::failed: ++document.totals.failed; break;
      case Status::skipped: ++document.totals.skipped; break;
    }
    any_failed = any_failed || record.status == Status::failed;
    results.push_back(std::move(record));
    if (!write_failure.empty()) break;

    done_cost += case_cost_estimate(c);
    if (!request.quiet) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = done_cost > 0 ? elapsed * (total_cost - done_cost) / done_cost : 0.0;
      fmt::print(stderr, "[{}/{}] {}: {} (elapsed {}, ETA {})\n", position, plan.size(), describe(c), note,
                 format_duration(elapsed), format_duration(eta));
      std::fflush(stderr);
    }
  }

  if (const std::string w = above_peak_warning(results, peak_gflops, sgemm_median_gflops); !w.empty()) {
    warnings.push_back(w);
    fmt::print(stderr, "lattnbench: warning: {}\n", w);
  }

  const int signal = stop_signal();
  document.device.timer = ctx.timer;
  document.version = device.host.version;
  document.created_utc = started;
  document.argv = argv;
  document.config = to_json(config);
  document.warnings = warnings;
  if (request.shard.active()) document.shard = std::make_pair(request.shard.index, request.shard.count);
  if (!write_failure.empty()) document.interrupted_by = "write error";
  else if (signal) document.interrupted_by = signal == SIGINT ? "SIGINT" : "SIGTERM";
  std::string output_failure;  // the result file or the export did not fit
  try {
    write_file_atomically(out_path, render(document, out_format));
    if (!request.gbench_path.empty()) write_file_atomically(request.gbench_path, to_gbench(document).dump(2) + "\n");
  } catch (const EnvironmentError& e) {
    output_failure = e.what();
  }
  if (!write_failure.empty() || !output_failure.empty()) {
    // Exit 4 (main): the finished cases are in the journal (all but one the disk refused, which
    // the result file has when it could be written), and --resume finishes the run.
    const std::string first = write_failure.empty() ? output_failure : write_failure;
    const std::string also = write_failure.empty() || output_failure.empty() ? "" : " (and " + output_failure + ")";
    throw EnvironmentError(first + also + "; the cases finished are kept in " + files.journal +
                           ": make room, then run the same command with --resume " + files.journal);
  }
  // A complete run needs its journal no more; an interrupted one keeps it for --resume.
  if (!signal) std::filesystem::remove(files.journal);

  fmt::print("{}", render(document, request.stdout_format));
  if (request.stdout_format == OutputFormat::table) fmt::print("results: {}\n", out_path);
  if (signal) {
    fmt::print(stderr, "lattnbench: interrupted after {} of {} cases; resume with --resume {}\n", results.size(),
               plan.size(), files.journal);
    return 128 + signal;
  }
  return any_failed ? 1 : 0;
}

}  // namespace lattn

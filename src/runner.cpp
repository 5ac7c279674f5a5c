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
#include "case_run.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "cost.hpp"
#include "environment.hpp"
#include "harness.hpp"
#include "interrupt.hpp"
#include "isolate.hpp"
#include "journal.hpp"
#include "plan.hpp"
#include "python_plugin.hpp"
#include "record_json.hpp"
#include "report.hpp"
#include "run_files.hpp"
#include "summary.hpp"

namespace lattn {
namespace {

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, format, &tm);
  return buffer;
}

std::string format_duration(double seconds) {
  const long s = std::lround(seconds);
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

BackendOptions backend_options(const RunRequest& request) {
  const RunSettings& run = request.config.run;
  BackendOptions options{run.threads, run.device, run.cold, run.bwd_states == "kept"};
  options.plugins = request.plugins;
  return options;
}

}  // namespace

std::string list_cases(const RunRequest& request) {
  const Config& config = request.config;
  const std::vector<Case> full_plan = expand_plan(config);
  const std::vector<Case> chosen = filter_plan(full_plan, request.filter);
  const std::vector<Case> plan = select_shard(chosen, request.shard);
  auto backend = make_backend(config.run.backend, backend_options(request));
  const Availability availability = backend->availability();
  // The quick re-measurement of the peak the runner takes around each case, not the device block's.
  const std::optional<double> peak =
      availability.available && backend->peak_check ? backend->peak_check() : std::optional<double>();
  std::string out = fmt::format("{} cases", plan.size());
  if (full_plan.size() != plan.size()) out += fmt::format(" of the config's {}", full_plan.size());
  if (!request.filter.empty()) out += fmt::format("; {} not planned (--filter {})", full_plan.size() - chosen.size(), request.filter);
  if (request.shard.active()) out += fmt::format("; shard {}/{}", request.shard.index, request.shard.count);
  out += peak ? fmt::format("; estimated at the sgemm peak of {:.1f} GFLOP/s (best of 10 products)\n", *peak)
              : fmt::format("; no sgemm peak measured ({}): estimated from min_sample_ms alone\n",
                            availability.available ? "the backend has none" : availability.reason);
  double total = 0;
  for (const Case& c : plan) {
    const TimeEstimate e = estimate_case_time(c, config.run, peak.value_or(0.0));
    total += e.total_s();
    const std::optional<std::string> why = availability.available ? backend->unsupported(c) : std::nullopt;
    out += fmt::format("{}  {:>8.1f} s  {:>10.4g} GFLOP{}\n", case_slug(c), e.total_s(), c.op->flops(c) * 1e-9,
                       why ? "  (skipped here: " + *why + ")" : "");
  }
  out += fmt::format("estimated total {} (the float64 references and checks not counted)\n", format_duration(total));
  return out;
}

std::string default_out_path(const std::string& backend, const std::string& utc_compact) {
  return "results/lattnbench-" + backend + "-" + utc_compact + ".json";
}

std::string journal_path_for(const std::string& out_path) { return out_path + ".journal.jsonl"; }

int run_benchmarks(const RunRequest& request) {
  const Config& config = request.config;
  std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  std::vector<std::string> argv = request.argv;
  const bool resuming = !request.resume_path.empty();
  const std::vector<Case> full_plan = expand_plan(config);
  const std::vector<Case> chosen = filter_plan(full_plan, request.filter);  // a bad --filter: exit 2 before any write
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

  auto backend = make_backend(config.run.backend, backend_options(request));
  const Availability availability = backend->availability();
  if (!availability.available) throw UsageError("--backend " + config.run.backend, availability.reason);
  RunDocument document;
  document.device = backend->describe();
  const DeviceInfo& device = document.device;

  const std::vector<Case> plan = select_shard(chosen, request.shard);
  const nlohmann::json shard_json =
      request.shard.active() ? nlohmann::json{{"index", request.shard.index}, {"count", request.shard.count}} : nlohmann::json();

  nlohmann::json header = {{"journal", "lattnbench"}, {"schema_version", kSchemaVersion}, {"created_utc", started},
                           {"argv", argv},           {"out_path", out_path},            {"config", to_json(config)},
                           {"shard", shard_json},     {"plan_size", full_plan.size()},   {"device", device_fingerprint(device)},
                           {"filter", request.filter}};
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
  if (config.run.slowdown > 0)
    warnings.push_back(fmt::format("--slowdown {}: every call was made {}% slower on purpose (a testing aid of the "
                                   "regression gate, docs/harness.md); these times are not the kernels'",
                                   config.run.slowdown, config.run.slowdown));
  for (const auto& w : warnings) fmt::print(stderr, "lattnbench: warning: {}\n", w);

  RunContext ctx{request, *backend, device, ReferenceCache(plan), measure_steady_clock()};
  // The ETA starts from the cost model (docs/cli.md) and moves to what the cases take.
  std::map<std::size_t, TimeEstimate> estimates;
  std::map<std::size_t, double> advanced;  // the estimated seconds each case has counted so far
  double total_estimate = 0;
  for (const auto& c : plan)
    if (!done.count(c.plan_index)) total_estimate += (estimates[c.plan_index] = estimate_case_time(c, config.run, peak_gflops)).total_s();
  Progress progress(total_estimate);
  const auto advance = [&](const Case& c, double seconds) {
    progress.advance(seconds);
    advanced[c.plan_index] += seconds;
  };

  install_interrupt_handlers();
  std::vector<CaseRecord>& results = document.results;
  results.reserve(plan.size());
  document.totals.cases = plan.size();
  document.totals.not_planned = full_plan.size() - chosen.size();
  const auto run_start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count(); };
  const auto timing_note = [&] {
    return fmt::format("elapsed {}, ETA {}", format_duration(elapsed()), format_duration(progress.eta_s(elapsed())));
  };
  if (!request.quiet) {
    fmt::print(stderr, "lattnbench: {} cases{}, estimated {} (cost model: each call's flops at the sgemm peak, "
               "each sample at least min_sample_ms){}\n", plan.size(),
               document.totals.not_planned ? fmt::format(" ({} not planned: --filter)", document.totals.not_planned) : "",
               format_duration(total_estimate), config.run.interleave ? "; samples in rounds over the cases" : "");
    std::fflush(stderr);
  }
  bool any_failed = false;
  std::string write_failure;  // what the disk refused (EnvironmentError): the run stops there

  // A case's end: its journal line (unless it came from the journal), its totals and progress line.
  const auto finished = [&](const Case& c, CaseRecord record, const std::string& note) -> bool {
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
    if (const auto it = estimates.find(c.plan_index); it != estimates.end()) advance(c, it->second.total_s() - advanced[c.plan_index]);
    if (!request.quiet) {
      fmt::print(stderr, "[{}/{}] {}: {} ({})\n", results.size(), plan.size(), case_slug(c), note, timing_note());
      std::fflush(stderr);
    }
    return write_failure.empty();
  };
  BatchEvents events;
  events.finished = finished;
  events.started = [&](const Case& c) { advance(c, estimates.at(c.plan_index).start_s); };
  events.sampled = [&](const Case& c) { advance(c, estimates.at(c.plan_index).sample_s); };
  std::vector<const Case*> batch;
  events.round_done = [&](int round, std::size_t sampling) {
    if (request.quiet || batch.size() < 2) return;
    fmt::print(stderr, "round {}: {} of the batch's {} cases still sampling ({})\n", round, sampling, batch.size(),
               timing_note());
    std::fflush(stderr);
  };

  // Batches of cases whose samples are taken in rounds: with --interleave, consecutive cases while
  // their memory fits in half of what is free when the batch starts; else one case at a time.
  MemoryNeed budget, held;
  const auto run_pending = [&]() -> bool {
    if (batch.empty()) return true;
    try {
      run_batch(ctx, batch, events);
    } catch (const Interrupted&) {
      return false;
    } catch (const EnvironmentError& e) {  // a dump did not fit: the case runs again on --resume
      write_failure = e.what();
      return false;
    }
    batch.clear();
    held = MemoryNeed{};
    return write_failure.empty() && !stop_requested();
  };
  bool going = true;
  for (const Case& c : plan) {
    if (stop_requested()) {
      going = false;
      break;
    }
    const ImplRow* row = backend->find(c.op->name, c.impl);
    if (auto it = done.find(c.plan_index); it != done.end()) {
      going = finished(c, it->second, "from the journal");
    } else if (auto why = backend->unsupported(c)) {
      going = finished(c, skipped(c, *why), "skipped: " + *why);
    } else if (auto too_big = memory_guard(*backend, *row, c)) {
      going = finished(c, skipped(c, "memory: " + *too_big), "skipped: memory: " + *too_big);
    } else if (request.isolate && is_plugin_impl_name(c.impl)) {
      // --isolate: a plugin's case alone in a child process, its inputs and reference made here first.
      if (!(going = run_pending())) break;
      try {
        const std::optional<double> before = backend->peak_check ? backend->peak_check() : std::nullopt;
        ctx.cache.get(c, config.run.seed);
        Measurement m = run_isolated(c, [&] { return run_case(ctx, *row, c); });
        const std::optional<double> after = backend->peak_check ? backend->peak_check() : std::nullopt;
        std::string note;
        CaseRecord record = measured_record(c, std::move(m), before, after, note);
        going = finished(c, std::move(record), note);
      } catch (const Interrupted&) {
        going = false;
      } catch (const EnvironmentError& e) {
        write_failure = e.what();
        going = false;
      } catch (...) {
        std::string note;
        CaseRecord record = failure_record(c, std::current_exception(), note);
        going = finished(c, std::move(record), note);
      }
    } else {
      // A plugin's case is a batch of its own: a crash in it ends the process, and in a shared
      // batch would take the cases sampled beside it, unfinished, with it (docs/plugins.md).
      const bool alone = is_plugin_impl_name(c.impl);
      const MemoryNeed need = memory_need(*backend, *row, c);
      const bool fits = held.host + need.host <= budget.host && (budget.device == 0 || held.device + need.device <= budget.device);
      if (!batch.empty() && (!config.run.interleave || !fits || alone) && !(going = run_pending())) break;
      if (batch.empty()) {
        budget.host = double(available_host_memory()) / 2;
        budget.device = !backend->memory_is_host && backend->memory_available ? double(backend->memory_available()) / 2 : 0;
      }
      batch.push_back(&c);
      held.host += need.host;
      held.device += need.device;
      if (alone) going = run_pending();
    }
    if (!going) break;
  }
  if (going) run_pending();
  std::sort(results.begin(), results.end(),
            [](const CaseRecord& a, const CaseRecord& b) { return a.kase.plan_index < b.kase.plan_index; });

  if (const std::string w = above_peak_warning(results, peak_gflops, sgemm_median_gflops); !w.empty()) {
    warnings.push_back(w);
    fmt::print(stderr, "lattnbench: warning: {}\n", w);
  }

  const int signal = stop_signal();
  document.device.timer = ctx.timer;
  document.device.python = python_bridge_info();
  document.version = device.host.version;
  document.created_utc = started;
  document.argv = argv;
  document.config = to_json(config);
  document.warnings = warnings;
  document.filter = request.filter;
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
  if (request.stdout_format == OutputFormat::table) {
    const Totals& t = document.totals;
    fmt::print("cases: {} ok, {} failed, {} skipped of {}{}\nresults: {}\n", t.ok, t.failed, t.skipped, t.cases,
               request.filter.empty() ? "" : fmt::format("; {} not planned (--filter {})", t.not_planned, request.filter),
               out_path);
  }
  if (signal) {
    fmt::print(stderr, "lattnbench: interrupted after {} of {} cases; resume with --resume {}\n", results.size(),
               plan.size(), files.journal);
    return 128 + signal;
  }
  return any_failed ? 1 : 0;
}

}  // namespace lattn

#include "src/run/runner.hpp"

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

#include "src/run/backend.hpp"
#include "src/run/case_run.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "src/run/cost.hpp"
#include "src/results/environment.hpp"
#include "src/run/harness.hpp"
#include "src/run/interrupt.hpp"
#include "src/run/isolate.hpp"
#include "src/results/journal.hpp"
#include "src/config/plan.hpp"
#include "src/run/progress_line.hpp"
#include "src/plugins/python_plugin.hpp"
#include "src/results/record_json.hpp"
#include "src/results/report.hpp"
#include "src/results/run_files.hpp"
#include "src/results/summary.hpp"

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
  BackendOptions options{run.threads, run.device, run.bwd_states == "kept"};
  options.plugins = request.plugins;
  options.tuning = request.tuning;
  options.amx_tiles = request.amx_tiles;
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
  std::size_t name_width = 4;  // the names differ in length: the figures aligned after the longest
  for (const Case& c : plan) name_width = std::max(name_width, case_slug(c).size());
  if (!plan.empty()) out += fmt::format("{:<{}}  {:>10}  {:>16}\n", "case", name_width, "estimated", "work");
  for (const Case& c : plan) {
    const TimeEstimate e = estimate_case_time(c, config.run, CostRates{peak.value_or(0.0)});
    total += e.total_s();
    const std::optional<std::string> why = availability.available ? backend->unsupported(c) : std::nullopt;
    const std::string variant = availability.available && !why ? backend->variant(c) : std::string();
    out += fmt::format("{:<{}}  {:>8.1f} s  {:>10.4g} GFLOP{}{}\n", case_slug(c), name_width, e.total_s(),
                       c.op->flops(c) * 1e-9, variant.empty() ? "" : "  variant " + variant,
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
  // The run's clock starts before the start-up measurements, which the first estimate counts.
  const auto run_start = std::chrono::steady_clock::now();
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
  // Without --out the default file, unless stdout carries the results already (--format json, csv, md).
  const std::string default_path = default_out_path(config.run.backend, utc_now("%Y%m%dT%H%M%SZ"));
  if (out_path.empty() && request.stdout_format == OutputFormat::table) out_path = default_path;
  std::vector<std::string> out_paths = {out_path};
  out_paths.insert(out_paths.end(), request.more_out_paths.begin(), request.more_out_paths.end());
  const std::vector<Output> outputs = parse_outputs(out_paths);
  std::vector<std::string> out_files;
  for (const Output& o : outputs)
    if (!o.to_stdout()) out_files.push_back(o.path);
  const bool json_on_stdout = out_files.size() < outputs.size();
  // The journal beside the first result file; with none, in the current folder under the default
  // file's name, so that a finished run leaves nothing behind (an interrupted one its journal).
  const std::string journal_of =
      out_files.empty() ? std::filesystem::path(default_path).filename().string() : out_files.front();
  const RunFiles files{out_files.empty() ? "" : out_files.front(), request.gbench_path, request.dump_dir,
                       resuming ? request.resume_path : journal_path_for(journal_of),
                       out_files.size() > 1 ? std::vector<std::string>(out_files.begin() + 1, out_files.end())
                                            : std::vector<std::string>()};
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
  // From the journal's first line on, a signal must end the run the usual way: the start-up's
  // measurements below take seconds (minutes under a sanitizer), and a signal's default action
  // there would leave the journal without a result file and the lock behind.
  install_interrupt_handlers();
  Journal journal(files.journal, header, resuming);
  folders.keep();

  const double sgemm_median_gflops = device.sgemm_median_gflops();
  std::vector<std::string> warnings = environment_warnings(device.host.build_type);
  if (std::string w = peak_spread_warning(device.blas_gflops(), sgemm_median_gflops); !w.empty()) warnings.push_back(std::move(w));
  if (config.run.slowdown > 0)
    warnings.push_back(fmt::format("--slowdown {}: every call was made {}% slower on purpose (a testing aid of the "
                                   "regression gate, docs/harness.md); these times are not the kernels'",
                                   config.run.slowdown, config.run.slowdown));
  for (const auto& w : warnings) fmt::print(stderr, "lattnbench: warning: {}\n", w);

  RunContext ctx{request, *backend, device, ReferenceCache(plan, config.run.check_heads), measure_steady_clock()};
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count(); };
  // The ETA starts from the cost model (docs/cli.md) and moves to what the cases take. Its paces
  // are this machine's under the load of the start-up: the sgemm's median product (its typical
  // moment, not its best), the triad, a float64 reference timed now, an sgemm check timed now.
  std::vector<const Case*> to_run;
  for (const auto& c : plan)
    if (!done.count(c.plan_index) && !backend->unsupported(c)) to_run.push_back(&c);
  CostRates rates;
  rates.kernel_gflops = device.sgemm_median_gflops() > 0 ? device.sgemm_median_gflops() : device.blas_gflops();
  rates.stream_gbytes_per_s = device.stream_gbytes_per_s();
  const double sgemm_best = device.blas_gflops(), sgemm_median = device.sgemm_median_gflops();
  if (sgemm_best > 0 && sgemm_median > 0) rates.sgemm_spread = std::max(0.0, 1 - sgemm_median / sgemm_best);
  const std::map<const Op*, ReferencePace> reference_paces =
      measure_reference_paces(to_run, config.run.seed, ctx.cache);
  if (backend->peak_check && !to_run.empty() && !stop_requested()) {
    const auto check_start = std::chrono::steady_clock::now();
    backend->peak_check();
    rates.check_s = 2 * std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start).count();
  }
  std::map<std::size_t, TimeEstimate> estimates;
  std::map<std::size_t, double> advanced;  // the estimated seconds each case has counted so far
  const double start_up_s = elapsed();
  double total_estimate = start_up_s;
  std::set<std::string> references;  // the keys whose float64 reference a case before makes
  for (const Case* c : to_run) {
    const bool makes_reference = references.insert(reference_key(*c)).second;
    const double flops = makes_reference ? reference_flops(ctx.cache.reference_case(*c), ctx.cache.backward(*c)) : 0.0;
    CostRates op_rates = rates;
    op_rates.reference_gflops = reference_paces.at(c->op).gflops;
    op_rates.input_elems_per_s = reference_paces.at(c->op).input_elems_per_s;
    total_estimate += (estimates[c->plan_index] = estimate_case_time(*c, config.run, op_rates, flops)).total_s();
  }
  Progress progress(total_estimate);
  progress.advance(start_up_s);
  const auto advance = [&](const Case& c, double seconds) {
    progress.advance(seconds);
    advanced[c.plan_index] += seconds;
  };

  std::vector<CaseRecord>& results = document.results;
  results.reserve(plan.size());
  document.totals.cases = plan.size();
  document.totals.not_planned = full_plan.size() - chosen.size();
  const auto timing_note = [&] {
    return fmt::format("elapsed {}, ETA {}", format_duration(elapsed()), format_duration(progress.eta_s(elapsed())));
  };
  ProgressLine progress_line(!request.quiet, ProgressLine::stderr_is_terminal());
  progress_line.note(fmt::format(
      "lattnbench: {} cases{}, estimated {} in all (start-up {}; cost model: each call at the sgemm's median "
      "{:.0f} GFLOP/s or the triad's {:.0f} GB/s, the float64 references at{} GFLOP/s, each sample at least "
      "min_sample_ms, {} samples a case for a start-up sgemm spread of {:.1f}%){}",
      plan.size(),
      document.totals.not_planned ? fmt::format(" ({} not planned: --filter)", document.totals.not_planned) : "",
      format_duration(total_estimate), format_duration(start_up_s), rates.kernel_gflops, rates.stream_gbytes_per_s,
      [&] {
        std::string paces;
        for (const auto& [op, pace] : reference_paces) paces += fmt::format(" {:.2f} ({})", pace.gflops, op->suite);
        return paces.empty() ? std::string(" -") : paces;
      }(),
      expected_samples(config.run, rates), rates.sgemm_spread * 100,
      config.run.interleave ? "; samples in rounds over the cases" : ""));
  const auto status_line = [&] { return fmt::format("[{}/{}] {}", results.size(), plan.size(), timing_note()); };
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
      case Status::unchecked: ++document.totals.unchecked; break;
    }
    const bool record_failed = record.status == Status::failed;
    any_failed = any_failed || record_failed;
    results.push_back(std::move(record));
    if (const auto it = estimates.find(c.plan_index); it != estimates.end()) advance(c, it->second.total_s() - advanced[c.plan_index]);
    const std::string line = fmt::format("[{}/{}] {}: {} ({})", results.size(), plan.size(), case_slug(c), note, timing_note());
    if (record_failed) progress_line.note(line);  // a failure stays in sight on a terminal too
    else progress_line.finished(status_line() + "; " + case_slug(c) + ": " + note, line);
    return write_failure.empty();
  };
  BatchEvents events;
  events.finished = finished;
  events.started = [&](const Case& c) {
    const TimeEstimate& e = estimates.at(c.plan_index);
    advance(c, e.prepare_s + e.start_s);
  };
  events.sampled = [&](const Case& c) {
    advance(c, estimates.at(c.plan_index).sample_s);
    progress_line.status(status_line());
  };
  std::vector<const Case*> batch;
  double batch_seconds = 0;
  // On a pipe, where the rounds print nothing, a line says when a batch's sampling begins.
  events.prepared = [&] {
    if (!config.run.interleave || progress_line.on_terminal()) return;
    progress_line.note(fmt::format("batch of {} case{} ({}{}, estimated {}): prepared, sampling{}", batch.size(),
                                   batch.size() == 1 ? "" : "s", case_slug(*batch.front()),
                                   batch.size() == 1 ? "" : " .. " + case_slug(*batch.back()),
                                   format_duration(batch_seconds), batch.size() == 1 ? "" : " in rounds"));
  };
  // Batches of cases whose samples are taken in rounds: with --interleave, consecutive cases while
  // their memory fits in the batch's bound (batch_memory of the physical memory, and half of what
  // is free when the batch starts) and their expected time in kBatchSeconds; else one case at a
  // time. The bounds keep the peak memory down and let cases finish (and reach the journal)
  // steadily through a long run, so that an interrupt cuts short at most one batch.
  constexpr double kBatchSeconds = 15;
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
    batch_seconds = 0;
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
      const double seconds = estimates.at(c.plan_index).total_s();
      const bool fits = held.host + need.host <= budget.host &&
                        (budget.device == 0 || held.device + need.device <= budget.device) &&
                        batch_seconds + seconds <= kBatchSeconds;
      if (!batch.empty() && (!config.run.interleave || !fits || alone) && !(going = run_pending())) break;
      if (batch.empty()) {
        budget.host = std::min(double(available_host_memory()) / 2, config.run.batch_memory * double(total_host_memory()));
        budget.device = !backend->memory_is_host && backend->memory_available ? double(backend->memory_available()) / 2 : 0;
      }
      batch.push_back(&c);
      held.host += need.host;
      held.device += need.device;
      batch_seconds += seconds;
      if (alone) going = run_pending();
    }
    if (!going) break;
  }
  if (going) run_pending();
  progress_line.close();
  std::sort(results.begin(), results.end(),
            [](const CaseRecord& a, const CaseRecord& b) { return a.kase.plan_index < b.kase.plan_index; });

  if (const std::string w = above_peak_warning(results, device.ceiling(),
                                               device.cpu ? device.cpu->fma_gflops.value_or(0.0) : 0.0,
                                               device.blas_gflops());
      !w.empty()) {
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
    write_output_files(outputs, document);
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

  fmt::print("{}", render(document, json_on_stdout ? OutputFormat::json : request.stdout_format));
  if (!json_on_stdout && request.stdout_format == OutputFormat::table) {
    const Totals& t = document.totals;
    std::string written;
    for (const std::string& path : out_files) written += (written.empty() ? "" : ", ") + path;
    fmt::print("cases: {} ok, {} failed, {} skipped{} of {}{}\nresults: {}\n", t.ok, t.failed, t.skipped,
               t.unchecked ? fmt::format(", {} unchecked", t.unchecked) : "", t.cases,
               request.filter.empty() ? "" : fmt::format("; {} not planned (--filter {})", t.not_planned, request.filter),
               written);
  }
  std::fflush(stdout);  // the table first, then the time on stderr, in this order on a terminal
  if (!request.quiet)
    fmt::print(stderr, "lattnbench: took {} (estimated {} at the start)\n", format_duration(elapsed()),
               format_duration(total_estimate));
  if (signal) {
    const auto partial = std::count_if(results.begin(), results.end(), [](const CaseRecord& r) {
      return r.measured && r.measured->stopped_on == "interrupted";
    });
    fmt::print(stderr,
               "lattnbench: interrupted after {} of {} cases{}; resume with --resume {} (it measures the partial "
               "ones again)\n",
               results.size() - std::size_t(partial), plan.size(),
               partial ? fmt::format(" and {} kept partial (stopped_on interrupted)", partial) : "", files.journal);
    return 128 + signal;
  }
  return any_failed ? 1 : 0;
}

}  // namespace lattn

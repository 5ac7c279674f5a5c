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

#include "backend.hpp"
#include "check.hpp"
#include "cost_model.hpp"
#include "environment.hpp"
#include "error.hpp"
#include "harness.hpp"
#include "inputs.hpp"
#include "interrupt.hpp"
#include "journal.hpp"
#include "npy.hpp"
#include "report.hpp"
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
  const Problem& p = c.problem;
  return fmt::format("{} {} {} B{} H{} T{} D{} C{}{} decay={}", c.suite, to_string(c.impl), to_string(c.mode), p.batch,
                     p.heads, p.seq, p.dim, p.chunk, c.is_layer() ? fmt::format(" W{}", c.window) : "",
                     to_string(p.decay));
}

std::string case_slug(const Case& c) {
  const Problem& p = c.problem;
  return fmt::format("{:03d}-{}-{}-{}-b{}h{}t{}d{}c{}{}-{}", c.plan_index, c.suite, to_string(c.impl),
                     to_string(c.mode), p.batch, p.heads, p.seq, p.dim, p.chunk,
                     c.is_layer() ? fmt::format("w{}", c.window) : "", to_string(p.decay));
}

std::string format_duration(double seconds) {
  const long s = std::lround(seconds);
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

nlohmann::json identity(const Case& c) {
  const Problem& p = c.problem;
  return {{"suite", c.suite},   {"impl", to_string(c.impl)}, {"mode", to_string(c.mode)},
          {"backend", c.backend}, {"dtype", c.dtype},         {"decay", to_string(p.decay)},
          {"chunk", p.chunk},     {"batch", p.batch},         {"heads", p.heads},
          {"seq", p.seq},         {"dim", p.dim},             {"plan_index", c.plan_index}};
}

// What must match for a journal to be resumed on this machine: the device, not its measurements.
nlohmann::json device_fingerprint(const nlohmann::json& device) {
  nlohmann::json fp = nlohmann::json::object();
  for (const char* key : {"backend", "cpu_model", "cpu_signature", "cpu_cores", "threads", "hostname", "gpu", "compute_capability",
                          "lattnbench_version", "git_revision"})
    if (device.contains(key)) fp[key] = device[key];
  return fp;
}

// A layer record's `dim` is the head dim, as in the reference results file; `head_dim` says so
// explicitly, and `model_dim` is the projections' width heads * head_dim.
nlohmann::json layer_identity(const Case& c) {
  nlohmann::json id = identity(c);
  id["window"] = c.window;
  id["head_dim"] = c.problem.dim;
  id["model_dim"] = c.model_dim();
  return id;
}

nlohmann::json identity_of(const Case& c) { return c.is_layer() ? layer_identity(c) : identity(c); }

// Inputs and the float64 reference for the shape last seen: scan and chunked, fwd and fwd_bwd of
// one shape come one after another in the plan and share them.
class ReferenceCache {
 public:
  struct Entry {
    KernelTensors inputs;
    KernelReference reference;
  };

  const Entry& get(const Problem& p, Mode mode, std::uint64_t seed, const std::string& dtype) {
    const bool backward = mode == Mode::fwd_bwd;
    const auto key = std::make_tuple(p.batch, p.heads, p.seq, p.dim, int(p.decay), dtype);
    if (!entry_ || key != key_ || (backward && !entry_->reference.has_backward)) {
      entry_.reset();  // free the old shape's tensors before making the new ones
      auto entry = std::make_unique<Entry>();
      entry->inputs = make_kernel_inputs(p, Mode::fwd_bwd, seed);
      if (dtype == "bf16") {  // the token tensors are bf16; the states h0, dhT stay float32
        for (auto* tensor : {&entry->inputs.q, &entry->inputs.k, &entry->inputs.v, &entry->inputs.dO})
          round_to_bf16(*tensor);
      }
      entry->reference = compute_kernel_reference(p, entry->inputs, backward);
      entry_ = std::move(entry);
      key_ = key;
    }
    return *entry_;
  }

 private:
  std::tuple<int, int, int, int, int, std::string> key_{};
  std::unique_ptr<Entry> entry_;
};

// Host bytes the run itself holds for a case beyond the backend: the cached inputs (float32) and
// the float64 reference with its widened inputs, the case's own input copy, and the outputs read
// back (all six tensors counted for every mode, as the cache does).
// A layer case holds x, out, dOut, dx (B x T x M each) and the four weights with their gradients.
std::size_t host_estimate(const Case& c) {
  const Problem& p = c.problem;
  const std::size_t M = std::size_t(c.model_dim());
  const std::size_t elems =
      c.is_layer() ? 4 * p.token_elems() + 8 * M * M : 4 * p.token_elems() + 2 * p.state_elems();
  return elems * (4 /*cache*/ + 8 /*widened*/ + 8 /*reference outputs*/ + 4 /*case inputs*/ + 4 /*read back*/);
}

std::optional<std::string> memory_guard(const Backend& backend, const Case& c) {
  const double host_need = double(host_estimate(c)) + (backend.memory_is_host() ? double(backend.memory_estimate(c)) : 0);
  const double host_free = double(available_host_memory());
  if (host_need > host_free)
    return fmt::format("needs about {:.0f} MiB of host memory, {:.0f} MiB available", host_need / kMiB, host_free / kMiB);
  if (!backend.memory_is_host()) {
    const double need = double(backend.memory_estimate(c)), free = double(backend.memory_available());
    if (need > free)
      return fmt::format("needs about {:.0f} MiB of {} memory, {:.0f} MiB free", need / kMiB, backend.name(), free / kMiB);
  }
  return std::nullopt;
}

LayerProblem layer_problem(const Case& c) { return LayerProblem{c.problem, c.window, c.impl == Impl::chunked}; }

// The same for the layer suite: scan and chunked, fwd and fwd_bwd of one shape share inputs and
// reference. `backward` is whether any case of the suite needs the gradients; when it does, the
// first case of a shape computes them, so that the (slow) float64 layer runs once per shape.
class LayerReferenceCache {
 public:
  struct Entry {
    LayerTensors inputs;
    LayerReference reference;
  };

  const Entry& get(const Case& c, bool backward, std::uint64_t seed) {
    const Problem& p = c.problem;
    const auto key = std::make_tuple(p.batch, p.heads, p.seq, p.dim, c.window, int(p.decay));
    if (!entry_ || key != key_ || (backward && !entry_->reference.has_backward)) {
      entry_.reset();
      auto entry = std::make_unique<Entry>();
      entry->inputs = make_layer_inputs(p, Mode::fwd_bwd, seed);
      // The float64 layer does not depend on impl or chunk: its linear branch is the scan reference.
      entry->reference = compute_layer_reference(layer_problem(c), entry->inputs, backward);
      entry_ = std::move(entry);
      key_ = key;
    }
    return *entry_;
  }

 private:
  std::tuple<int, int, int, int, int, int> key_{};
  std::unique_ptr<Entry> entry_;
};

struct Caches {
  ReferenceCache kernel;
  LayerReferenceCache layer;
  bool layer_backward = false;
};

std::string make_case_folder(const std::string& dir, const Case& c) {
  std::string folder = (std::filesystem::path(dir) / case_slug(c)).string();
  std::filesystem::create_directories(folder);
  return folder;
}

void dump_layer_case(const std::string& dir, const Case& c, const LayerTensors& in, const LayerTensors& out) {
  const Problem& p = c.problem;
  const std::string folder = make_case_folder(dir, c);
  const std::size_t M = std::size_t(c.model_dim());
  const std::vector<std::size_t> tok{std::size_t(p.batch), std::size_t(p.seq), M}, w{M, M}, vec{M},
      heads{std::size_t(p.heads)};
  auto put = [&](const char* name, const std::vector<float>& v, const std::vector<std::size_t>& shape) {
    if (!v.empty()) write_npy(folder + "/" + name + ".npy", v.data(), shape);
  };
  put("x", in.x, tok);
  put("wq", in.wq, w);
  put("wk", in.wk, w);
  put("wv", in.wv, w);
  put("wo", in.wo, w);
  put("g", in.g, vec);
  put("beta", in.beta, heads);
  put("out", out.out, tok);
  if (c.mode == Mode::fwd_bwd) {
    put("dOut", in.dOut, tok);
    put("dx", out.dx, tok);
    put("dwq", out.dwq, w);
    put("dwk", out.dwk, w);
    put("dwv", out.dwv, w);
    put("dwo", out.dwo, w);
    put("dg", out.dg, vec);
    put("dbeta", out.dbeta, heads);
  }
}

void dump_case(const std::string& dir, const Case& c, const KernelTensors& in, const KernelTensors& out) {
  const Problem& p = c.problem;
  const std::string folder = make_case_folder(dir, c);
  const std::vector<std::size_t> tok{std::size_t(p.batch), std::size_t(p.heads), std::size_t(p.seq), std::size_t(p.dim)};
  const std::vector<std::size_t> st{std::size_t(p.batch), std::size_t(p.heads), std::size_t(p.dim), std::size_t(p.dim)};
  auto put = [&](const char* name, const std::vector<float>& v, const std::vector<std::size_t>& shape) {
    if (!v.empty()) write_npy(folder + "/" + name + ".npy", v.data(), shape);
  };
  put("q", in.q, tok);
  put("k", in.k, tok);
  put("v", in.v, tok);
  put("h0", in.h0, st);
  put("o", out.o, tok);
  put("hT", out.hT, st);
  if (c.mode == Mode::fwd_bwd) {
    put("dO", in.dO, tok);
    put("dhT", in.dhT, st);
    put("dq", out.dq, tok);
    put("dk", out.dk, tok);
    put("dv", out.dv, tok);
    put("dh0", out.dh0, st);
  }
}

// The inputs a case needs: fwd cases do not carry the cotangents.
KernelTensors inputs_for(const KernelTensors& all, Mode mode) {
  KernelTensors in;
  in.q = all.q;
  in.k = all.k;
  in.v = all.v;
  in.h0 = all.h0;
  if (mode == Mode::fwd_bwd) {
    in.dO = all.dO;
    in.dhT = all.dhT;
  }
  return in;
}

struct RunContext {
  const RunRequest& request;
  Backend& backend;
  Caches caches;
  TimerInfo timer;
};

std::optional<std::string> unsupported_reason(const Backend& backend, const Case& c) {
  if (auto why = backend.unsupported_reason(c)) return why;
  if (c.is_layer() && !backend.runs_layer_suite()) return "the " + backend.name() + " backend has no layer suite yet";
  return std::nullopt;
}

// Times a prepared case, then `check_outputs` reads and checks its outputs; the record of SPEC
// section 4 that every suite shares.
template <class CheckOutputs>
nlohmann::json measure_and_record(const Case& c, RunContext& ctx, PreparedCase& prepared, CheckOutputs&& check_outputs) {
  nlohmann::json record = identity_of(c);
  const auto& run = ctx.request.config.run;
  const Timing timing = measure(prepared, TimingSettings{run.warmup, run.reps, run.min_sample_ms});
  const CheckResult check = check_outputs();
  const MemoryUsage memory = prepared.memory();
  const double flops = case_flops(c), bytes = case_min_bytes(memory);
  const double seconds = timing.stats.median * 1e-3;

  record["status"] = check.passed ? "ok" : "failed";
  if (!check.non_finite.empty())
    record["check_failure"] = "non-finite output at " + check.non_finite;
  else if (!check.passed)
    record["check_failure"] =
        fmt::format("{} rel_err {:.3e} over tolerance {:.1e}", check.worst_output, check.rel_err, check.tolerance);
  record["compile_s"] = timing.compile_s;
  record["warmup"] = run.warmup;
  record["inner"] = timing.inner;
  record["reps"] = run.reps;
  record["samples_ms"] = timing.samples_ms;
  record["median_ms"] = timing.stats.median;
  record["q1_ms"] = timing.stats.q1;
  record["q3_ms"] = timing.stats.q3;
  record["min_ms"] = timing.stats.min;
  record["max_ms"] = timing.stats.max;
  record["mean_ms"] = timing.stats.mean;
  record["rel_err"] = check.rel_err;
  record["rel_errs"] = check.per_output;
  record["tolerance"] = check.tolerance;
  record["temp_mb"] = double(memory.temp_bytes) / kMiB;
  record["arg_mb"] = double(memory.arg_bytes) / kMiB;
  record["out_mb"] = double(memory.out_bytes) / kMiB;
  record["flops"] = flops;
  record["gflops"] = seconds > 0 ? flops / seconds * 1e-9 : 0.0;
  record["bytes"] = bytes;
  record["gbytes_per_s"] = seconds > 0 ? bytes / seconds * 1e-9 : 0.0;
  if (const std::string states = prepared.bwd_states(); !states.empty()) record["bwd_states"] = states;
  if (timing.stats.median * 1e6 < 10 * ctx.timer.resolution_ns)
    record["timer_warning"] = fmt::format("per-call time {:.1f} ns is within 10x of the timer's resolution ({:.1f} ns)",
                                          timing.stats.median * 1e6, ctx.timer.resolution_ns);
  if (run.cold) record["cold"] = true;

  return record;
}

nlohmann::json run_case(RunContext& ctx, const Case& c) {
  const auto& run = ctx.request.config.run;
  const auto& shared = ctx.caches.kernel.get(c.problem, c.mode, run.seed, c.dtype);
  throw_if_interrupted();
  const KernelTensors inputs = inputs_for(shared.inputs, c.mode);
  auto prepared = ctx.backend.prepare(c, inputs);
  KernelTensors outputs;
  nlohmann::json record = measure_and_record(c, ctx, *prepared, [&] {
    prepared->read_outputs(outputs);
    return check_kernel_outputs(outputs, shared.reference, c.mode, tolerance_for(c.dtype));
  });
  if (!ctx.request.dump_dir.empty()) dump_case(ctx.request.dump_dir, c, inputs, outputs);
  return record;
}

nlohmann::json run_layer_case(RunContext& ctx, const Case& c) {
  Caches& caches = ctx.caches;
  const bool backward = caches.layer_backward || c.mode == Mode::fwd_bwd;
  const auto& shared = caches.layer.get(c, backward, ctx.request.config.run.seed);
  throw_if_interrupted();
  LayerTensors inputs = shared.inputs;
  if (c.mode == Mode::fwd) inputs.dOut.clear();  // fwd cases do not carry the cotangent
  auto prepared = ctx.backend.prepare_layer(c, inputs);
  LayerTensors outputs;
  nlohmann::json record = measure_and_record(c, ctx, *prepared, [&] {
    prepared->read_layer_outputs(outputs);
    return check_layer_outputs(outputs, shared.reference, c.mode, layer_tolerance_for(c.dtype));
  });
  if (!ctx.request.dump_dir.empty()) dump_layer_case(ctx.request.dump_dir, c, inputs, outputs);
  return record;
}

// Records of a journal being resumed, by plan index, after checking it belongs to this run.
std::map<std::size_t, nlohmann::json> resumed_records(const std::string& path, const nlohmann::json& header) {
  const JournalContents journal = read_journal(path);
  for (const char* key : {"config", "shard", "plan_size"})
    if (journal.header.value(key, nlohmann::json()) != header.value(key, nlohmann::json()))
      throw UsageError(path, std::string("the journal's ") + key + " differs from this run's: resume with the same command line");
  if (journal.header["device"] != header["device"])
    throw UsageError(path, "the journal was written on another device (" + journal.header["device"].dump() + ")");
  std::map<std::size_t, nlohmann::json> done;
  for (const auto& record : journal.records) done[record.at("plan_index").get<std::size_t>()] = record;
  return done;
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

  // A resumed run keeps the start time, command line and result path of the run it continues.
  nlohmann::json resumed_header;
  if (!request.resume_path.empty()) resumed_header = read_journal(request.resume_path).header;
  std::string out_path = request.out_path;
  if (out_path.empty() && !resumed_header.is_null()) out_path = resumed_header.value("out_path", "");
  if (out_path.empty()) out_path = default_out_path(config.run.backend, utc_now("%Y%m%dT%H%M%SZ"));
  const OutputFormat out_format = format_for_path(out_path, "--out");
  check_writable(out_path, "--out");
  if (!request.gbench_path.empty()) check_writable(request.gbench_path, "--gbench-out");
  const std::string journal_path = request.resume_path.empty() ? journal_path_for(out_path) : request.resume_path;

  auto backend = make_backend(config.run.backend, BackendOptions{config.run.threads, config.run.device, config.run.cold,
                                                                 config.run.bwd_states == "kept"});
  const Availability availability = backend->availability();
  if (!availability.available) throw UsageError("--backend " + config.run.backend, availability.reason);
  const nlohmann::json device = backend->device_info();

  const std::vector<Case> full_plan = expand_plan(config);
  const std::vector<Case> plan = select_shard(full_plan, request.shard);
  const nlohmann::json shard_json =
      request.shard.active() ? nlohmann::json{{"index", request.shard.index}, {"count", request.shard.count}} : nlohmann::json();

  nlohmann::json header = {{"journal", "lattnbench"}, {"schema_version", kSchemaVersion}, {"created_utc", started},
                           {"argv", argv},           {"out_path", out_path},            {"config", to_json(config)},
                           {"shard", shard_json},     {"plan_size", full_plan.size()},   {"device", device_fingerprint(device)}};
  std::map<std::size_t, nlohmann::json> done;
  if (!request.resume_path.empty()) {
    done = resumed_records(request.resume_path, header);
    started = resumed_header.value("created_utc", started);
    argv = resumed_header.value("argv", argv);
  }
  Journal journal(journal_path, header, !request.resume_path.empty());

  const double peak_gflops = device.value("peak_gflops", 0.0);
  const double sgemm_median_gflops = device.value("sgemm_median_gflops", 0.0);
  std::vector<std::string> warnings = environment_warnings(device.value("build_type", ""));
  if (std::string w = peak_spread_warning(peak_gflops, sgemm_median_gflops); !w.empty()) warnings.push_back(std::move(w));
  for (const auto& w : warnings) fmt::print(stderr, "lattnbench: warning: {}\n", w);

  RunContext ctx{request, *backend, {}, measure_steady_clock()};
  const double stream_gbytes_per_s = device.value("stream_gbytes_per_s", 0.0);
  double total_cost = 0, done_cost = 0;
  for (const auto& c : plan) total_cost += case_cost_estimate(c);

  install_interrupt_handlers();
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json totals = {{"cases", plan.size()}, {"ok", 0}, {"failed", 0}, {"skipped", 0}};
  for (Mode mode : config.layer.mode) ctx.caches.layer_backward = ctx.caches.layer_backward || mode == Mode::fwd_bwd;
  const auto run_start = std::chrono::steady_clock::now();
  bool any_failed = false;
  std::size_t position = 0;

  for (const Case& c : plan) {
    ++position;
    if (interrupt_signal()) break;
    nlohmann::json record;
    std::string note;
    if (auto it = done.find(c.plan_index); it != done.end()) {
      record = it->second;
      note = "from the journal";
    } else if (auto why = unsupported_reason(*backend, c)) {
      record = identity_of(c);
      record["status"] = "skipped";
      record["skip_reason"] = *why;
      note = "skipped: " + *why;
    } else if (auto too_big = memory_guard(*backend, c)) {
      record = identity_of(c);
      record["status"] = "skipped";
      record["skip_reason"] = "memory: " + *too_big;
      note = "skipped: memory: " + *too_big;
    } else {
      try {
        const std::optional<double> peak_before = backend->peak_check_gflops();
        record = c.is_layer() ? run_layer_case(ctx, c) : run_case(ctx, c);
        const std::optional<double> peak_after = backend->peak_check_gflops();
        if (peak_gflops > 0 && record.contains("gflops")) {
          record["peak_gflops"] = peak_gflops;
          record["peak_fraction"] = record["gflops"].get<double>() / peak_gflops;
          // The roofline: the rate a case of this arithmetic intensity can reach at the measured
          // bandwidth, if that is below the compute peak (memory-bound: small D, long sequences).
          const double bytes = record.value("bytes", 0.0), flops = record.value("flops", 0.0);
          if (stream_gbytes_per_s > 0 && bytes > 0 && flops > 0) {
            const double roof = std::min(peak_gflops, flops / bytes * stream_gbytes_per_s);
            record["roofline_gflops"] = roof;
            record["roofline_fraction"] = record["gflops"].get<double>() / roof;
          }
        }
        if (peak_before && peak_after && record.contains("gflops")) {
          const double now = std::max(*peak_before, *peak_after);
          record["peak_gflops_now"] = now;
          record["peak_fraction_now"] = record["gflops"].get<double>() / now;
        }
        note = fmt::format("median {:.4f} ms, rel_err {:.2e}", record["median_ms"].get<double>(),
                           record["rel_err"].get<double>());
        if (record["status"] == "failed") note += " FAILED: " + record["check_failure"].get<std::string>();
      } catch (const Interrupted&) {
        break;
      } catch (const std::bad_alloc&) {
        record = identity_of(c);
        record["status"] = "skipped";
        record["skip_reason"] = "memory: an allocation failed";
        note = "skipped: memory: an allocation failed";
      } catch (const std::exception& e) {
        record = identity_of(c);
        record["status"] = "failed";
        record["error"] = e.what();
        note = std::string("FAILED: ") + e.what();
      }
    }
    if (!done.count(c.plan_index)) journal.append(record);
    const std::string status = record["status"];
    totals[status] = totals[status].get<int>() + 1;
    any_failed = any_failed || status == "failed";
    results.push_back(std::move(record));

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

  const int signal = interrupt_signal();
  nlohmann::json full_device = device;
  full_device["timer"] = to_json(ctx.timer);
  nlohmann::json document = {
      {"schema_version", kSchemaVersion},
      {"tool", "lattnbench"},
      {"version", device.value("lattnbench_version", "")},
      {"created_utc", started},
      {"argv", argv},
      {"config", to_json(config)},
      {"device", full_device},
      {"results", results},
      {"totals", totals},
      {"summary", build_summary(results)},
      {"warnings", warnings},
  };
  if (request.shard.active()) document["shard"] = shard_json;
  if (signal) {
    document["interrupted"] = true;
    document["interrupted_by"] = signal == SIGINT ? "SIGINT" : "SIGTERM";
  }
  write_file_atomically(out_path, render(document, out_format));
  if (!request.gbench_path.empty()) write_file_atomically(request.gbench_path, to_gbench(document).dump(2) + "\n");
  // A complete run needs its journal no more; an interrupted one keeps it for --resume.
  if (!signal) std::filesystem::remove(journal_path);

  fmt::print("{}", render(document, request.stdout_format));
  if (request.stdout_format == OutputFormat::table) fmt::print("results: {}\n", out_path);
  if (signal) {
    fmt::print(stderr, "lattnbench: interrupted after {} of {} cases; resume with --resume {}\n", results.size(),
               plan.size(), journal_path);
    return 128 + signal;
  }
  return any_failed ? 1 : 0;
}

}  // namespace lattn

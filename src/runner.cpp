#include "runner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>

#include "backend.hpp"
#include "check.hpp"
#include "cost_model.hpp"
#include "error.hpp"
#include "harness.hpp"
#include "inputs.hpp"
#include "npy.hpp"
#include "report.hpp"

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
  return fmt::format("{} {} {} B{} H{} T{} D{} C{} decay={}", c.suite, to_string(c.impl), to_string(c.mode), p.batch,
                     p.heads, p.seq, p.dim, p.chunk, to_string(p.decay));
}

std::string case_slug(const Case& c) {
  const Problem& p = c.problem;
  return fmt::format("{:03d}-{}-{}-{}-b{}h{}t{}d{}c{}-{}", c.plan_index, c.suite, to_string(c.impl), to_string(c.mode),
                     p.batch, p.heads, p.seq, p.dim, p.chunk, to_string(p.decay));
}

std::string format_duration(double seconds) {
  const long s = long(seconds + 0.5);
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

// Inputs and the float64 reference for the shape last seen: scan and chunked, fwd and fwd_bwd of
// one shape come one after another in the plan and share them.
class ReferenceCache {
 public:
  struct Entry {
    KernelTensors inputs;
    KernelReference reference;
  };

  const Entry& get(const Problem& p, Mode mode, std::uint64_t seed) {
    const bool backward = mode == Mode::fwd_bwd;
    const auto key = std::make_tuple(p.batch, p.heads, p.seq, p.dim, int(p.decay));
    if (!entry_ || key != key_ || (backward && !entry_->reference.has_backward)) {
      entry_.reset();  // free the old shape's tensors before making the new ones
      auto entry = std::make_unique<Entry>();
      entry->inputs = make_kernel_inputs(p, Mode::fwd_bwd, seed);
      entry->reference = compute_kernel_reference(p, entry->inputs, backward);
      entry_ = std::move(entry);
      key_ = key;
    }
    return *entry_;
  }

 private:
  std::tuple<int, int, int, int, int> key_{};
  std::unique_ptr<Entry> entry_;
};

void dump_case(const std::string& dir, const Case& c, const KernelTensors& in, const KernelTensors& out) {
  const Problem& p = c.problem;
  const std::string folder = (std::filesystem::path(dir) / case_slug(c)).string();
  std::filesystem::create_directories(folder);
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

nlohmann::json run_case(Backend& backend, const Case& c, const RunRequest& request, ReferenceCache& cache) {
  nlohmann::json record = identity(c);
  const auto& run = request.config.run;
  const auto& shared = cache.get(c.problem, c.mode, run.seed);
  const KernelTensors inputs = inputs_for(shared.inputs, c.mode);
  auto prepared = backend.prepare(c, inputs);
  const Timing timing = measure(*prepared, TimingSettings{run.warmup, run.reps, run.min_sample_ms});

  KernelTensors outputs;
  prepared->read_outputs(outputs);
  const CheckResult check = check_kernel_outputs(outputs, shared.reference, c.mode, tolerance_for(c.dtype));
  const MemoryUsage memory = prepared->memory();
  const double flops = case_flops(c), bytes = case_min_bytes(memory);
  const double seconds = timing.stats.median * 1e-3;

  record["status"] = check.passed ? "ok" : "failed";
  if (!check.non_finite.empty()) record["check_failure"] = "non-finite output at " + check.non_finite;
  else if (!check.passed) record["check_failure"] = fmt::format("{} rel_err {:.3e} over tolerance {:.1e}", check.worst_output, check.rel_err, check.tolerance);
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
  if (c.impl == Impl::chunked && c.mode == Mode::fwd_bwd) record["bwd_states"] = "recomputed";

  if (!request.dump_dir.empty()) dump_case(request.dump_dir, c, inputs, outputs);
  return record;
}

}  // namespace

std::string default_out_path(const std::string& backend, const std::string& utc_compact) {
  return "results/lattnbench-" + backend + "-" + utc_compact + ".json";
}

int run_benchmarks(const RunRequest& request) {
  const Config& config = request.config;
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  const std::string out_path =
      request.out_path.empty() ? default_out_path(config.run.backend, utc_now("%Y%m%dT%H%M%SZ")) : request.out_path;
  check_writable(out_path, "--out");

  auto backend = make_backend(config.run.backend, BackendOptions{config.run.threads});
  const Availability availability = backend->availability();
  if (!availability.available) throw UsageError("--backend " + config.run.backend, availability.reason);

  // Measures the roofline (peak_gflops) once, before the first case, and caches the block.
  const nlohmann::json device = backend->device_info();
  const double peak_gflops = device.value("peak_gflops", 0.0);

  const std::vector<Case> plan = expand_plan(config);
  double total_cost = 0, done_cost = 0;
  for (const auto& c : plan) total_cost += case_cost_estimate(c);

  nlohmann::json results = nlohmann::json::array();
  nlohmann::json totals = {{"cases", plan.size()}, {"ok", 0}, {"failed", 0}, {"skipped", 0}};
  ReferenceCache cache;
  const auto run_start = std::chrono::steady_clock::now();
  bool any_failed = false;

  for (const Case& c : plan) {
    nlohmann::json record;
    std::string note;
    if (auto why = backend->unsupported_reason(c)) {
      record = identity(c);
      record["status"] = "skipped";
      record["skip_reason"] = *why;
      note = "skipped: " + *why;
    } else {
      try {
        record = run_case(*backend, c, request, cache);
        if (peak_gflops > 0 && record.contains("gflops")) {
          record["peak_gflops"] = peak_gflops;
          record["peak_fraction"] = record["gflops"].get<double>() / peak_gflops;
        }
        note = fmt::format("median {:.4f} ms, rel_err {:.2e}", record["median_ms"].get<double>(),
                           record["rel_err"].get<double>());
        if (record["status"] == "failed") note += " FAILED: " + record["check_failure"].get<std::string>();
      } catch (const std::exception& e) {
        record = identity(c);
        record["status"] = "failed";
        record["error"] = e.what();
        note = std::string("FAILED: ") + e.what();
      }
    }
    const std::string status = record["status"];
    totals[status] = totals[status].get<int>() + 1;
    any_failed = any_failed || status == "failed";
    results.push_back(std::move(record));

    done_cost += case_cost_estimate(c);
    if (!request.quiet) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = done_cost > 0 ? elapsed * (total_cost - done_cost) / done_cost : 0.0;
      fmt::print(stderr, "[{}/{}] {}: {} (elapsed {}, ETA {})\n", c.plan_index + 1, plan.size(), describe(c), note,
                 format_duration(elapsed), format_duration(eta));
      std::fflush(stderr);
    }
  }

  nlohmann::json document = {
      {"schema_version", kSchemaVersion},
      {"tool", "lattnbench"},
      {"version", device.value("lattnbench_version", "")},
      {"created_utc", started},
      {"argv", request.argv},
      {"config", to_json(config)},
      {"device", device},
      {"results", results},
      {"totals", totals},
  };
  write_file_atomically(out_path, document.dump(2) + "\n");
  fmt::print("{}", format_table(results));
  fmt::print("results: {}\n", out_path);
  return any_failed ? 1 : 0;
}

}  // namespace lattn

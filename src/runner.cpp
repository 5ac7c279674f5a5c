#include "runner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>

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
  const std::string folder = (std::filesystem::path(dir) / case_slug(c)).string();
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

// Times a prepared case, then `check_outputs` reads and checks its outputs; the record of SPEC
// section 4 that every suite shares.
template <class CheckOutputs>
nlohmann::json measure_and_record(const Case& c, const RunRequest& request, PreparedCase& prepared,
                                  CheckOutputs&& check_outputs) {
  nlohmann::json record = identity_of(c);
  const auto& run = request.config.run;
  const Timing timing = measure(prepared, TimingSettings{run.warmup, run.reps, run.min_sample_ms});
  const CheckResult check = check_outputs();
  const MemoryUsage memory = prepared.memory();
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
  return record;
}

nlohmann::json run_case(Backend& backend, const Case& c, const RunRequest& request, ReferenceCache& cache) {
  const auto& shared = cache.get(c.problem, c.mode, request.config.run.seed);
  const KernelTensors inputs = inputs_for(shared.inputs, c.mode);
  auto prepared = backend.prepare(c, inputs);
  KernelTensors outputs;
  nlohmann::json record = measure_and_record(c, request, *prepared, [&] {
    prepared->read_outputs(outputs);
    return check_kernel_outputs(outputs, shared.reference, c.mode, tolerance_for(c.dtype));
  });
  if (!request.dump_dir.empty()) dump_case(request.dump_dir, c, inputs, outputs);
  return record;
}

nlohmann::json run_layer_case(Backend& backend, const Case& c, const RunRequest& request, Caches& caches) {
  const bool backward = caches.layer_backward || c.mode == Mode::fwd_bwd;
  const auto& shared = caches.layer.get(c, backward, request.config.run.seed);
  LayerTensors inputs = shared.inputs;
  if (c.mode == Mode::fwd) inputs.dOut.clear();  // fwd cases do not carry the cotangent
  auto prepared = backend.prepare_layer(c, inputs);
  LayerTensors outputs;
  nlohmann::json record = measure_and_record(c, request, *prepared, [&] {
    prepared->read_layer_outputs(outputs);
    return check_layer_outputs(outputs, shared.reference, c.mode, layer_tolerance_for(c.dtype));
  });
  if (!request.dump_dir.empty()) dump_layer_case(request.dump_dir, c, inputs, outputs);
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

  const std::vector<Case> plan = expand_plan(config);
  double total_cost = 0, done_cost = 0;
  for (const auto& c : plan) total_cost += case_cost_estimate(c);

  nlohmann::json results = nlohmann::json::array();
  nlohmann::json totals = {{"cases", plan.size()}, {"ok", 0}, {"failed", 0}, {"skipped", 0}};
  Caches caches;
  for (Mode mode : config.layer.mode) caches.layer_backward = caches.layer_backward || mode == Mode::fwd_bwd;
  const auto run_start = std::chrono::steady_clock::now();
  bool any_failed = false;

  for (const Case& c : plan) {
    nlohmann::json record;
    std::string note;
    std::optional<std::string> why = backend->unsupported_reason(c);
    if (!why && c.is_layer() && !backend->runs_layer_suite()) why = "the " + backend->name() + " backend has no layer suite yet";
    if (why) {
      record = identity_of(c);
      record["status"] = "skipped";
      record["skip_reason"] = *why;
      note = "skipped: " + *why;
    } else {
      try {
        record = c.is_layer() ? run_layer_case(*backend, c, request, caches) : run_case(*backend, c, request, caches.kernel);
        note = fmt::format("median {:.4f} ms, rel_err {:.2e}", record["median_ms"].get<double>(),
                           record["rel_err"].get<double>());
        if (record["status"] == "failed") note += " FAILED: " + record["check_failure"].get<std::string>();
      } catch (const std::exception& e) {
        record = identity_of(c);
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
      {"version", backend->device_info().value("lattnbench_version", "")},
      {"created_utc", started},
      {"argv", request.argv},
      {"config", to_json(config)},
      {"device", backend->device_info()},
      {"results", results},
      {"totals", totals},
  };
  write_file_atomically(out_path, document.dump(2) + "\n");
  fmt::print("{}", format_table(results));
  fmt::print("results: {}\n", out_path);
  return any_failed ? 1 : 0;
}

}  // namespace lattn

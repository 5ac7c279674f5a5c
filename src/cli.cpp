#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "backend.hpp"
#include "build_info.hpp"
#include "error.hpp"

namespace lattn {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Flags that override one config key each: (flag name, config key, help).
struct OverrideFlag {
  const char* flag;
  const char* key;
  const char* help;
};

const std::vector<OverrideFlag>& override_flags() {
  static const std::vector<OverrideFlag> flags = {
      {"--suite", "suites", "suites to run, comma list (kernel, layer)"},
      {"--impl", "impl", "impls, comma list (scan, chunked)"},
      {"--mode", "mode", "modes, comma list (fwd, fwd_bwd)"},
      {"--seq", "seq", "sequence lengths, comma list"},
      {"--dim", "dim", "head dims of the kernel suite, comma list"},
      {"--head-dim", "head_dim", "head dims of the layer suite, comma list"},
      {"--window", "window", "sliding windows of the layer suite, comma list"},
      {"--chunk", "chunk", "chunk sizes of the chunked form, comma list"},
      {"--batch", "batch", "batch sizes, comma list"},
      {"--heads", "heads", "head counts, comma list"},
      {"--decay", "decay", "decay modes, comma list (none, retnet)"},
      {"--backend", "backend", "cpu or cuda"},
      {"--dtype", "dtype", "float32 or bf16 (bf16 inputs, float32 accumulation; backends that lack it skip)"},
      {"--threads", "threads", "CPU threads of the whole run (0: every core)"},
      {"--warmup", "warmup", "warm-up calls after the cold one"},
      {"--reps", "reps", "timed samples per case"},
      {"--min-sample-ms", "min_sample_ms", "a sample lasts at least this long (ms)"},
      {"--seed", "seed", "seed of the inputs"},
      {"--device", "device", "GPU index of the CUDA backend (default 0)"},
      {"--bwd-states", "bwd_states", "chunked fwd_bwd: kept (the forward keeps the chunk states) or recomputed"},
  };
  return flags;
}

}  // namespace

std::string list_capabilities() {
  std::string out;
  out += "suites:   " + join(known_suites()) + "\n";
  out += "impls:    " + join(known_impls()) + "\n";
  out += "modes:    " + join(known_modes()) + "\n";
  out += "decays:   " + join(known_decays()) + "\n";
  out += "dtypes:   " + join(known_dtypes()) + "\n";
  out += "backends:\n";
  for (const auto& name : backend_names()) {
    try {
      auto backend = make_backend(name, BackendOptions{});
      const Availability a = backend->availability();
      out += fmt::format("  {:<5} {}\n", name, a.available ? "available" : "unavailable: " + a.reason);
    } catch (const UsageError& e) {
      std::string why = e.what();
      const auto colon = why.find(": ");
      out += fmt::format("  {:<5} unavailable: {}\n", name, colon == std::string::npos ? why : why.substr(colon + 2));
    }
  }
  return out;
}

CliOutcome parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{"lattnbench: benchmark causal linear-attention kernels (scan vs chunked) on CPU and GPU", "lattnbench"};
  app.get_formatter()->column_width(32);
  std::string config_path, out_path, dump_dir, gbench_path, resume_path, format = "table", shard;
  bool list = false, version = false, quiet = false, cold = false;
  app.add_option("-c,--config", config_path, "suite config, YAML (.yaml/.yml) or JSON (.json); default: built-in");
  app.add_option("-o,--out", out_path, "result JSON (default results/lattnbench-<backend>-<UTC time>.json)");
  app.add_option("--dump", dump_dir, "also write each case's inputs and outputs as .npy files here");
  app.add_option("--format", format, "stdout: table (default), json, csv or md");
  app.add_option("--gbench-out", gbench_path, "also write a Google Benchmark JSON export here");
  app.add_option("--shard", shard, "run the K-th of N cost-balanced slices of the plan (K/N, 1 <= K <= N)");
  app.add_option("--resume", resume_path, "continue the interrupted run whose journal this is (same command line)");
  app.add_flag("--list", list, "list suites, impls, modes and backends (and whether each is available here)");
  app.add_flag("--version", version, "print the version and exit");
  app.add_flag("-q,--quiet", quiet, "no progress lines on stderr");
  app.add_flag("--cold", cold, "flush the GPU's L2 cache before each timed call (CUDA; nvbench's cold measurement)");

  std::vector<std::string> override_values(override_flags().size());
  for (std::size_t i = 0; i < override_flags().size(); ++i)
    app.add_option(override_flags()[i].flag, override_values[i], override_flags()[i].help);

  std::vector<const char*> args;
  args.reserve(argv.size());
  for (const auto& a : argv) args.push_back(a.c_str());
  try {
    app.parse(int(args.size()), args.data());
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return {std::nullopt, 0};
  } catch (const CLI::ParseError& e) {
    throw UsageError("command line", e.what());
  }

  if (version) {
    fmt::print("lattnbench {} ({}{})\n", kVersion, kGitRevision, kGitDirty ? ", dirty" : "");
    return {std::nullopt, 0};
  }
  if (list) {
    fmt::print("{}", list_capabilities());
    return {std::nullopt, 0};
  }

  RunRequest request;
  request.config = config_path.empty() ? embedded_default_config() : load_config_file(config_path);
  Overrides overrides;
  for (std::size_t i = 0; i < override_flags().size(); ++i)
    if (app.get_option(override_flags()[i].flag)->count() > 0)
      overrides.values[override_flags()[i].key] = override_values[i];
  if (cold) overrides.values["cold"] = "true";
  apply_overrides(request.config, overrides);
  request.argv = argv;
  request.out_path = out_path;
  request.dump_dir = dump_dir;
  request.gbench_path = gbench_path;
  request.resume_path = resume_path;
  request.stdout_format = parse_output_format(format, "--format");
  if (!shard.empty()) request.shard = parse_shard(shard);
  request.quiet = quiet;
  return {request, 0};
}

}  // namespace lattn

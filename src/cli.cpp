#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "build_info.hpp"
#include "config_values.hpp"
#include "install_paths.hpp"
#include "ops.hpp"
#include "plugins.hpp"
#include "core/error.hpp"

namespace lattn {
namespace {

constexpr std::size_t kMaxFilterLength = 256;

}  // namespace

CliOutcome parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{"lattnbench: benchmark causal linear-attention kernels (scan vs chunked) on CPU and GPU", "lattnbench"};
  app.get_formatter()->column_width(32);
  std::string config_path, out_path, dump_dir, gbench_path, resume_path, format = "table", shard;
  std::string filter;
  bool list = false, list_cases = false, version = false, quiet = false, cold = false, force = false, isolate = false;
  bool interleave = false;
  std::vector<std::string> plugin_paths;
  app.add_option("-c,--config", config_path,
                 "suite config, YAML (.yaml/.yml) or JSON (.json), a path or the name of an installed one (smoke, gated, or a model layer: qwen3-next, kimi-linear, mamba2); "
                 "default: built-in");
  app.add_option("-o,--out", out_path, "result JSON (default results/lattnbench-<backend>-<UTC time>.json)");
  app.add_option("--dump", dump_dir, "also write each case's inputs and outputs as .npy files here");
  app.add_option("--format", format, "stdout: table, json, csv or md")->capture_default_str();
  app.add_option("--gbench-out", gbench_path, "also write a Google Benchmark JSON export here");
  app.add_option("--shard", shard, "run the K-th of N cost-balanced slices of the plan (K/N, 1 <= K <= N)");
  app.add_option("--resume", resume_path, "continue the interrupted run whose journal this is (same command line)");
  app.add_flag("--force", force, "start over although an unfinished run's journal is at --out's journal path");
  app.add_option("--filter", filter, "run only the cases whose name (as --list-cases shows it) this regular expression matches");
  app.add_flag("--list", list, "list suites, impls, modes and backends (and whether each is available here)");
  app.add_flag("--list-cases", list_cases, "list the planned cases (after --filter and --shard) with their estimated times; run nothing");
  app.add_flag("--version", version, "print the version and exit");
  app.add_flag("-q,--quiet", quiet, "no progress lines on stderr");
  app.add_option("--plugin", plugin_paths, "load a kernel plugin, a shared library (repeatable; docs/plugins.md)")
      ->allow_extra_args(false);
  app.add_flag("--isolate", isolate, "run each plugin case on the CPU in a child process, so that a crash fails only that case");
  app.add_flag("--interleave,!--no-interleave", interleave,
               "take the samples in rounds over the cases (default), or each case's samples together");
  app.add_flag("--cold", cold, "flush the GPU's L2 cache before each timed call (CUDA; nvbench's cold measurement)");

  const std::vector<ConfigKey> keys = config_keys();
  std::vector<std::string> override_values(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) app.add_option(keys[i].flag, override_values[i], keys[i].help);

  std::vector<const char*> args;
  args.reserve(argv.size());
  for (const auto& a : argv) args.push_back(a.c_str());
  try {
    app.parse(int(args.size()), args.data());
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, app.help(), false};
  } catch (const CLI::ParseError& e) {
    throw UsageError("command line", e.what());
  }

  if (version) return {std::nullopt, fmt::format("lattnbench {} ({}{})\n", kVersion, kGitRevision, kGitDirty ? ", dirty" : ""), false};
  // --list reads a config only when one is given or plugins are named (its `plugins:`).
  if (list && config_path.empty() && plugin_paths.empty()) return {std::nullopt, "", true};

  RunRequest request;
  request.config = config_path.empty() ? embedded_default_config() : load_config_file(resolve_config_path(config_path));
  Overrides overrides;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (app.get_option(keys[i].flag)->count() > 0) overrides.values[keys[i].key] = override_values[i];
  if (cold) overrides.values["cold"] = "true";
  if (app.get_option("--interleave")->count() > 0) overrides.values["interleave"] = interleave ? "true" : "false";
  apply_overrides(request.config, overrides);
  for (const std::string& path : plugin_paths) request.config.plugins.push_back({path, "", ""});
  request.plugins = load_plugins(request.config);
  check_plugin_impls(request.config, request.plugins);
  if (list) return {request, "", true};
  if (isolate && request.config.run.backend != "cpu")
    throw UsageError("--isolate", "isolates CPU cases only (a forked child cannot use its parent's CUDA context)");
  request.isolate = isolate;
  request.argv = argv;
  request.out_path = out_path;
  request.dump_dir = dump_dir;
  request.gbench_path = gbench_path;
  request.resume_path = resume_path;
  request.force = force;
  request.stdout_format = parse_output_format(format, "--format");
  if (!shard.empty()) request.shard = parse_shard(shard);
  // The expression is compiled by the run (src/plan.cpp filter_plan), before it writes anything;
  // not here, so that the parser's fuzzer never builds a regular expression of its own making.
  if (filter.size() > kMaxFilterLength)
    throw UsageError("--filter", fmt::format("longer than {} characters (a case's name is under 100)", kMaxFilterLength));
  request.filter = filter;
  request.list_cases = list_cases;
  request.quiet = quiet;
  return {request, "", false};
}

}  // namespace lattn

#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "backend.hpp"
#include "build_info.hpp"
#include "config_values.hpp"
#include "ops.hpp"
#include "plugins.hpp"
#include "core/error.hpp"

namespace lattn {

std::string list_capabilities(const Plugins& plugins, const Config* config) {
  // Every plannable op's forms and decay kinds, each once.
  std::vector<std::string> impls, decays;
  auto add = [](std::vector<std::string>& names, const std::string& name) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const Op* op : all_ops()) {
    if (op->suite.empty()) continue;
    for (const Form& f : op->forms) add(impls, f.name);
    for (const Axis& a : op->axes)
      if (a.param == Param::decay)
        for (const std::string& d : a.choices) add(decays, d);
  }
  std::string out;
  out += "suites:   " + join(known_suites()) + "\n";
  out += "impls:    " + join(impls) + "\n";
  out += "modes:    " + join(mode_names()) + "\n";
  out += "decays:   " + join(decays) + "\n";
  out += "dtypes:   " + join(known_dtypes()) + "\n";
  out += "backends:\n";
  for (const auto& name : backend_names()) {
    try {
      BackendOptions options;
      options.plugins = plugins;
      auto backend = make_backend(name, options);
      const Availability a = backend->availability();
      // What the backend's table has, by suite: "kernel scan, chunked; layer scan, chunked".
      std::string rows;
      for (const Op* op : all_ops()) {
        if (op->suite.empty()) continue;
        std::vector<std::string> forms;
        for (const ImplRow& row : backend->impls)
          if (row.op == op->name) forms.push_back(row.impl);
        if (!forms.empty()) rows += (rows.empty() ? "" : "; ") + op->suite + " " + join(forms);
      }
      out += fmt::format("  {:<5} {} ({})\n", name, a.available ? "available" : "unavailable: " + a.reason, rows);
    } catch (const UsageError& e) {
      std::string why = e.what();
      const auto colon = why.find(": ");
      out += fmt::format("  {:<5} unavailable: {}\n", name, colon == std::string::npos ? why : why.substr(colon + 2));
    }
  }
  if (config) out += describe_plugins(plugins, *config);
  return out;
}

CliOutcome parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{"lattnbench: benchmark causal linear-attention kernels (scan vs chunked) on CPU and GPU", "lattnbench"};
  app.get_formatter()->column_width(32);
  std::string config_path, out_path, dump_dir, gbench_path, resume_path, format = "table", shard;
  bool list = false, version = false, quiet = false, cold = false, isolate = false;
  std::vector<std::string> plugin_paths;
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
  app.add_option("--plugin", plugin_paths, "load a kernel plugin, a shared library (repeatable; docs/plugins.md)")
      ->allow_extra_args(false);
  app.add_flag("--isolate", isolate, "run each plugin case on the CPU in a child process, so that a crash fails only that case");
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
    fmt::print("{}", app.help());
    return {std::nullopt, 0};
  } catch (const CLI::ParseError& e) {
    throw UsageError("command line", e.what());
  }

  if (version) {
    fmt::print("lattnbench {} ({}{})\n", kVersion, kGitRevision, kGitDirty ? ", dirty" : "");
    return {std::nullopt, 0};
  }
  RunRequest request;
  // --list reads a config only when it names plugins or is given (its `plugins:`).
  if (list && config_path.empty() && plugin_paths.empty()) {
    fmt::print("{}", list_capabilities());
    return {std::nullopt, 0};
  }
  request.config = config_path.empty() ? embedded_default_config() : load_config_file(config_path);
  Overrides overrides;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (app.get_option(keys[i].flag)->count() > 0) overrides.values[keys[i].key] = override_values[i];
  if (cold) overrides.values["cold"] = "true";
  apply_overrides(request.config, overrides);
  for (const std::string& path : plugin_paths) request.config.plugins.push_back({path, "", ""});
  request.plugins = load_plugins(request.config);
  check_plugin_impls(request.config, request.plugins);
  if (list) {
    fmt::print("{}", list_capabilities(request.plugins, &request.config));
    return {std::nullopt, 0};
  }
  if (isolate && request.config.run.backend != "cpu")
    throw UsageError("--isolate", "isolates CPU cases only (a forked child cannot use its parent's CUDA context)");
  request.isolate = isolate;
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

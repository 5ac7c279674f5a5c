#include "src/cli/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "src/results/build_info.hpp"
#include "src/config/config_values.hpp"
#include "src/config/install_paths.hpp"
#include "src/config/ops.hpp"
#include "src/plugins/plugins.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cstdlib>

namespace lattn {
namespace {

constexpr std::size_t kMaxFilterLength = 256;

std::string comma_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// What --tuning and LATTN_TUNING take (backends/cpu/tuning.hpp's modes: src/ names no backend).
const std::vector<std::string>& cpu_tuning_modes() {
  static const std::vector<std::string> v = {"auto", "shipped", "default", "calibrate", "exhaustive"};
  return v;
}

// The tuning mode of the run: --retune, else --tuning, else $LATTN_TUNING, else auto.
std::string tuning_mode(const std::string& flag, bool flag_given, bool retune) {
  const auto& modes = cpu_tuning_modes();
  auto check = [&](const std::string& where, const std::string& value) {
    if (std::find(modes.begin(), modes.end(), value) == modes.end())
      throw UsageError(where, "expected one of " + comma_list(modes) + ", got '" + value + "'");
    return value;
  };
  if (retune) {
    if (flag_given && flag != "calibrate") throw UsageError("--retune", "contradicts --tuning " + flag + ": give one of them");
    return "calibrate";
  }
  if (flag_given) return check("--tuning", flag);
  if (const char* env = std::getenv("LATTN_TUNING"); env && *env) return check("LATTN_TUNING", env);
  return "auto";
}

// LATTN_AMX: the tiles the CPU's AMX rows run on (kernels/linear_attention/cpu/bf16.hpp's AmxPath
// names: src/ names no backend), or "" where it is not set.
std::string amx_tiles_from_environment() {
  static const std::vector<std::string> names = {"hardware", "emulated", "counted", "none"};
  const char* env = std::getenv("LATTN_AMX");
  if (!env || !*env) return "";
  if (std::find(names.begin(), names.end(), std::string(env)) == names.end())
    throw UsageError("LATTN_AMX", "expected one of " + comma_list(names) + ", got '" + env + "'");
  return env;
}

const std::vector<std::string>& stdout_formats() {
  static const std::vector<std::string> v = {"table", "json", "csv", "md"};
  return v;
}

// --completion-words (hidden): a line per flag whose value is one of a list, "FLAG|FLAG WORD...",
// from the lists the parser checks against; cmake/cli_docs.sh writes the bash completion from it.
std::string completion_words(const std::vector<ConfigKey>& keys) {
  std::string out = "-c|--config";
  for (const std::string& name : installed_config_names()) out += " " + name;
  out += "\n--format";
  for (const std::string& f : stdout_formats()) out += " " + f;
  out += "\n--tuning";
  for (const std::string& m : cpu_tuning_modes()) out += " " + m;
  out += "\n";
  for (const ConfigKey& k : keys) {
    if (k.choices.empty()) continue;
    out += k.flag;
    for (const std::string& choice : k.choices) out += " " + choice;
    out += "\n";
  }
  return out;
}

}  // namespace

CliOutcome parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{"lattnbench: benchmark causal linear-attention kernels (scan vs chunked) on CPU and GPU", "lattnbench"};
  app.get_formatter()->column_width(32);
  std::string config_path, dump_dir, gbench_path, resume_path, format = "table", shard;
  std::string filter;
  bool list = false, list_cases = false, version = false, quiet = false, cold = false, force = false, isolate = false;
  bool interleave = false, no_interleave = false, words = false;
  std::vector<std::string> plugin_paths, out_paths;
  const std::vector<std::string> configs = installed_config_names();
  app.add_option("-c,--config", config_path,
                 "suite config, YAML (.yaml/.yml) or JSON (.json), a path or the name of an installed one" +
                     (configs.empty() ? std::string() : " (" + comma_list(configs) + ")") + "; default: built-in")
      ->type_name("FILE|NAME");
  app.add_option("-o,--out", out_paths,
                 "where the results go, in the format of the extension (.json, .csv, .md); '-' or /dev/stdout: the JSON on "
                 "stdout; repeatable (default: with the table on stdout, results/lattnbench-<backend>-<UTC time>.json)")
      ->type_name("FILE")
      ->allow_extra_args(false);
  app.add_option("--dump", dump_dir, "also write each case's inputs and outputs as .npy files here")->type_name("DIR");
  app.add_option("--format", format,
                 "what stdout shows: " + comma_list(stdout_formats()) + " (json, csv, md: no default result file) [default: table]")
      ->type_name("NAME");
  app.add_option("--gbench-out", gbench_path, "also write a Google Benchmark JSON export here")->type_name("FILE");
  app.add_option("--shard", shard, "run the K-th of N cost-balanced slices of the plan (1 <= K <= N)")->type_name("K/N");
  app.add_option("--resume", resume_path, "continue the interrupted run whose journal this is (same command line)")
      ->type_name("JOURNAL");
  app.add_flag("--force", force, "start over although an unfinished run's journal is at --out's journal path");
  app.add_option("--filter", filter, "run only the cases whose name (as --list-cases shows it) this regular expression matches")
      ->type_name("REGEX");
  app.add_flag("--list", list, "list suites, impls, modes and backends (and whether each is available here)");
  app.add_flag("--list-cases", list_cases, "list the planned cases (after --filter and --shard) with their estimated times; run nothing");
  app.add_flag("--version", version, "print the version and exit");
  app.add_flag("-q,--quiet", quiet, "no progress lines on stderr");
  app.add_option("--plugin", plugin_paths, "load a kernel plugin: a shared library, a Python file or python:MODULE (repeatable; docs/plugins.md)")
      ->type_name("FILE")
      ->allow_extra_args(false);
  app.add_flag("--isolate", isolate, "run each plugin case on the CPU in a child process, so that a crash fails only that case");
  // Two flags, not CLI11's "!--no-interleave" form, whose --help line reads "--no-interleave{false}".
  app.add_flag("--interleave", interleave, "take the samples in rounds over the cases (the default)");
  app.add_flag("--no-interleave", no_interleave, "take each case's samples together, back to back");
  app.add_flag("--cold", cold, "the same as --cache cold: each timed call reads inputs no cache holds");
  std::string tuning;
  bool retune = false;
  app.add_option("--tuning", tuning,
                 "how the CPU kernels' runtime choices are decided: " + comma_list(cpu_tuning_modes()) +
                     " (docs/performance.md) [default: $LATTN_TUNING, else auto]")
      ->type_name("NAME");
  app.add_flag("--retune", retune, "calibrate the CPU kernels' choices again and replace the cached ones (--tuning calibrate)");

  const std::vector<ConfigKey> keys = config_keys();
  std::vector<std::string> override_values(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i)
    app.add_option(keys[i].flag, override_values[i], keys[i].help)->type_name(keys[i].type);
  app.add_flag("--completion-words", words)->group("");  // hidden: for cmake/cli_docs.sh

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

  if (words) return {std::nullopt, completion_words(keys), false};
  if (interleave && no_interleave) throw UsageError("--no-interleave", "contradicts --interleave: give one of them");
  if (version) return {std::nullopt, fmt::format("lattnbench {} ({}{})\n", kVersion, kGitRevision, kGitDirty ? ", dirty" : ""), false};
  // --list reads a config only when one is given or plugins are named (its `plugins:`).
  if (list && config_path.empty() && plugin_paths.empty()) return {std::nullopt, "", true};

  RunRequest request;
  request.config = config_path.empty() ? embedded_default_config() : load_config_file(resolve_config_path(config_path));
  Overrides overrides;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (app.get_option(keys[i].flag)->count() > 0) overrides.values[keys[i].key] = override_values[i];
  if (cold) {
    if (overrides.values.count("cache")) throw UsageError("--cold", "means --cache cold: give one of them");
    overrides.values["cache"] = "cold";
  }
  if (interleave || no_interleave) overrides.values["interleave"] = interleave ? "true" : "false";
  apply_overrides(request.config, overrides);
  for (const std::string& path : plugin_paths) request.config.plugins.push_back({path, "", ""});
  request.plugins = load_plugins(request.config);
  check_plugin_impls(request.config, request.plugins);
  if (list) return {request, "", true};
  if (isolate && request.config.run.backend != "cpu")
    throw UsageError("--isolate", "isolates CPU cases only (a forked child cannot use its parent's CUDA context)");
  request.isolate = isolate;
  request.argv = argv;
  const bool stdout_out = std::any_of(out_paths.begin(), out_paths.end(), is_stdout_path);
  if (stdout_out && app.get_option("--format")->count() > 0 && format != "json")
    throw UsageError("--out", "'-' puts the result JSON on stdout, where --format " + format + " would print too: drop one");
  if (!out_paths.empty()) {
    request.out_path = out_paths.front();
    request.more_out_paths.assign(out_paths.begin() + 1, out_paths.end());
  }
  request.dump_dir = dump_dir;
  request.gbench_path = gbench_path;
  request.resume_path = resume_path;
  request.force = force;
  request.stdout_format = parse_output_format(format, "--format");
  if (!shard.empty()) request.shard = parse_shard(shard);
  // The expression is compiled by the run (src/config/plan.cpp filter_plan), before it writes anything;
  // not here, so that the parser's fuzzer never builds a regular expression of its own making.
  if (filter.size() > kMaxFilterLength)
    throw UsageError("--filter", fmt::format("longer than {} characters (a case's name is under 100)", kMaxFilterLength));
  request.filter = filter;
  request.list_cases = list_cases;
  request.quiet = quiet;
  request.tuning = tuning_mode(tuning, app.get_option("--tuning")->count() > 0, retune);
  request.amx_tiles = amx_tiles_from_environment();
  return {request, "", false};
}

}  // namespace lattn

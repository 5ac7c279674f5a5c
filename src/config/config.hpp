// The suite config: one schema for YAML and JSON files, one validator, and the CLI overrides that
// go through the same value checks. The run settings are fixed keys; each suite's keys are its
// op's axes (core/op.hpp), so a new axis or suite needs no code here. docs/config.md lists them.
#pragma once

// The declarations below only name nlohmann::json: the forward header keeps the full one (2-4 s of
// parsing) out of the many files that include this one for the config types alone.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/op.hpp"

namespace lattn {

struct RunSettings {
  std::string backend = "cpu";
  std::string dtype = "float32";
  int threads = 0;  // 0: every core
  int warmup = 2;
  int reps = 10;            // the most samples a case takes
  double min_sample_ms = 25.0;
  int min_samples = 5;      // the fewest before the noise target may stop a case (at most reps)
  double max_noise = 1.0;   // percent: stop a case once its median's noise is at most this; 0: never
  double timeout = 60.0;    // seconds of a case's own measuring time; 0: no limit
  bool interleave = true;   // take the cases' samples in rounds over the cases (docs/harness.md)
  // The fraction of the host's physical memory the cases of one interleaved batch may hold
  // together (docs/harness.md): the run's peak memory, and what it prepares before a first case ends.
  double batch_memory = 1.0 / 32;
  double slowdown = 0.0;    // testing aid: percent added to every call by a spin (docs/harness.md)
  int check_heads = 0;      // check only the first this many (sequence, head) pairs (Op::check_part); 0: all
  std::uint64_t seed = 0;
  int device = 0;     // GPU index (CUDA backend)
  std::string bwd_states = "kept";  // chunked fwd_bwd: "kept" from the forward or "recomputed" (BackendOptions)
};

// The values of one config key of a suite: numbers for integer axes, names for the others.
struct AxisValues {
  std::vector<long> numbers;
  std::vector<std::string> names;
};

// One suite's settings: its op and a list of values per axis key (every key has one).
struct SuiteConfig {
  const Op* op = nullptr;
  std::map<std::string, AxisValues> values;

  const std::vector<long>& numbers(const std::string& key) const { return values.at(key).numbers; }
  const std::vector<std::string>& names(const std::string& key) const { return values.at(key).names; }
};

// A plugin the run loads (docs/plugins.md): its path (a config's is relative to the config file)
// and, once loaded (src/plugins/plugins.hpp), its name and the SHA-256 of its file, which the config
// block of the result file records.
struct PluginFile {
  std::string path, name, sha256;
};

struct Config {
  Config();  // the defaults: every suite with its axes' default values

  std::vector<std::string> suites{"kernel", "layer"};  // the suites to run
  RunSettings run;
  std::vector<SuiteConfig> suite_configs;  // every suite's settings, selected or not
  std::string source = "<built-in>";       // where the config came from, for messages and the JSON
  std::vector<PluginFile> plugins;         // the config's `plugins:`, then --plugin's

  const SuiteConfig& suite(const std::string& name) const;
  SuiteConfig& suite(const std::string& name);
};

// The names the config accepts, for --list and for messages.
std::vector<std::string> known_suites();
const std::vector<std::string>& known_dtypes();
const std::vector<std::string>& known_backends();
const std::vector<std::string>& known_bwd_states();

// A key the command line can set (a flag per key: "seq" -> --seq), with its help line, its
// value's type as --help shows it ("INT,...", "NAME") and the names it accepts (empty for numbers).
struct ConfigKey {
  std::string key, flag, help;
  std::string type;
  std::vector<std::string> choices;
};
// The run settings' keys and every suite's, each once.
std::vector<ConfigKey> config_keys();

// Parses `text` as YAML or JSON (by the extension of `source_name`: .json is JSON, else YAML).
Config parse_config(const std::string& text, const std::string& source_name);
Config load_config_file(const std::string& path);
Config embedded_default_config();  // configs/default.yaml, compiled in

// Overrides given on the command line; each value keeps the raw text and is validated as a config
// value with the flag as its location.
struct Overrides {
  std::map<std::string, std::string> values;  // config key (e.g. "seq") -> raw CLI text
};
void apply_overrides(Config& config, const Overrides& overrides);

nlohmann::json to_json(const Config& config);

// How an axis' values are written: its kind (an option's own; names for impl, mode and decay;
// integers for the rest), and one value, kept as text, as JSON of that kind.
Kind kind_of(const Axis& axis);
nlohmann::json axis_value_json(const Axis& axis, const std::string& text);

}  // namespace lattn

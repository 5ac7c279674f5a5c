// The suite config: one schema for YAML and JSON files, one validator, and the CLI overrides that
// go through the same value checks. The schema is documented in docs/config.md.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "problem.hpp"

namespace lattn {

enum class Impl { scan, chunked };
enum class Mode { fwd, fwd_bwd };

std::string to_string(Impl impl);
std::string to_string(Mode mode);
std::string to_string(Decay decay);

struct KernelSuite {
  std::vector<int> batch{2};
  std::vector<int> heads{4};
  std::vector<int> seq{512, 2048, 8192};
  std::vector<int> dim{32, 64, 128};
  std::vector<int> chunk{128};
  std::vector<Impl> impl{Impl::scan, Impl::chunked};
  std::vector<Mode> mode{Mode::fwd, Mode::fwd_bwd};
  std::vector<Decay> decay{Decay::none};
};

// The hybrid block of SPEC section 2: model width heads * head_dim, a linear branch (impl, chunk,
// decay) and a sliding-window branch of `window` keys.
struct LayerSuite {
  std::vector<int> batch{2};
  std::vector<int> heads{8};
  std::vector<int> head_dim{64};
  std::vector<int> window{128};
  std::vector<int> seq{512, 2048};
  std::vector<int> chunk{128};
  std::vector<Impl> impl{Impl::scan, Impl::chunked};
  std::vector<Mode> mode{Mode::fwd, Mode::fwd_bwd};
  std::vector<Decay> decay{Decay::none};
};

struct RunSettings {
  std::string backend = "cpu";
  std::string dtype = "float32";
  int threads = 0;  // 0: every core
  int warmup = 2;
  int reps = 10;
  double min_sample_ms = 25.0;
  std::uint64_t seed = 0;
  int device = 0;     // GPU index (CUDA backend)
  bool cold = false;  // flush the L2 cache before each timed call (CUDA backend)
  std::string bwd_states = "kept";  // chunked fwd_bwd: "kept" from the forward or "recomputed" (BackendOptions)
};

struct Config {
  std::vector<std::string> suites{"kernel", "layer"};
  RunSettings run;
  KernelSuite kernel;
  LayerSuite layer;
  std::string source = "<built-in>";  // where the config came from, for messages and the JSON
};

// One entry of the plan: everything a backend needs to run a case. For a layer case, `problem` is
// the linear branch's (dim = head_dim) and `window` the sliding window; kernel cases have window 0.
struct Case {
  std::string suite;
  Impl impl;
  Mode mode;
  Problem problem;
  std::string backend;
  std::string dtype;
  std::size_t plan_index = 0;
  int window = 0;

  bool is_layer() const { return suite == "layer"; }
  int model_dim() const { return problem.heads * problem.dim; }
};

// The names the config accepts, for --list and for messages.
const std::vector<std::string>& known_suites();
const std::vector<std::string>& known_impls();
const std::vector<std::string>& known_modes();
const std::vector<std::string>& known_decays();
const std::vector<std::string>& known_dtypes();
const std::vector<std::string>& known_bwd_states();

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

// Checks what only the whole config can tell (sizes that no machine could hold, etc.).
void validate_config(const Config& config);

std::vector<Case> expand_plan(const Config& config);

nlohmann::json to_json(const Config& config);

}  // namespace lattn

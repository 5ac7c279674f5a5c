// Config loading and validation. YAML and JSON share one path: a JSON file is first checked by a
// strict JSON parser (so JSON syntax errors read as JSON errors), then read through yaml-cpp, of
// whose YAML 1.2 JSON is a subset, so that both formats reach the same validator with line numbers.
#include "config.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "config_values.hpp"
#include "core/error.hpp"
#include "ops.hpp"
#include "plan.hpp"

namespace lattn {

extern const char* const kEmbeddedDefaultConfig;  // generated from configs/default.yaml

namespace {

// Run settings beyond these are refused; each op's axes carry their own ranges (kernels/<op>/op.cpp).
constexpr long kMaxDevice = 1023;
constexpr long kMaxThreads = 4096, kMaxWarmup = 1000000, kMaxReps = 100000;

struct Field {
  std::string key;
  bool is_list;
  std::function<void(Config&, const std::vector<Raw>&)> set;
  std::string help;  // the flag's help line
};

// The values an axis accepts when they are names: the op's forms, the modes, the decays.
std::vector<std::string> axis_choices(const Op& op, const Axis& axis) {
  switch (axis.param) {
    case Param::impl: {
      std::vector<std::string> names;
      for (const Form& f : op.forms) names.push_back(f.name);
      return names;
    }
    case Param::mode: return mode_names();
    default: return axis.choices;
  }
}

// Every value is kept: integers as numbers; names, and an option's values whatever its kind, as
// the text a config would write (a real in its shortest exact form, a boolean as true or false).
AxisValues parse_axis(const Op& op, const Axis& axis, const std::vector<Raw>& raws) {
  AxisValues values;
  const std::string what = axis.param == Param::option ? axis.key : axis.param == Param::impl ? "impl"
                           : axis.param == Param::mode ? "mode" : "decay";
  switch (kind_of(axis)) {
    case Kind::name: {
      const std::vector<std::string> choices = axis_choices(op, axis);
      // A plugin's NAME:IMPL is held to the plugins once they are loaded (check_plugin_impls).
      values.names = parse_list<std::string>(raws, [&](const Raw& r) -> std::string {
        if (axis.param == Param::impl && is_plugin_impl_name(r.text)) return r.text;
        return parse_choice(r, choices, what.c_str());
      });
      break;
    }
    case Kind::integer:
      if (axis.param == Param::option)
        values.names = parse_list<std::string>(raws, [&](const Raw& r) { return std::to_string(parse_int(r, axis.lo, axis.hi)); });
      else
        values.numbers = parse_list<long>(raws, [&](const Raw& r) { return parse_int(r, axis.lo, axis.hi); });
      break;
    case Kind::real:
      values.names = parse_list<std::string>(
          raws, [&](const Raw& r) { return fmt::format("{}", parse_real(r, axis.real_lo, axis.real_hi)); });
      break;
    case Kind::boolean:
      values.names = parse_list<std::string>(raws, [&](const Raw& r) { return std::string(parse_bool(r) ? "true" : "false"); });
      break;
  }
  return values;
}

// A suite's keys: its op's axes.
std::vector<Field> suite_fields(const std::string& suite) {
  std::vector<Field> fields;
  const Op* op = op_for_suite(suite);
  if (!op) return fields;
  for (const Axis& axis : op->axes)
    fields.push_back({axis.key, true,
                      [op, axis, suite](Config& c, const std::vector<Raw>& raws) {
                        c.suite(suite).values[axis.key] = parse_axis(*op, axis, raws);
                      },
                      axis.help});
  return fields;
}

const std::vector<Field>& top_fields() {
  static const std::vector<Field> fields = {
      {"suites", true,
       [](Config& c, const std::vector<Raw>& raws) {
         const std::vector<std::string> suites = known_suites();
         c.suites = parse_list<std::string>(raws, [&](const Raw& r) { return parse_choice(r, suites, "suite"); });
       },
       "suites to run"},
      {"backend", false,
       [](Config& c, const std::vector<Raw>& raws) {
         static const std::vector<std::string> backends = {"cpu", "cuda"};
         c.run.backend = parse_choice(raws[0], backends, "backend");
       },
       "cpu or cuda"},
      {"dtype", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.dtype = parse_choice(raws[0], known_dtypes(), "dtype"); },
       "float32 or bf16 (bf16 inputs, float32 accumulation; backends that lack it skip)"},
      {"threads", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.threads = int(parse_int(raws[0], 0, kMaxThreads)); },
       "CPU threads of the whole run (0: every core)"},
      {"warmup", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.warmup = int(parse_int(raws[0], 0, kMaxWarmup)); },
       "warm-up calls after the cold one"},
      {"reps", false, [](Config& c, const std::vector<Raw>& raws) { c.run.reps = int(parse_int(raws[0], 1, kMaxReps)); },
       "timed samples per case"},
      {"min_sample_ms", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.min_sample_ms = parse_positive_number(raws[0], 60000); },
       "a sample lasts at least this long (ms)"},
      {"seed", false, [](Config& c, const std::vector<Raw>& raws) { c.run.seed = parse_seed(raws[0]); },
       "seed of the inputs"},
      {"device", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.device = int(parse_int(raws[0], 0, kMaxDevice)); },
       "GPU index of the CUDA backend (default 0)"},
      {"cold", false, [](Config& c, const std::vector<Raw>& raws) { c.run.cold = parse_bool(raws[0]); },
       ""},  // set by the flag --cold (src/cli.cpp), which takes no value
      {"bwd_states", false,
       [](Config& c, const std::vector<Raw>& raws) {
         c.run.bwd_states = parse_choice(raws[0], known_bwd_states(), "bwd_states");
       },
       "chunked fwd_bwd: kept (the forward keeps the chunk states) or recomputed"},
      {"plugins", true,
       [](Config& c, const std::vector<Raw>& raws) {
         // Relative to the config file, so that a config and its plugins move together.
         const std::filesystem::path base = std::filesystem::path(c.source).parent_path();
         c.plugins.clear();
         for (const std::string& path : parse_list<std::string>(raws, [](const Raw& r) {
                if (r.text.empty()) throw UsageError(r.where, "expected a plugin's path, got an empty string");
                return r.text;
              }))
           c.plugins.push_back({(base / path).lexically_normal().string(), "", ""});
       },
       ""},  // set by the flag --plugin (src/cli.cpp), which may be given more than once
  };
  return fields;
}

std::vector<std::string> field_keys(const std::vector<Field>& fields) {
  std::vector<std::string> keys;
  keys.reserve(fields.size());
  for (const auto& f : fields) keys.push_back(f.key);
  return keys;
}

const Field* find_field(const std::vector<Field>& fields, const std::string& key) {
  for (const auto& f : fields)
    if (f.key == key) return &f;
  return nullptr;
}

// ---- YAML tree -> fields ----

std::string at(const std::string& source, const YAML::Node& node) {
  return source + ":" + std::to_string(node.Mark().line + 1);
}

Raw scalar_raw(const YAML::Node& node, const std::string& source, const std::string& key) {
  const std::string where = at(source, node) + ": " + key;
  if (!node.IsScalar()) throw UsageError(where, "expected a single value, got a " + std::string(node.IsMap() ? "mapping" : node.IsSequence() ? "list" : "null"));
  return Raw{node.Scalar(), where, node.Tag() == "!"};
}

std::vector<Raw> node_raws(const YAML::Node& node, const std::string& source, const std::string& key, bool is_list) {
  const std::string where = at(source, node) + ": " + key;
  if (node.IsNull()) throw UsageError(where, "expected a value, got nothing");
  if (node.IsMap()) throw UsageError(where, "expected " + std::string(is_list ? "a value or a list" : "a single value") + ", got a mapping");
  if (node.IsSequence()) {
    if (!is_list) throw UsageError(where, "expected a single value, got a list");
    if (node.size() == 0) throw UsageError(where, "expected at least one value, got an empty list");
    std::vector<Raw> raws;
    for (const auto& item : node) raws.push_back(scalar_raw(item, source, key));
    return raws;
  }
  return {scalar_raw(node, source, key)};
}

void apply_mapping(Config& config, const YAML::Node& map, const std::string& source, const std::vector<Field>& fields,
                   const std::string& prefix, const std::function<bool(const std::string&, const YAML::Node&)>& section) {
  for (const auto& entry : map) {
    const YAML::Node& key_node = entry.first;
    const std::string key = key_node.Scalar();
    if (section && section(key, entry.second)) continue;
    const Field* field = find_field(fields, key);
    if (!field) {
      auto keys = field_keys(fields);
      if (section) {
        const std::vector<std::string> suites = known_suites();
        keys.insert(keys.end(), suites.begin(), suites.end());
      }
      throw UsageError(at(source, key_node), "unknown key '" + prefix + key + "' (expected one of: " + join(keys) + ")");
    }
    field->set(config, node_raws(entry.second, source, prefix + key, field->is_list));
  }
}

int line_of_byte(const std::string& text, std::size_t byte) {
  byte = std::min(byte, text.size());
  return 1 + int(std::count(text.begin(), text.begin() + long(byte), '\n'));
}

}  // namespace

Config::Config() {
  for (const Op* op : all_ops()) {
    if (op->suite.empty()) continue;
    SuiteConfig suite{op, {}};
    for (const Axis& axis : op->axes) {
      std::vector<Raw> raws;
      for (const std::string& value : axis.defaults) raws.push_back(Raw{value, op->suite + "." + axis.key, false});
      suite.values[axis.key] = parse_axis(*op, axis, raws);
    }
    suite_configs.push_back(std::move(suite));
  }
}

const SuiteConfig& Config::suite(const std::string& name) const {
  for (const SuiteConfig& s : suite_configs)
    if (s.op->suite == name) return s;
  throw RuntimeFailure("no suite '" + name + "'");
}

SuiteConfig& Config::suite(const std::string& name) {
  return const_cast<SuiteConfig&>(static_cast<const Config&>(*this).suite(name));
}

std::vector<std::string> known_suites() {
  std::vector<std::string> names;
  for (const Op* op : all_ops())
    if (!op->suite.empty()) names.push_back(op->suite);
  return names;
}

const std::vector<std::string>& known_bwd_states() {
  static const std::vector<std::string> v = {"kept", "recomputed"};
  return v;
}

const std::vector<std::string>& known_dtypes() {
  static const std::vector<std::string> v = {"float32", "bf16"};
  return v;
}

Config parse_config(const std::string& original_text, const std::string& source) {
  std::string text = original_text;
  const bool is_json = source.size() >= 5 && source.compare(source.size() - 5, 5, ".json") == 0;
  if (is_json) {
    try {
      const nlohmann::json parsed = nlohmann::json::parse(text);
      (void)parsed;
    } catch (const nlohmann::json::parse_error& e) {
      std::string what = e.what();
      const auto colon = what.find(": ", what.find("column"));
      if (colon != std::string::npos) what = what.substr(colon + 2);
      throw UsageError(source + ":" + std::to_string(line_of_byte(text, e.byte ? e.byte - 1 : 0)),
                       "JSON syntax error: " + what);
    } catch (const nlohmann::json::out_of_range& e) {
      // A number too large for a double ("number overflow parsing '1e999'"); it has no position,
      // so the line is where the number first appears.
      const std::string what = e.what();
      const auto open = what.find('\''), close = what.rfind('\'');
      const std::string token = open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
      const std::size_t at_byte = token.empty() ? std::string::npos : text.find(token);
      throw UsageError(source + (at_byte == std::string::npos ? "" : ":" + std::to_string(line_of_byte(text, at_byte))),
                       "JSON number out of range: '" + token + "'");
    }
    // Valid JSON has tabs only as whitespace between tokens, which YAML does not accept everywhere.
    std::replace(text.begin(), text.end(), '\t', ' ');
  }

  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UsageError(source + ":" + std::to_string(e.mark.line + 1), "YAML syntax error: " + e.msg);
  }
  if (!root || root.IsNull()) throw UsageError(source, "the config is empty (expected a mapping of keys)");
  if (!root.IsMap()) throw UsageError(source + ":" + std::to_string(root.Mark().line + 1), "expected a mapping at the top level");

  Config config;
  config.source = source;
  apply_mapping(config, root, source, top_fields(), "",
                [&](const std::string& key, const YAML::Node& value) {
                  const std::vector<std::string> suites = known_suites();
                  if (std::find(suites.begin(), suites.end(), key) == suites.end()) return false;
                  if (!value.IsMap())
                    throw UsageError(at(source, value) + ": " + key, "expected a mapping of the " + key + " suite's keys");
                  apply_mapping(config, value, source, suite_fields(key), key + ".", nullptr);
                  return true;
                });
  validate_config(config);
  return config;
}

Config load_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path, "cannot read the config file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_config(buffer.str(), path);
}

Config embedded_default_config() { return parse_config(kEmbeddedDefaultConfig, "<built-in default.yaml>"); }

namespace {

std::vector<Raw> override_raws(const Field& field, const std::string& flag_name, const std::string& text) {
  std::vector<Raw> raws;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (!field.is_list && !raws.empty()) break;
    raws.push_back(Raw{item, flag_name, false});
  }
  if (text.empty() || raws.empty() || (!field.is_list && text.find(',') != std::string::npos))
    throw UsageError(flag_name, field.is_list ? "expected a value or a comma list, got '" + text + "'"
                                              : "expected a single value, got '" + text + "'");
  return raws;
}

std::string flag_of(const std::string& key) {
  std::string flag = "--" + (key == "suites" ? std::string("suite") : key);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace

void apply_overrides(Config& config, const Overrides& overrides) {
  // Top-level keys first: --suite decides which suites the suite keys below go to.
  for (const auto& [key, text] : overrides.values)
    if (const Field* field = find_field(top_fields(), key)) field->set(config, override_raws(*field, flag_of(key), text));
  for (const auto& [key, text] : overrides.values) {
    if (find_field(top_fields(), key)) continue;
    // A suite key goes to every selected suite that has it (--seq sets kernel.seq and layer.seq).
    std::vector<std::string> owners;
    bool applied = false;
    for (const auto& suite : known_suites()) {
      const std::vector<Field> fields = suite_fields(suite);
      const Field* field = find_field(fields, key);
      if (!field) continue;
      owners.push_back(suite);
      if (std::find(config.suites.begin(), config.suites.end(), suite) == config.suites.end()) continue;
      field->set(config, override_raws(*field, flag_of(key), text));
      applied = true;
    }
    if (owners.empty()) throw UsageError(flag_of(key), "no such config key");
    if (!applied)
      throw UsageError(flag_of(key), "only the " + join(owners) + " suite has this key, and the selected suites are " +
                                         join(config.suites) + " (add it with --suite)");
  }
  validate_config(config);
}

Kind kind_of(const Axis& axis) {
  switch (axis.param) {
    case Param::impl:
    case Param::mode:
    case Param::decay: return Kind::name;
    case Param::option: return axis.kind;
    default: return Kind::integer;
  }
}

nlohmann::json axis_value_json(const Axis& axis, const std::string& text) {
  switch (kind_of(axis)) {
    case Kind::integer: return std::stol(text);
    case Kind::real: return std::stod(text);
    case Kind::boolean: return text == "true";
    case Kind::name: break;
  }
  return text;
}

std::vector<ConfigKey> config_keys() {
  std::vector<ConfigKey> keys;
  auto add = [&](const std::string& key, const std::string& help, bool is_list) {
    for (const ConfigKey& k : keys)
      if (k.key == key) return;
    keys.push_back({key, flag_of(key), help + (is_list ? ", comma list" : "")});
  };
  const auto& top = top_fields();
  add(top.front().key, top.front().help + " (" + join(known_suites()) + ")", true);
  for (const SuiteConfig& suite : Config().suite_configs)
    for (const Axis& axis : suite.op->axes) add(axis.key, axis.help, true);
  for (const Field& f : top)
    if (!f.help.empty()) add(f.key, f.help, f.is_list);
  return keys;
}

nlohmann::json to_json(const Config& c) {
  nlohmann::json out = {
      {"source", c.source},
      {"suites", c.suites},
      {"backend", c.run.backend},
      {"dtype", c.run.dtype},
      {"threads", c.run.threads},
      {"warmup", c.run.warmup},
      {"reps", c.run.reps},
      {"min_sample_ms", c.run.min_sample_ms},
      {"seed", c.run.seed},
      {"device", c.run.device},
      {"cold", c.run.cold},
      {"bwd_states", c.run.bwd_states},
  };
  // Only a run with plugins has the key, so that other runs' config blocks stay as they were.
  for (const PluginFile& p : c.plugins)
    out["plugins"].push_back({{"path", p.path}, {"name", p.name}, {"sha256", p.sha256}});
  for (const SuiteConfig& suite : c.suite_configs) {
    nlohmann::json keys = nlohmann::json::object();
    for (const Axis& axis : suite.op->axes) {
      const AxisValues& values = suite.values.at(axis.key);
      nlohmann::json list = nlohmann::json::array();
      for (long n : values.numbers) list.push_back(n);
      for (const std::string& text : values.names) list.push_back(axis_value_json(axis, text));
      keys[axis.key] = list;
    }
    out[suite.op->suite] = keys;
  }
  return out;
}

}  // namespace lattn

// Config validation: the YAML tree (src/config/config_text.cpp reads the text, checks JSON's syntax and
// what YAML allows but a config must not have) to fields, one key at a time, each checked as a
// value of its kind with file:line; and the command line's overrides through the same checks.
#include "src/config/config.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <cctype>
#include <limits>
#include <set>
#include <thread>

#include "src/config/config_text.hpp"
#include "src/config/config_values.hpp"
#include "core/error.hpp"
#include "src/config/ops.hpp"
#include "src/config/plan.hpp"

namespace lattn {

extern const char* const kEmbeddedDefaultConfig;  // generated from configs/default.yaml

namespace {

// Run settings beyond these are refused; each op's axes carry their own ranges (kernels/<op>/op.cpp).
constexpr long kMaxDevice = 1023;
constexpr long kMaxCheckHeads = 1L << 24;
constexpr long kMaxThreads = 4096, kMaxWarmup = 1000000, kMaxReps = 100000;
constexpr double kMaxNoisePct = 100, kMaxTimeoutS = 86400, kMaxSlowdownPct = 1000;

// Threads of a run: at most 4 per logical core (and kMaxThreads). More only slow a run down, and
// thousands of OpenMP threads sit in start-up for minutes or exhaust OpenBLAS's buffers.
int parse_threads(const Raw& raw) {
  const long value = parse_int(raw, 0, kMaxThreads);
  const long cores = long(std::max(1u, std::thread::hardware_concurrency()));
  const long most = std::min(kMaxThreads, 4 * cores);
  if (value > most)
    throw UsageError(raw.where, "expected at most " + std::to_string(most) + " threads (4 x the " + std::to_string(cores) +
                                    " logical cores here), got " + raw.text);
  return int(value);
}

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
    case Kind::text:
      values.names = parse_list<std::string>(raws, [&](const Raw& r) -> std::string {
        if (r.text.empty() || !axis.canonical) return r.text;
        try {
          return axis.canonical(r.text);
        } catch (const std::invalid_argument& e) {
          throw UsageError(r.where, e.what());
        }
      });
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
         c.run.backend = parse_choice(raws[0], known_backends(), "backend");
       },
       "cpu or cuda"},
      {"dtype", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.dtype = parse_choice(raws[0], known_dtypes(), "dtype"); },
       "float32 or bf16 (bf16 inputs, float32 accumulation; backends that lack it skip)"},
      {"threads", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.threads = parse_threads(raws[0]); },
       "CPU threads of the whole run (0: every core)"},
      {"warmup", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.warmup = int(parse_int(raws[0], 0, kMaxWarmup)); },
       "warm-up calls after the cold one"},
      {"reps", false, [](Config& c, const std::vector<Raw>& raws) { c.run.reps = int(parse_int(raws[0], 1, kMaxReps)); },
       "the most timed samples per case"},
      {"min_samples", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.min_samples = int(parse_int(raws[0], 1, kMaxReps)); },
       "the fewest timed samples per case before --max-noise may stop it (at most reps)"},
      {"max_noise", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.max_noise = parse_number_or_zero(raws[0], kMaxNoisePct); },
       "stop sampling a case once its median's noise (95% CI half-width) is at most this % (0: take reps samples)"},
      {"timeout", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.timeout = parse_number_or_zero(raws[0], kMaxTimeoutS); },
       "stop sampling a case after this many seconds of its own measuring (0: no limit)"},
      {"min_sample_ms", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.min_sample_ms = parse_positive_number(raws[0], 60000); },
       "a sample lasts at least this long (ms)"},
      {"interleave", false, [](Config& c, const std::vector<Raw>& raws) { c.run.interleave = parse_bool(raws[0]); },
       ""},  // set by the flags --interleave and --no-interleave (src/cli/cli.cpp), which take no value
      {"batch_memory", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.batch_memory = parse_positive_number(raws[0], 1); },
       "interleaved batches: the fraction of physical memory one batch's cases may hold together"},
      {"slowdown", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.slowdown = parse_number_or_zero(raws[0], kMaxSlowdownPct); },
       "testing aid for the regression gate: make every call this % slower by a spin (docs/harness.md)"},
      {"check_heads", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.check_heads = int(parse_int(raws[0], 0, kMaxCheckHeads)); },
       "check only the first N (sequence, head) pairs' outputs, against a reference made for them alone (0: all)"},
      {"seed", false, [](Config& c, const std::vector<Raw>& raws) { c.run.seed = parse_seed(raws[0]); },
       "seed of the inputs"},
      {"device", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.device = int(parse_int(raws[0], 0, kMaxDevice)); },
       "GPU index of the CUDA backend"},
      // The suite key `cache` took its place (core/op.hpp, cache_axis); a config that still says it is
      // told so rather than run warm.
      {"cold", false,
       [](Config&, const std::vector<Raw>& raws) -> void {
         throw UsageError(raws[0].where, "is now the suite key `cache: cold` (or `cache: warm`; docs/config.md)");
       },
       ""},
      {"bwd_states", false,
       [](Config& c, const std::vector<Raw>& raws) {
         c.run.bwd_states = parse_choice(raws[0], known_bwd_states(), "bwd_states");
       },
       "chunked fwd_bwd: kept (the forward keeps the chunk states) or recomputed"},
      {"plugins", true,
       [](Config& c, const std::vector<Raw>& raws) {
         // Relative to the config file, so that a config and its plugins move together (a
         // python:MODULE is found on Python's path instead).
         const std::filesystem::path base = std::filesystem::path(c.source).parent_path();
         c.plugins.clear();
         for (const std::string& path : parse_list<std::string>(raws, [](const Raw& r) {
                if (r.text.empty()) throw UsageError(r.where, "expected a plugin's path, got an empty string");
                return r.text;
              }))
           c.plugins.push_back({path.rfind("python:", 0) == 0 ? path : (base / path).lexically_normal().string(), "", ""});
       },
       ""},  // set by the flag --plugin (src/cli/cli.cpp), which may be given more than once
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
  std::map<std::string, int> seen;  // key -> its line: YAML and JSON both let a second one win silently
  for (const auto& entry : map) {
    const YAML::Node& key_node = entry.first;
    const std::string key = key_node.Scalar();
    if (const auto [first, fresh] = seen.emplace(key, key_node.Mark().line + 1); !fresh)
      throw UsageError(at(source, key_node), "the key '" + prefix + key + "' is given twice (first on line " +
                                                 std::to_string(first->second) + ")");
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

const std::vector<std::string>& known_backends() {
  static const std::vector<std::string> v = {"cpu", "cuda"};
  return v;
}

const std::vector<std::string>& known_dtypes() {
  static const std::vector<std::string> v = {"float32", "bf16"};
  return v;
}

Config parse_config(const std::string& text, const std::string& source) {
  const YAML::Node root = load_config_tree(text, source);
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

Config load_config_file(const std::string& path) { return parse_config(read_config_file(path), path); }

Config embedded_default_config() { return parse_config(kEmbeddedDefaultConfig, "<built-in default.yaml>"); }

namespace {

std::vector<Raw> override_raws(const Field& field, const std::string& flag_name, const std::string& text) {
  if (text.empty() || (!field.is_list && text.find(',') != std::string::npos))
    throw UsageError(flag_name, field.is_list ? "expected a value or a comma list, got '" + text + "'"
                                              : "expected a single value, got '" + text + "'");
  std::vector<Raw> raws;
  for (std::size_t start = 0;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw UsageError(flag_name, "an empty value in the comma list '" + text + "'");
    raws.push_back(Raw{item, flag_name, false});
    if (comma == std::string::npos) return raws;
    start = comma + 1;
  }
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
    std::vector<std::string> owners, accepting;
    std::vector<std::pair<std::string, std::string>> refusing;  // (suite, why)
    bool applied = false;
    for (const auto& suite : known_suites()) {
      const std::vector<Field> fields = suite_fields(suite);
      const Field* field = find_field(fields, key);
      if (!field) continue;
      owners.push_back(suite);
      if (std::find(config.suites.begin(), config.suites.end(), suite) == config.suites.end()) continue;
      try {
        field->set(config, override_raws(*field, flag_of(key), text));
        accepting.push_back(suite);
      } catch (const UsageError& e) {
        refusing.emplace_back(suite, e.what());
      }
      applied = true;
    }
    // A value one selected suite takes and another refuses (--decay scalar: the kernel suite has
    // it, the layer suite not): the error names the suite that refused it and the ones that take it.
    if (!refusing.empty()) {
      const auto& [suite, why] = refusing.front();
      const std::string prefix = flag_of(key) + ": ";
      const std::string reason = why.rfind(prefix, 0) == 0 ? why.substr(prefix.size()) : why;
      if (accepting.empty()) throw UsageError(flag_of(key), reason);  // no selected suite takes it
      throw UsageError(flag_of(key), "the " + suite + " suite: " + reason + "; the " + join(accepting) +
                                         " suite takes it: select it alone with --suite " + accepting.front());
    }
    if (owners.empty()) throw UsageError(flag_of(key), "no such config key");
    if (!applied)
      throw UsageError(flag_of(key), "only the " + join(owners) + " suite has this key, and the selected suites are " +
                                         join(config.suites) + " (add it with --suite)");
  }
  validate_config(config);
}

namespace {

// A default as --help shows it: a list as a comma list, like the flag takes it.
std::string shown(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{}", value.get<double>());  // 25, not 25.0
  if (!value.is_array()) return value.dump();
  std::vector<std::string> items;
  for (const auto& item : value) items.push_back(shown(item));
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// The key's defaults (the built-in Config's, which configs/default.yaml repeats): one value, or
// each suite's where the suites differ.
std::string default_of(const nlohmann::json& defaults, const std::string& key) {
  if (defaults.contains(key)) return shown(defaults[key]);
  std::vector<std::pair<std::string, std::string>> per_suite;
  for (const std::string& suite : known_suites())
    if (defaults.contains(suite) && defaults[suite].contains(key)) per_suite.emplace_back(suite, shown(defaults[suite][key]));
  if (per_suite.empty()) return "";
  bool same = true;
  for (const auto& [suite, value] : per_suite) same = same && value == per_suite.front().second;
  if (same) return per_suite.front().second;
  std::string out;
  for (const auto& [suite, value] : per_suite) out += (out.empty() ? "" : "; ") + suite + " " + value;
  return out;
}

}  // namespace

namespace {

// How --help names a value, and the names it accepts (for completion): the lists the parsers take.
using ValueKind = std::pair<std::string, std::vector<std::string>>;
ValueKind field_value(const std::string& key) {
  const std::map<std::string, ValueKind> kinds = {
      {"suites", {"NAME", known_suites()}}, {"backend", {"NAME", known_backends()}}, {"dtype", {"NAME", known_dtypes()}},
      {"bwd_states", {"NAME", known_bwd_states()}}, {"max_noise", {"PCT", {}}}, {"slowdown", {"PCT", {}}},
      {"timeout", {"SECONDS", {}}}, {"min_sample_ms", {"MS", {}}}};
  return kinds.count(key) ? kinds.at(key) : ValueKind{"INT", {}};  // threads, warmup, reps, min_samples, seed, device
}

ValueKind axis_value(const Op& op, const Axis& axis) {
  const Kind kind = kind_of(axis);
  if (kind == Kind::name) return {"NAME", axis_choices(op, axis)};
  if (kind == Kind::boolean) return {"BOOL", {"true", "false"}};
  if (kind == Kind::text) {  // the key's own name: a text's form is in its help line
    std::string name = axis.key;
    for (char& ch : name) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    return {name, {}};
  }
  return {kind == Kind::real ? "NUMBER" : "INT", {}};
}

}  // namespace

std::vector<ConfigKey> config_keys() {
  const nlohmann::json defaults = to_json(Config());
  std::vector<ConfigKey> keys;
  auto add = [&](const std::string& key, const std::string& help, bool is_list, const ValueKind& value_kind) {
    for (ConfigKey& k : keys)
      if (k.key == key) {  // a key of several suites (impl): the names any of them accepts
        for (const std::string& choice : value_kind.second)
          if (std::find(k.choices.begin(), k.choices.end(), choice) == k.choices.end()) k.choices.push_back(choice);
        return;
      }
    const std::string value = default_of(defaults, key);
    keys.push_back({key, flag_of(key), help + (is_list ? ", comma list" : "") + (value.empty() ? "" : " [default: " + value + "]"),
                    value_kind.first + (is_list ? ",..." : ""), value_kind.second});
  };
  const auto& top = top_fields();
  add(top.front().key, top.front().help + " (" + join(known_suites()) + ")", true, field_value(top.front().key));
  for (const SuiteConfig& suite : Config().suite_configs)
    for (const Axis& axis : suite.op->axes) add(axis.key, axis.help, true, axis_value(*suite.op, axis));
  for (const Field& f : top)
    if (!f.help.empty()) add(f.key, f.help, f.is_list, field_value(f.key));
  return keys;
}

}  // namespace lattn

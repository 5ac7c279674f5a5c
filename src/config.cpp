// Config loading and validation. YAML and JSON share one path: a JSON file is first checked by a
// strict JSON parser (so JSON syntax errors read as JSON errors), then read through yaml-cpp, of
// whose YAML 1.2 JSON is a subset, so that both formats reach the same validator with line numbers.
#include "config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "error.hpp"

namespace lattn {

extern const char* const kEmbeddedDefaultConfig;  // generated from configs/default.yaml

namespace {

// Sizes beyond these are refused at validation, before anything is allocated.
constexpr long kMaxBatch = 4096, kMaxHeads = 4096, kMaxSeq = 1L << 24, kMaxDim = 1024, kMaxChunk = 8192;
constexpr long kMaxDevice = 1023;
// The layer's model width heads * head_dim: a weight is width^2 floats (256 MiB at the limit).
constexpr long kMaxModelDim = 8192;
constexpr long kMaxThreads = 4096, kMaxWarmup = 1000000, kMaxReps = 100000;
// One tensor of a case may not exceed this many elements (8 GiB of float32).
constexpr std::size_t kMaxTensorElems = std::size_t(1) << 31;
// A plan is held in memory whole; sweeps beyond this belong in several runs or shards.
constexpr long kMaxPlanCases = 100000;

struct Raw {
  std::string text;
  std::string where;
  bool quoted = false;  // a quoted YAML/JSON string: never a number
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

long parse_int(const Raw& raw, long lo, long hi) {
  long value = 0;
  const char* first = raw.text.data();
  const char* last = first + raw.text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (raw.quoted || raw.text.empty() || ec != std::errc() || ptr != last)
    throw UsageError(raw.where, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                    ", got " + (raw.quoted ? "the string " : "") + "'" + raw.text + "'");
  if (value < lo || value > hi)
    throw UsageError(raw.where, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                    ", got " + raw.text);
  return value;
}

double parse_positive_number(const Raw& raw, double hi) {
  double value = 0;
  std::istringstream in(raw.text);
  in >> value;
  if (raw.quoted || raw.text.empty() || in.fail() || !in.eof())
    throw UsageError(raw.where, "expected a number, got '" + raw.text + "'");
  if (!(value > 0 && value <= hi))
    throw UsageError(raw.where, "expected a number in (0, " + std::to_string(long(hi)) + "], got " + raw.text);
  return value;
}

std::uint64_t parse_seed(const Raw& raw) {
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(raw.text.data(), raw.text.data() + raw.text.size(), value);
  if (raw.quoted || raw.text.empty() || ec != std::errc() || ptr != raw.text.data() + raw.text.size())
    throw UsageError(raw.where, "expected a non-negative integer seed, got '" + raw.text + "'");
  return value;
}

bool parse_bool(const Raw& raw) {
  if (!raw.quoted && (raw.text == "true" || raw.text == "yes" || raw.text == "on" || raw.text == "1")) return true;
  if (!raw.quoted && (raw.text == "false" || raw.text == "no" || raw.text == "off" || raw.text == "0")) return false;
  throw UsageError(raw.where, "expected true or false, got '" + raw.text + "'");
}

const std::string& parse_choice(const Raw& raw, const std::vector<std::string>& choices, const char* what) {
  auto it = std::find(choices.begin(), choices.end(), raw.text);
  if (it == choices.end())
    throw UsageError(raw.where, std::string("unknown ") + what + " '" + raw.text + "' (expected one of: " +
                                    join(choices) + ")");
  return *it;
}

template <class T, class Parse>
std::vector<T> parse_list(const std::vector<Raw>& raws, Parse parse) {
  std::vector<T> out;
  std::set<std::string> seen;
  for (const auto& raw : raws) {
    if (!seen.insert(raw.text).second) throw UsageError(raw.where, "duplicate value '" + raw.text + "'");
    out.push_back(parse(raw));
  }
  return out;
}

Impl impl_from(const std::string& s) { return s == "scan" ? Impl::scan : Impl::chunked; }
Mode mode_from(const std::string& s) { return s == "fwd" ? Mode::fwd : Mode::fwd_bwd; }
Decay decay_from(const std::string& s) { return s == "none" ? Decay::none : Decay::retnet; }

struct Field {
  std::string key;
  bool is_list;
  std::function<void(Config&, const std::vector<Raw>&)> set;
};

template <class Suite>
auto int_list(long lo, long hi, Suite Config::*suite, std::vector<int> Suite::*member) {
  return [=](Config& c, const std::vector<Raw>& raws) {
    c.*suite.*member = parse_list<int>(raws, [&](const Raw& r) { return int(parse_int(r, lo, hi)); });
  };
}

template <class E, class Suite>
auto enum_list(const std::vector<std::string>& choices, const char* what, E (*convert)(const std::string&),
               Suite Config::*suite, std::vector<E> Suite::*member) {
  return [=, &choices](Config& c, const std::vector<Raw>& raws) {
    c.*suite.*member = parse_list<E>(raws, [&](const Raw& r) { return convert(parse_choice(r, choices, what)); });
  };
}

const std::vector<Field>& kernel_fields() {
  using S = KernelSuite;
  constexpr auto k = &Config::kernel;
  static const std::vector<Field> fields = {
      {"batch", true, int_list(1, kMaxBatch, k, &S::batch)},
      {"heads", true, int_list(1, kMaxHeads, k, &S::heads)},
      {"seq", true, int_list(1, kMaxSeq, k, &S::seq)},
      {"dim", true, int_list(1, kMaxDim, k, &S::dim)},
      {"chunk", true, int_list(1, kMaxChunk, k, &S::chunk)},
      {"impl", true, enum_list<Impl>(known_impls(), "impl", impl_from, k, &S::impl)},
      {"mode", true, enum_list<Mode>(known_modes(), "mode", mode_from, k, &S::mode)},
      {"decay", true, enum_list<Decay>(known_decays(), "decay", decay_from, k, &S::decay)},
  };
  return fields;
}

const std::vector<Field>& layer_fields() {
  using S = LayerSuite;
  constexpr auto l = &Config::layer;
  static const std::vector<Field> fields = {
      {"batch", true, int_list(1, kMaxBatch, l, &S::batch)},
      {"heads", true, int_list(1, kMaxHeads, l, &S::heads)},
      {"head_dim", true, int_list(1, kMaxDim, l, &S::head_dim)},
      {"window", true, int_list(1, kMaxSeq, l, &S::window)},
      {"seq", true, int_list(1, kMaxSeq, l, &S::seq)},
      {"chunk", true, int_list(1, kMaxChunk, l, &S::chunk)},
      {"impl", true, enum_list<Impl>(known_impls(), "impl", impl_from, l, &S::impl)},
      {"mode", true, enum_list<Mode>(known_modes(), "mode", mode_from, l, &S::mode)},
      {"decay", true, enum_list<Decay>(known_decays(), "decay", decay_from, l, &S::decay)},
  };
  return fields;
}

// The suites' own key sets, by suite name (the order of known_suites()).
const std::vector<Field>& suite_fields(const std::string& suite) {
  return suite == "layer" ? layer_fields() : kernel_fields();
}

const std::vector<Field>& top_fields() {
  static const std::vector<Field> fields = {
      {"suites", true,
       [](Config& c, const std::vector<Raw>& raws) {
         c.suites = parse_list<std::string>(raws, [](const Raw& r) { return parse_choice(r, known_suites(), "suite"); });
       }},
      {"backend", false,
       [](Config& c, const std::vector<Raw>& raws) {
         static const std::vector<std::string> backends = {"cpu", "cuda"};
         c.run.backend = parse_choice(raws[0], backends, "backend");
       }},
      {"dtype", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.dtype = parse_choice(raws[0], known_dtypes(), "dtype"); }},
      {"threads", false, [](Config& c, const std::vector<Raw>& raws) { c.run.threads = int(parse_int(raws[0], 0, kMaxThreads)); }},
      {"warmup", false, [](Config& c, const std::vector<Raw>& raws) { c.run.warmup = int(parse_int(raws[0], 0, kMaxWarmup)); }},
      {"reps", false, [](Config& c, const std::vector<Raw>& raws) { c.run.reps = int(parse_int(raws[0], 1, kMaxReps)); }},
      {"min_sample_ms", false,
       [](Config& c, const std::vector<Raw>& raws) { c.run.min_sample_ms = parse_positive_number(raws[0], 60000); }},
      {"seed", false, [](Config& c, const std::vector<Raw>& raws) { c.run.seed = parse_seed(raws[0]); }},
      {"device", false, [](Config& c, const std::vector<Raw>& raws) { c.run.device = int(parse_int(raws[0], 0, kMaxDevice)); }},
      {"cold", false, [](Config& c, const std::vector<Raw>& raws) { c.run.cold = parse_bool(raws[0]); }},
      {"bwd_states", false,
       [](Config& c, const std::vector<Raw>& raws) {
         c.run.bwd_states = parse_choice(raws[0], known_bwd_states(), "bwd_states");
       }},
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
      if (section) keys.insert(keys.end(), known_suites().begin(), known_suites().end());
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

std::string to_string(Impl impl) { return impl == Impl::scan ? "scan" : "chunked"; }
std::string to_string(Mode mode) { return mode == Mode::fwd ? "fwd" : "fwd_bwd"; }
std::string to_string(Decay decay) { return decay == Decay::none ? "none" : "retnet"; }

const std::vector<std::string>& known_suites() {
  static const std::vector<std::string> v = {"kernel", "layer"};
  return v;
}
const std::vector<std::string>& known_impls() {
  static const std::vector<std::string> v = {"scan", "chunked"};
  return v;
}
const std::vector<std::string>& known_modes() {
  static const std::vector<std::string> v = {"fwd", "fwd_bwd"};
  return v;
}
const std::vector<std::string>& known_decays() {
  static const std::vector<std::string> v = {"none", "retnet"};
  return v;
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
                  const auto& suites = known_suites();
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
      const Field* field = find_field(suite_fields(suite), key);
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

void validate_config(const Config& c) {
  const auto& k = c.kernel;
  const double cases = double(k.batch.size()) * double(k.heads.size()) * double(k.seq.size()) * double(k.dim.size()) *
                       double(k.chunk.size()) * double(k.impl.size()) * double(k.mode.size()) * double(k.decay.size());
  const auto& l = c.layer;
  const double layer_cases = double(l.batch.size()) * double(l.heads.size()) * double(l.head_dim.size()) *
                             double(l.window.size()) * double(l.seq.size()) * double(l.chunk.size()) *
                             double(l.impl.size()) * double(l.mode.size()) * double(l.decay.size());
  // Checked before the size loops below, which walk these products.
  if (cases + layer_cases > double(kMaxPlanCases))
    throw UsageError(c.source, "the suites expand to " + std::to_string(long(cases + layer_cases)) + " cases; at most " +
                                   std::to_string(kMaxPlanCases) + " fit in one run (use --shard or fewer values)");
  for (int batch : k.batch)
    for (int heads : k.heads)
      for (int seq : k.seq)
        for (int dim : k.dim) {
          const std::size_t tokens = std::size_t(batch) * heads * seq * dim;
          const std::size_t state = std::size_t(batch) * heads * dim * dim;
          if (tokens > kMaxTensorElems || state > kMaxTensorElems)
            throw UsageError(c.source, "kernel case batch " + std::to_string(batch) + " heads " + std::to_string(heads) +
                                           " seq " + std::to_string(seq) + " dim " + std::to_string(dim) +
                                           " needs tensors of over 2^31 elements (8 GiB each); no machine here holds that");
        }
  for (int heads : l.heads)
    for (int head_dim : l.head_dim) {
      const long width = long(heads) * head_dim;
      if (width > kMaxModelDim)
        throw UsageError(c.source, "layer heads " + std::to_string(heads) + " x head_dim " + std::to_string(head_dim) +
                                       " is a model width of " + std::to_string(width) + ", over the limit " +
                                       std::to_string(kMaxModelDim) + " (each weight is width^2 floats)");
      for (int batch : l.batch)
        for (int seq : l.seq)
          if (std::size_t(batch) * seq * std::size_t(width) > kMaxTensorElems)
            throw UsageError(c.source, "layer case batch " + std::to_string(batch) + " seq " + std::to_string(seq) +
                                           " model width " + std::to_string(width) +
                                           " needs tensors of over 2^31 elements (8 GiB each); no machine here holds that");
    }
}

namespace {

void expand_kernel(const Config& c, std::vector<Case>& plan) {
  const auto& k = c.kernel;
  // dim outside seq, mode outside impl: the order of the reference results file, which also keeps
  // the cases that share inputs and a reference next to each other.
  for (int batch : k.batch)
    for (int heads : k.heads)
      for (int chunk : k.chunk)
        for (Decay decay : k.decay)
          for (int dim : k.dim)
            for (int seq : k.seq)
              for (Mode mode : k.mode)
                for (Impl impl : k.impl) {
                  Case kase;
                  kase.suite = "kernel";
                  kase.impl = impl;
                  kase.mode = mode;
                  kase.problem = Problem{batch, heads, seq, dim, chunk, decay};
                  kase.backend = c.run.backend;
                  kase.dtype = c.run.dtype;
                  kase.plan_index = plan.size();
                  plan.push_back(kase);
                }
}

void expand_layer(const Config& c, std::vector<Case>& plan) {
  const auto& l = c.layer;
  // seq outside impl outside mode, as the reference results file orders its layer records.
  for (int batch : l.batch)
    for (int heads : l.heads)
      for (int head_dim : l.head_dim)
        for (int window : l.window)
          for (int chunk : l.chunk)
            for (Decay decay : l.decay)
              for (int seq : l.seq)
                for (Impl impl : l.impl)
                  for (Mode mode : l.mode) {
                    Case kase;
                    kase.suite = "layer";
                    kase.impl = impl;
                    kase.mode = mode;
                    kase.problem = Problem{batch, heads, seq, head_dim, chunk, decay};
                    kase.window = window;
                    kase.backend = c.run.backend;
                    kase.dtype = c.run.dtype;
                    kase.plan_index = plan.size();
                    plan.push_back(kase);
                  }
}

}  // namespace

std::vector<Case> expand_plan(const Config& c) {
  std::vector<Case> plan;
  for (const auto& suite : c.suites) {
    if (suite == "kernel") expand_kernel(c, plan);
    if (suite == "layer") expand_layer(c, plan);
  }
  return plan;
}

nlohmann::json to_json(const Config& c) {
  auto names = [](const auto& values) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : values) out.push_back(to_string(v));
    return out;
  };
  nlohmann::json kernel = {
      {"batch", c.kernel.batch}, {"heads", c.kernel.heads}, {"seq", c.kernel.seq}, {"dim", c.kernel.dim},
      {"chunk", c.kernel.chunk}, {"impl", names(c.kernel.impl)}, {"mode", names(c.kernel.mode)},
      {"decay", names(c.kernel.decay)},
  };
  nlohmann::json layer = {
      {"batch", c.layer.batch}, {"heads", c.layer.heads}, {"head_dim", c.layer.head_dim},
      {"window", c.layer.window}, {"seq", c.layer.seq}, {"chunk", c.layer.chunk},
      {"impl", names(c.layer.impl)}, {"mode", names(c.layer.mode)}, {"decay", names(c.layer.decay)},
  };
  return {
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
      {"kernel", kernel},
      {"layer", layer},
  };
}

}  // namespace lattn

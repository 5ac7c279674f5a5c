// A config as JSON, the form result files and journals keep it in (`config`), and an axis value
// written as its kind (an integer, a number, a boolean or a name).
#include <nlohmann/json.hpp>

#include "src/config/config.hpp"

namespace lattn {

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
    case Kind::name:
    case Kind::text: break;
  }
  return text;
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
      {"min_samples", c.run.min_samples},
      {"max_noise", c.run.max_noise},
      {"timeout", c.run.timeout},
      {"interleave", c.run.interleave},
      {"batch_memory", c.run.batch_memory},
      {"slowdown", c.run.slowdown},
      {"seed", c.run.seed},
      {"device", c.run.device},
      {"bwd_states", c.run.bwd_states},
  };
  // Only a run that checks a part has the key, so that other runs' config blocks stay as they were.
  if (c.run.check_heads > 0) out["check_heads"] = c.run.check_heads;
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

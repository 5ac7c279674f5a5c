// --list: every plannable op's suites, forms and decays, and each backend with whether it is
// available here. Apart from the command line's parsing (src/cli/cli.cpp), which it does not need, so
// that the parser can be fuzzed without the backends.
#include "src/run/capabilities.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <memory>
#include <map>

#include "src/run/backend.hpp"
#include "src/config/config.hpp"
#include "src/config/config_values.hpp"
#include "src/config/install_paths.hpp"
#include "src/config/ops.hpp"
#include "src/results/summary.hpp"
#include "src/config/plan.hpp"
#include "core/error.hpp"

namespace lattn {
namespace {

// Each plugin (name, path, digest) and its impls with their devices, and for each impl the planned
// cases of `config` it declines on the config's backend, counted by reason. docs/spec.md section 5's
// version 1 has one op, linear attention.
std::string describe_plugins(const Plugins& plugins, const Config& config) {
  std::string out;
  if (plugins.empty()) return out;
  // The backend the config runs on, with the plugins' rows; none when it is not built here.
  std::unique_ptr<Backend> backend;
  try {
    BackendOptions options;
    options.threads = config.run.threads;
    options.plugins = plugins;
    backend = make_backend(config.run.backend, options);
  } catch (const UsageError&) {
  }
  // Each planned kernel shape once, whatever impl the config names for it.
  std::vector<Case> shapes;
  std::set<std::string> seen;
  for (const Case& c : expand_plan(config))
    if (c.op->name == "linear_attention" && seen.insert(shape_key(c, true)).second) shapes.push_back(c);

  out += "plugins:\n";
  for (const auto& p : plugins) {
    out += fmt::format("  {} {} (sha256 {}, interface version {})\n", p->name, p->path, p->sha256, p->version);
    for (const auto& impl : p->impls) {
      out += fmt::format("    {:<24} {}", impl.name, impl.device);
      if (!backend || shapes.empty()) {
        out += "\n";
        continue;
      }
      std::map<std::string, int> declined;
      for (Case c : shapes) {
        c.impl = impl.name;
        if (auto why = backend->unsupported(c)) ++declined[*why];
      }
      int count = 0;
      for (const auto& [why, n] : declined) count += n;
      out += fmt::format(": runs {} of the {} planned kernel cases on {}\n", shapes.size() - count, shapes.size(),
                         config.run.backend);
      for (const auto& [why, n] : declined) out += fmt::format("      declines {}: {}\n", n, why);
    }
  }
  return out;
}

}  // namespace

std::string list_capabilities(const Plugins& plugins, const Config* config) {
  // Every plannable op's forms and decay kinds, each once.
  std::vector<std::string> impls, decays;
  std::vector<std::pair<std::string, std::vector<std::string>>> named_options;  // rule: additive, delta
  auto add = [](std::vector<std::string>& names, const std::string& name) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const Op* op : all_ops()) {
    if (op->suite.empty()) continue;
    for (const Form& f : op->forms) add(impls, f.name);
    for (const Axis& a : op->axes)
      if (a.param == Param::decay) {
        for (const std::string& d : a.choices) add(decays, d);
      } else if (a.param == Param::option && a.kind == Kind::name) {
        auto it = std::find_if(named_options.begin(), named_options.end(), [&](const auto& o) { return o.first == a.key; });
        if (it == named_options.end()) it = named_options.insert(named_options.end(), {a.key, {}});
        for (const std::string& choice : a.choices) add(it->second, choice);
      }
  }
  // One heading per line, the plural of the option's key ("rules:", "gates:"), the values in one
  // column after the headings that fit it.
  std::vector<std::pair<std::string, std::string>> lines = {{"suites", join(known_suites())},
                                                            {"impls", join(impls)},
                                                            {"modes", join(mode_names())},
                                                            {"decays", join(decays)}};
  for (const auto& [key, choices] : named_options)
    lines.emplace_back(key.back() == 's' ? key : key + "s", join(choices));
  lines.emplace_back("dtypes", join(known_dtypes()));
  if (const std::vector<std::string> configs = installed_config_names(); !configs.empty())
    lines.emplace_back("configs", join(configs) + " (--config NAME)");
  std::string out;
  for (const auto& [heading, text] : lines) out += fmt::format("{:<9} {}\n", heading + ":", text);
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

}  // namespace lattn

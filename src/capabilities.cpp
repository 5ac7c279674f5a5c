// --list: every plannable op's suites, forms and decays, and each backend with whether it is
// available here. Apart from the command line's parsing (src/cli.cpp), which it does not need, so
// that the parser can be fuzzed without the backends.
#include "capabilities.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "backend.hpp"
#include "config.hpp"
#include "config_values.hpp"
#include "ops.hpp"
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

}  // namespace lattn

#include "src/plugins/plugins.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "src/config/config_values.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "src/config/plan.hpp"
#include "src/plugins/python_plugin.hpp"
#include "src/results/sha256.hpp"
#include "src/results/summary.hpp"

namespace lattn {
namespace {

std::string text_or(const char* text, const char* absent) { return text ? text : absent; }

// Checks a plugin's name and impl table (version 1's lattn_impl or version 2's lattn_impl2, which
// share their first fields) and adds its impls to `loaded`.
template <typename ImplT>
void add_impls(LoadedPlugin& loaded, const std::string& where, const char* plugin_name, int impl_count,
               const ImplT* impls) {
  const std::string name = text_or(plugin_name, "");
  if (!is_plugin_name(name)) throw UsageError(where, "plugin name '" + name + "' is not [a-z0-9_]+");
  if (impl_count < 0 || (impl_count > 0 && !impls))
    throw UsageError(where, fmt::format("impl_count {} with impls {}", impl_count, impls ? "set" : "NULL"));
  loaded.name = name;
  std::set<std::string> seen;
  for (int i = 0; i < impl_count; ++i) {
    const ImplT& impl = impls[i];
    const std::string impl_name = text_or(impl.name, "");
    if (!is_plugin_name(impl_name)) throw UsageError(where, "impl name '" + impl_name + "' is not [a-z0-9_]+");
    if (!seen.insert(impl_name).second) throw UsageError(where, "two impls are named '" + impl_name + "'");
    const std::string device = text_or(impl.device, "");
    if (device != "cpu" && device != "cuda")
      throw UsageError(where, "impl '" + impl_name + "' has device '" + device + "' (expected cpu or cuda)");
    if (!impl.forward) throw UsageError(where, "impl '" + impl_name + "' has no forward");
    loaded.impls.push_back({name + ":" + impl_name, device, c_impl_functions(&impl)});
  }
}

// Loads and checks one file; `where` is "plugin PATH" for the error lines.
std::shared_ptr<LoadedPlugin> load_one(const std::string& path) {
  const std::string where = "plugin " + path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UsageError(where, "no such file");
  if (!std::filesystem::is_regular_file(path, ec)) throw UsageError(where, "not a file");
  auto loaded = std::make_shared<LoadedPlugin>();
  loaded->path = path;
  try {
    loaded->sha256 = sha256_file_hex(path);
  } catch (const RuntimeFailure&) {
    throw UsageError(where, "cannot read the file");
  }
  // RTLD_NOW: a symbol the library lacks is an error here, not a crash in the middle of a run.
  // RTLD_LOCAL: two plugins' own symbols never resolve to each other.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw UsageError(where, "not a shared library lattnbench can load (" + text_or(dlerror(), "dlopen failed") + ")");
  dlerror();
  // Version 2 first: a library that exports both symbols is a version 2 plugin that also serves
  // lattnbench builds that know only version 1.
  if (void* symbol = dlsym(handle, "lattn_plugin_v2")) {
    const auto entry = reinterpret_cast<const lattn_plugin2* (*)()>(symbol);
    const lattn_plugin2* plugin = entry();
    if (!plugin) throw UsageError(where, "lattn_plugin_v2() returned NULL");
    if (plugin->abi != LATTN_PLUGIN_ABI_V2)
      throw UsageError(where, fmt::format("built for plugin ABI {}, lattn_plugin_v2 is ABI {}", plugin->abi,
                                          LATTN_PLUGIN_ABI_V2));
    loaded->version = 2;
    add_impls(*loaded, where, plugin->name, plugin->impl_count, plugin->impls);
    return loaded;
  }
  void* symbol = dlsym(handle, "lattn_plugin_v1");
  if (!symbol)
    throw UsageError(where, "exports no lattn_plugin_v1 or lattn_plugin_v2 (not a lattnbench plugin, or a C++ one "
                            "without extern \"C\")");
  const auto entry = reinterpret_cast<const lattn_plugin* (*)()>(symbol);
  const lattn_plugin* plugin = entry();
  if (!plugin) throw UsageError(where, "lattn_plugin_v1() returned NULL");
  if (plugin->abi != LATTN_PLUGIN_ABI)
    throw UsageError(where, fmt::format("built for plugin ABI {}, this lattnbench loads ABI {} through lattn_plugin_v1 "
                                        "(and ABI {} through lattn_plugin_v2)",
                                        plugin->abi, LATTN_PLUGIN_ABI, LATTN_PLUGIN_ABI_V2));
  loaded->version = 1;
  add_impls(*loaded, where, plugin->name, plugin->impl_count, plugin->impls);
  return loaded;
}

// A Python plugin's names and devices, held to the rules a C plugin's are.
void check_python_plugin(const LoadedPlugin& loaded) {
  const std::string where = "plugin " + loaded.path;
  if (!is_plugin_name(loaded.name)) throw UsageError(where, "plugin name '" + loaded.name + "' is not [a-z0-9_]+");
  if (loaded.impls.empty()) throw UsageError(where, "declares no impl (lattn.Plugin(NAME).impl(...) decorates a forward)");
  std::set<std::string> seen;
  for (const LoadedPlugin::Impl& impl : loaded.impls) {
    const std::string impl_name = impl.name.substr(loaded.name.size() + 1);
    if (!is_plugin_name(impl_name)) throw UsageError(where, "impl name '" + impl_name + "' is not [a-z0-9_]+");
    if (!seen.insert(impl_name).second) throw UsageError(where, "two impls are named '" + impl_name + "'");
    if (impl.device != "cpu" && impl.device != "cuda")
      throw UsageError(where, "impl '" + impl_name + "' has device '" + impl.device + "' (expected cpu or cuda)");
  }
}

}  // namespace

bool is_python_plugin(const std::string& path) {
  return path.rfind("python:", 0) == 0 || (path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0);
}

Plugins load_plugins(Config& config) {
  Plugins plugins;
  std::vector<PluginFile> files;
  std::set<std::string> paths;
  for (PluginFile file : config.plugins) {
    const bool python = is_python_plugin(file.path);
    if (!python || file.path.rfind("python:", 0) != 0)
      file.path = std::filesystem::absolute(file.path).lexically_normal().string();
    if (!paths.insert(file.path).second) continue;  // the same file from the config and a flag
    std::shared_ptr<LoadedPlugin> loaded;
    if (python) {
      loaded = load_python_plugin(file.path, config.run.threads);
      check_python_plugin(*loaded);
    } else {
      loaded = load_one(file.path);
    }
    for (const auto& other : plugins)
      if (other->name == loaded->name)
        throw UsageError("plugin " + file.path, "plugin name '" + loaded->name + "' is taken by " + other->path);
    file.name = loaded->name;
    file.sha256 = loaded->sha256;
    files.push_back(file);
    plugins.push_back(std::move(loaded));
  }
  config.plugins = files;
  return plugins;
}

void check_plugin_impls(const Config& config, const Plugins& plugins) {
  std::vector<std::string> provided;
  for (const auto& p : plugins)
    for (const auto& impl : p->impls) provided.push_back(impl.name);
  for (const SuiteConfig& suite : config.suite_configs)
    for (const Axis& axis : suite.op->axes) {
      if (axis.param != Param::impl) continue;
      for (const std::string& impl : suite.names(axis.key)) {
        if (!is_plugin_impl_name(impl)) continue;
        const std::string where = config.source + ": " + suite.op->suite + "." + axis.key;
        if (std::find(provided.begin(), provided.end(), impl) == provided.end())
          throw UsageError(where, "no loaded plugin provides '" + impl + "' (" +
                                      (provided.empty() ? std::string("no plugin is loaded: --plugin PATH or plugins:")
                                                        : "loaded: " + join(provided)) + ")");
      }
    }
}


}  // namespace lattn

// Kernel plugins (docs/plugins.md; the C interface is include/lattn/plugin.h, docs/spec.md section 5):
// shared libraries that export lattn_plugin_v1, loaded before any case runs, whose impls the
// backends' tables then carry as NAME:IMPL rows (backends/<name>/plugin_rows.cpp) beside their
// own. This file loads and checks them; src/plugin_call.hpp is how a row calls one.
#pragma once

#include <lattn/plugin.h>

#include <memory>
#include <string>
#include <vector>

#include "config.hpp"

namespace lattn {

struct LoadedPlugin {
  std::string path;    // absolute
  std::string name;    // the plugin's, [a-z0-9_]+
  std::string sha256;  // of the file, hex
  const lattn_plugin* plugin = nullptr;
  struct Impl {
    std::string name;  // NAME:IMPL
    const lattn_impl* impl = nullptr;
  };
  std::vector<Impl> impls;
};

// Kept for the whole process: a plugin's library is never closed (its code may have registered
// exit handlers or CUDA modules that must outlive every case).
using Plugins = std::vector<std::shared_ptr<const LoadedPlugin>>;

// Loads the config's plugins (Config::plugins, whose name and sha256 it fills in), each file once.
// Throws UsageError, one line naming the file, for a missing file, one that is not a shared
// library, one without lattn_plugin_v1, another ABI number, a malformed or duplicate plugin or impl
// name, an impl with an unknown device or no forward.
Plugins load_plugins(Config& config);

// Throws UsageError for an impl named NAME:IMPL in any suite that no loaded plugin provides. (A
// suite of another op than linear attention's may name one, as --impl names it for every suite:
// its cases are skipped, no backend having a row for them.)
void check_plugin_impls(const Config& config, const Plugins& plugins);


}  // namespace lattn

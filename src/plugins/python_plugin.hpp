// Python kernels as plugins (docs/plugins.md, "Python kernels"): lattnbench embeds CPython and
// loads a .py file, or a module (python:NAME) from the interpreter's path, whose impls are declared
// with the embedded `lattn` module (src/plugins/python_module.cpp). Each impl becomes a LoadedPlugin::Impl
// whose functions cross into Python: the case's buffers reach the impl without copies, as NumPy
// arrays (buffer protocol) or DLPack views, and an exception fails the call with its last line.
// Built without Python (-DLATTN_EMBED_PYTHON=OFF), loading one is a usage error saying so.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "src/results/device_info.hpp"
#include "src/plugins/plugins.hpp"

namespace lattn {

// Loads a Python plugin: `path` is an absolute .py path or python:MODULE. `threads` is the run's
// --threads (0: every core), which the file reads as lattn.threads while it loads. Throws
// UsageError naming the file for a file that does not import (the exception's last line), that
// declares no plugin or several, or declares an impl the decorator refuses.
std::shared_ptr<LoadedPlugin> load_python_plugin(const std::string& path, int threads);

// The interpreter and the bridge's cost per call, measured with an empty impl when the first
// Python plugin loaded; nothing when none was loaded.
std::optional<PythonInfo> python_bridge_info();

}  // namespace lattn

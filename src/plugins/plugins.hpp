// Kernel plugins (docs/plugins.md; the C interface is include/lattn/plugin_v2.h and, for version 1,
// include/lattn/plugin.h, docs/spec.md section 5): shared libraries that export lattn_plugin_v2 or
// lattn_plugin_v1, or Python files that declare impls with the
// embedded `lattn` module (src/plugins/python_plugin.hpp), loaded before any case runs, whose impls the
// backends' tables then carry as NAME:IMPL rows (backends/<name>/plugin_rows.cpp) beside their
// own. This file loads and checks them; src/plugins/plugin_call.hpp is how a row calls one.
#pragma once

#include <lattn/plugin_v2.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/config/config.hpp"

namespace lattn {

// What an impl's own allocator says of one call's scratch (a Python impl's: its library's statistics).
struct ScratchSeen {
  std::optional<std::size_t> bytes;  // the call's peak beyond what was live before it; nothing when unknown
  std::string source;                // what counted it (the record's temp_mb_source) or, without bytes, why not
};

// The order in which an impl takes the per-token tensors (q k v o dO dq dk dv, g, beta, dg, dbeta):
// lattnbench's [B, H, T, ...] (docs/spec.md section 1c), or [B, T, H, ...], the layout
// flash-linear-attention's kernels take. States and gamma keep theirs. A row hands an impl that
// takes bthd its tensors permuted before the first call and permutes its outputs back after the
// last, outside the timed calls (src/run/plugin_layout.hpp).
enum class PluginLayout { bhtd, bthd };

// One impl's functions as a row calls them: a C plugin's lattn_impl2 (or version 1's lattn_impl,
// whose case and tensors are the first fields of version 2's), or a Python impl's bridge. The
// arguments are the C interface's, version 2 (include/lattn/plugin_v2.h).
class ImplFunctions {
 public:
  virtual ~ImplFunctions() = default;
  // The interface version the impl was written against: a version 1 impl is never handed a case
  // that only version 2 describes (plugin_unsupported declines it).
  virtual int version() const { return 2; }
  virtual bool has_backward() const = 0;
  // Why the impl does not run the case, or nothing.
  virtual std::optional<std::string> unsupported(const lattn_case2& c) const = 0;
  virtual int forward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream,
                      void** saved, char* err, size_t errlen) const = 0;
  virtual int backward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream,
                       void* saved, char* err, size_t errlen) const = 0;
  // Why the impl's scratch is not what it takes from `alloc` (its record's temp_mb is then null
  // with this reason), or nothing.
  virtual std::optional<std::string> uncounted_scratch() const { return std::nullopt; }
  // Runs `call`, one call of the case, with the impl's own allocator watched where its library
  // keeps figures; nothing for an impl whose scratch comes from `alloc` (a C plugin's).
  virtual std::optional<ScratchSeen> watch_scratch(const lattn_case2&, const std::function<void()>& call) const {
    call();
    return std::nullopt;
  }
  // The layout the impl takes its tensors in: a C plugin's is the interface's, [B, H, T, D].
  virtual PluginLayout layout() const { return PluginLayout::bhtd; }
};

struct LoadedPlugin {
  std::string path;    // absolute; python:MODULE for a module found on Python's path
  std::string name;    // the plugin's, [a-z0-9_]+
  std::string sha256;  // of the file, hex
  int version = 2;     // the interface version: 1 or 2 for a C plugin (its symbol), 2 for Python
  struct Impl {
    std::string name;    // NAME:IMPL
    std::string device;  // "cpu" | "cuda"
    std::shared_ptr<const ImplFunctions> functions;
  };
  std::vector<Impl> impls;
};

// Kept for the whole process: a plugin's library is never closed (its code may have registered
// exit handlers or CUDA modules that must outlive every case).
using Plugins = std::vector<std::shared_ptr<const LoadedPlugin>>;

// A C plugin's impl as a row calls it (its lattn_impl or lattn_impl2 outlives the result).
std::shared_ptr<const ImplFunctions> c_impl_functions(const lattn_impl* impl);
std::shared_ptr<const ImplFunctions> c_impl_functions(const lattn_impl2* impl);

// Whether a --plugin argument names Python (a .py file, or python:MODULE) rather than a library.
bool is_python_plugin(const std::string& path);

// Loads the config's plugins (Config::plugins, whose name and sha256 it fills in), each file once.
// Throws UsageError, one line naming the file, for a missing file, one that is not a shared
// library, one without lattn_plugin_v2 or lattn_plugin_v1, another ABI number than its symbol's, a malformed or duplicate plugin or impl
// name, an impl with an unknown device or no forward; for Python, a file that does not import
// (the exception's last line) or declares no plugin.
Plugins load_plugins(Config& config);

// Throws UsageError for an impl named NAME:IMPL in any suite that no loaded plugin provides. (A
// suite of another op than linear attention's may name one, as --impl names it for every suite:
// its cases are skipped, no backend having a row for them.)
void check_plugin_impls(const Config& config, const Plugins& plugins);


}  // namespace lattn

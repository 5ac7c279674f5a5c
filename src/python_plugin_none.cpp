// python_plugin.hpp in a build without Python (-DLATTN_EMBED_PYTHON=OFF): a Python plugin is a
// usage error that says how to get one.
#include "python_plugin.hpp"

#include "core/error.hpp"

namespace lattn {

std::shared_ptr<LoadedPlugin> load_python_plugin(const std::string& path, int) {
  throw UsageError("plugin " + path,
                   "this lattnbench was built without Python (-DLATTN_EMBED_PYTHON=OFF); rebuild with python3-dev installed");
}

std::optional<PythonInfo> python_bridge_info() { return std::nullopt; }

}  // namespace lattn

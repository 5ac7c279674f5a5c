#include "src/config/install_paths.hpp"

#include <set>
#include <system_error>

namespace lattn {

namespace fs = std::filesystem;

std::vector<fs::path> config_dirs() {
  std::vector<fs::path> dirs;
  std::error_code ec;
#ifdef LATTN_INSTALLED_CONFIG_DIR
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = (exe.parent_path() / LATTN_INSTALLED_CONFIG_DIR).lexically_normal();
    if (fs::is_directory(installed, ec)) dirs.push_back(installed);
  }
#endif
#ifdef LATTN_SOURCE_CONFIG_DIR
  if (fs::is_directory(LATTN_SOURCE_CONFIG_DIR, ec)) dirs.emplace_back(LATTN_SOURCE_CONFIG_DIR);
#endif
  return dirs;
}

std::vector<std::string> installed_config_names() {
  std::set<std::string> names;
  std::error_code ec;
  for (const fs::path& dir : config_dirs())
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      const std::string ext = entry.path().extension().string();
      if ((ext == ".yaml" || ext == ".yml" || ext == ".json") && entry.is_regular_file(ec))
        names.insert(entry.path().stem().string());
    }
  return {names.begin(), names.end()};
}

std::string resolve_config_path(const std::string& name) {
  std::error_code ec;
  if (name.empty() || name.find('/') != std::string::npos || fs::exists(name, ec)) return name;
  // The suites first, then the model layers (configs/models/).
  for (const char* sub : {"", "models"})
    for (const fs::path& dir : config_dirs())
      for (const char* ext : {"", ".yaml", ".yml", ".json"})
        if (const fs::path candidate = dir / sub / (name + ext); fs::is_regular_file(candidate, ec))
          return candidate.string();
  return name;
}

}  // namespace lattn

#pragma once

#include <memory>
#include <vector>

#include "src/run/backend.hpp"

namespace lattn::cpu {

// One row per CPU impl of the loaded plugins (NAME:IMPL), run on the run's `threads`.
std::vector<ImplRow> plugin_rows(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins, int threads);

}  // namespace lattn::cpu

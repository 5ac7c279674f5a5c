#pragma once

#include <memory>
#include <vector>

#include "src/run/backend.hpp"

namespace lattn::cuda {

// One row per CUDA impl of the loaded plugins (NAME:IMPL), on GPU `device` (with a cold case's flush).
std::vector<ImplRow> plugin_rows(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins, int device);

}  // namespace lattn::cuda

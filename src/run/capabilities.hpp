// What --list prints: suites, impls, modes, decays, dtypes, and each backend with whether it is
// available here and why not; with plugins, their impls beside the backends' own, and for each
// the planned cases of `config` it declines, with the reasons.
#pragma once

#include <string>

#include "src/config/config.hpp"
#include "src/plugins/plugins.hpp"

namespace lattn {

std::string list_capabilities(const Plugins& plugins = {}, const Config* config = nullptr);

}  // namespace lattn

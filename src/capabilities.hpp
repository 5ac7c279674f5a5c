// What --list prints: suites, impls, modes, decays, dtypes, and each backend with whether it is
// available here and why not.
#pragma once

#include <string>

namespace lattn {

std::string list_capabilities();

}  // namespace lattn

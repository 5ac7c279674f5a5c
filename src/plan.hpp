// The plan a config expands to, and the checks that need all of it.
#pragma once

#include <vector>

#include "config.hpp"

namespace lattn {

// Checks what only the whole config can tell (sizes that no machine could hold, etc.).
void validate_config(const Config& config);

// The selected suites' cases, numbered in plan order.
std::vector<Case> expand_plan(const Config& config);

}  // namespace lattn

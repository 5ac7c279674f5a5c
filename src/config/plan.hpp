// The plan a config expands to, and the checks that need all of it.
#pragma once

#include <string>
#include <vector>

#include "src/config/config.hpp"

namespace lattn {

// Checks what only the whole config can tell (sizes that no machine could hold, etc.).
void validate_config(const Config& config);

// The selected suites' cases, numbered in plan order.
std::vector<Case> expand_plan(const Config& config);

// A case's name: its plan index and identity (003-kernel-scan-fwd-b2h4t512d32c128-none), as the
// progress line and the --dump folder show it and --filter matches it.
std::string case_slug(const Case& kase);

// The cases of `plan` whose name `filter`, an ECMAScript regular expression, matches somewhere in
// (std::regex_search); every case when it is empty. A bad expression is a UsageError of --filter.
std::vector<Case> filter_plan(const std::vector<Case>& plan, const std::string& filter);

}  // namespace lattn

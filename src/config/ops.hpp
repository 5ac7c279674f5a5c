// The ops this build knows (core/op.hpp): the table the config, the plan and the runner read.
#pragma once

#include <string>
#include <vector>

#include "core/op.hpp"

namespace lattn {

// In the order suites are listed and run.
const std::vector<const Op*>& all_ops();
// The op whose suite is `suite`, or null.
const Op* op_for_suite(const std::string& suite);
// The op named `name`, or null.
const Op* find_op(const std::string& name);

}  // namespace lattn

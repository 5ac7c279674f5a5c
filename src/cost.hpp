// What the plan and the records count beyond each op's flop model (core/op.hpp): the bytes a call
// must move at the least, and the relative cost that estimates the time left and balances shards.
#pragma once

#include "backend.hpp"
#include "core/case.hpp"

namespace lattn {

// Bytes one call must move at the least: its inputs once and its outputs once.
double case_min_bytes(const MemoryUsage& memory);
// Proportional to the case's flops, with a per-token floor so that tiny cases are not taken as free.
double case_cost_estimate(const Case& kase);

}  // namespace lattn

// The flop and byte model every result reports against (docs/performance.md). For chunked, the
// flops are the causal work the algorithm does, not the dense C x C products.
#pragma once

#include "backend.hpp"
#include "config.hpp"

namespace lattn {

double case_flops(const Case& kase);
// Bytes one call must move at the least: its inputs once and its outputs once.
double case_min_bytes(const MemoryUsage& memory);
// A relative cost used to estimate time left and to balance shards; proportional to flops, with
// a per-token floor so that tiny cases are not taken as free.
double case_cost_estimate(const Case& kase);

}  // namespace lattn

// --shard K/N: the K-th of N deterministic slices of the plan, balanced by estimated cost so that
// an external scheduler (a CI matrix, a Slurm array) can run them side by side.
#pragma once

#include <string>
#include <vector>

#include "src/config/config.hpp"

namespace lattn {

struct Shard {
  int index = 0;  // 1..count; 0 when the run is not sharded
  int count = 0;
  bool active() const { return count > 0; }
};

// Parses "K/N" (1 <= K <= N <= 10000); throws UsageError naming --shard.
Shard parse_shard(const std::string& text);

// The cases of `shard`, in plan order. Greedy longest-processing-time: cases by decreasing cost go
// to the least-loaded shard (ties to the lower shard), which depends on the plan alone.
std::vector<Case> select_shard(const std::vector<Case>& plan, const Shard& shard);

}  // namespace lattn

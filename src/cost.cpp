#include "cost.hpp"

#include "core/op.hpp"

namespace lattn {

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& c) {
  return c.op->flops(c) + 64.0 * double(c.batch) * c.heads * c.seq * c.dim;
}

}  // namespace lattn

#include "cost_model.hpp"

#include <algorithm>

namespace lattn {

double case_flops(const Case& kase) {
  const Problem& p = kase.problem;
  const double per_head_tokens = double(p.heads_total()) * p.seq;
  const double D = p.dim;
  if (kase.impl == Impl::scan) return per_head_tokens * (kase.mode == Mode::fwd ? 4.0 : 14.0) * D * D;
  const double C = std::min(p.chunk, p.seq);
  const double forward = per_head_tokens * (4.0 * D * D + 2.0 * C * D);
  return kase.mode == Mode::fwd ? forward : 3.0 * forward;
}

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& kase) {
  const Problem& p = kase.problem;
  return case_flops(kase) + 64.0 * double(p.token_elems());
}

}  // namespace lattn

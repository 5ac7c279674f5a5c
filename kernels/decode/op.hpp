// The decode step's table row (core/op.hpp): the decode suite (docs/spec.md section 1d).
#pragma once

#include "core/op.hpp"
#include "kernels/decode/problem.hpp"

namespace lattn {

const Op& decode_op();

// The kernels' view of a decode case.
DecodeProblem decode_problem(const Case& kase);

// Bytes one step moves at the least (docs/performance.md, "The decode step"): the state read and
// written once per value head, the earlier snapshots written, q and k read once per q/k head and v
// per value head in the case's dtype, o written, the gates and beta read.
double decode_step_bytes(const Case& kase);

}  // namespace lattn

// The decode step's float64 reference: docs/spec.md section 1b's recurrence over the step's tokens from
// the given state, token by token, keeping the states docs/spec.md section 1d's snapshots ask for.
#pragma once

#include "kernels/decode/problem.hpp"

namespace lattn::reference {

// args.state holds h0 on entry and the new state on return.
void decode_step(const DecodeProblem& p, const DecodeArgs<double, double>& args);

}  // namespace lattn::reference

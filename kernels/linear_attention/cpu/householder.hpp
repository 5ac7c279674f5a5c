// DeltaProduct (docs/spec.md section 1h: n > 1 Householder writes per token) run by the delta rule's
// variants over the interleaved seq * n steps (kernels/linear_attention/householder.hpp): q and g
// (and dO) spread to the steps in scratch from the run's allocator, k, v and beta read in place,
// the outputs and dq, dg picked back. The records name such a run's variant "<kernel>+householder".
#pragma once

#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {

// `inner`, the variant chosen for householder_steps(problem), made to take `problem` itself.
CpuVariant householder_stepped(const CpuVariant& inner);

}  // namespace lattn::cpu

// The linear-attention op's table row (core/op.hpp): the kernel suite.
#pragma once

#include "core/op.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn {

const Op& linear_attention_op();

// The kernels' view of a case of this op (or of the layer's linear branch).
Problem linear_problem(const Case& kase);

}  // namespace lattn

// The layer op's table row (core/op.hpp): the layer suite.
#pragma once

#include "core/op.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {

const Op& layer_op();

// The kernels' view of a layer case: its linear branch (dim = head dim) and window, the branch's
// form from the case's impl.
LayerProblem layer_problem(const Case& kase, bool keep_chunk_states = true);

}  // namespace lattn

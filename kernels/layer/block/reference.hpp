// Float64 ground truth of the modern layer block (docs/spec.md section 2b): block.hpp's template with dgemm
// products, the float64 scan of the linear branch (kernels/linear_attention/reference.hpp) and the
// float64 sliding window. tests/kernels/test_layer_block.cpp checks its gradients against central finite
// differences of its own forward.
#pragma once

#include "kernels/layer/block/block.hpp"

namespace lattn::reference {

void block_forward(const LayerProblem& problem, const BlockArgs<double>& args);
// Writes out and every gradient (args.dOut set).
void block_forward_backward(const LayerProblem& problem, const BlockArgs<double>& args);

}  // namespace lattn::reference

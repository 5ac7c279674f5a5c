// The sliding-window attention op's table row (core/op.hpp). It has no suite of its own: it is
// the layer's second branch, and its row gives the tests (tests/test_ops.cpp) and the layer's
// flop model one description of it.
#pragma once

#include "core/op.hpp"

namespace lattn {

const Op& sliding_window_op();

}  // namespace lattn

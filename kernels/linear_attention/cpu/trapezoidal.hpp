// The trapezoidal rule (Mamba-3, docs/spec.md section 1e) on the CPU, as the scalar-gated additive
// rule of another variant row plus per-token work (trapezoidal.cpp; docs/kernels.md, "The
// trapezoidal rule"); the algebra it shares with the CUDA adapter is kernels/linear_attention/trapezoidal.hpp's.
#pragma once

#include <string>

#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/trapezoidal.hpp"

namespace lattn::cpu {

using lattn::trapezoidal_inner;

// A row taking rule trapezoidal (decay scalar, every shape) that runs `inner` (a row taking the
// additive rule with scalar gates and every shape) on trapezoidal_inner's problem.
CpuVariant trapezoidal_variant(const std::string& name, const CpuVariant& inner);

}  // namespace lattn::cpu

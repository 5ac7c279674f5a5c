// The trapezoidal rule (Mamba-3, docs/spec.md section 1e) on the CPU, as the scalar-gated additive
// rule of another variant row plus per-token work (trapezoidal.cpp; docs/kernels.md, "The
// trapezoidal rule"). With mu_t = (1 - lambda_t) dt_t, the state X_t = S_t + mu_{t+1} K_t^T V_t obeys
//   X_t = alpha_t X_{t-1} + c_t K_t^T V_t,   c_t = gamma_t + mu_{t+1}   (mu past a sequence's end: 0)
// Mamba2's recurrence, with X_{-1} = h0 and X_{T-1} = hT; and O_t = Q_t X_t - mu_{t+1} (Q_t K_t^T) V_t.
// A token's R rows become R rows of the inner problem, the first carrying alpha_t, the others no
// decay; the inner readout of row r misses the token's later rows r' > r, which the per-token
// R x R correction adds with the diagonal term.
#pragma once

#include <string>

#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {

// The additive, scalar-gated problem the inner row runs: R rows per token (seq R, documents R
// times as long, chunk counting rows), rank 1.
Problem trapezoidal_inner(const Problem& problem);

// A row taking rule trapezoidal (decay scalar, every shape) that runs `inner` (a row taking the
// additive rule with scalar gates and every shape) on trapezoidal_inner's problem.
CpuVariant trapezoidal_variant(const std::string& name, const CpuVariant& inner);

}  // namespace lattn::cpu

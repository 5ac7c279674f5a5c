// The trapezoidal rule (Mamba-3, docs/spec.md section 1e) as the scalar-gated additive rule over R
// rows per token plus per-token work, the algebra the CPU's adapter (cpu/trapezoidal.cpp) and the
// CUDA one (cuda/trapezoidal.cu) share (docs/kernels.md, "The trapezoidal rule"). With
// mu_t = (1 - lambda_t) dt_t, the state X_t = S_t + mu_{t+1} K_t^T V_t obeys
//   X_t = alpha_t X_{t-1} + c_t K_t^T V_t,   c_t = gamma_t + mu_{t+1}   (mu past a sequence's end: 0)
// Mamba2's recurrence, with X_{-1} = h0 and X_{T-1} = hT; and O_t = Q_t X_t - mu_{t+1} (Q_t K_t^T) V_t.
// A token's R rows become R rows of the inner problem, the first carrying alpha_t, the others no
// decay; the inner readout of row r misses the token's later rows r' > r, which the per-token
// R x R correction adds with the diagonal term. Host-independent: the weights are __host__
// __device__ where CUDA compiles them, in the float type of the caller (double on the CPU, float
// on the GPU).
#pragma once

#include <math.h>

#include "kernels/linear_attention/problem.hpp"

#if defined(__CUDACC__)
#define LATTN_TRAPEZOIDAL_HD __host__ __device__
#else
#define LATTN_TRAPEZOIDAL_HD
#endif

namespace lattn {

// The additive, scalar-gated problem the inner row runs: R rows per token (seq R T, documents R
// times as long, chunk counting rows), rank 1.
inline Problem trapezoidal_inner(const Problem& p) {
  Problem in = p;
  const int R = p.rows();
  in.rule = Rule::additive;
  in.rank = 1;
  in.seq = p.seq * R;
  for (int& end : in.cu_seqlens) end *= R;
  return in;
}

LATTN_TRAPEZOIDAL_HD inline float trapezoidal_exp(float x) { return expf(x); }
LATTN_TRAPEZOIDAL_HD inline double trapezoidal_exp(double x) { return exp(x); }

// Token t's weights: lambda_t, gamma_t = lambda_t dt_t, mu_{t+1} and c_t = gamma_t + mu_{t+1}.
template <class F>
struct TrapezoidalWeights {
  F lambda, gamma, mu_next, c;
};

// From token t's dt and trap and the next token's (`last`: t ends its sequence or document, so
// mu_{t+1} = 0 and the next token's are not read).
template <class F>
LATTN_TRAPEZOIDAL_HD inline TrapezoidalWeights<F> trapezoidal_weights(F dt, F trap, F dt_next, F trap_next, bool last) {
  const F lambda = F(1) / (F(1) + trapezoidal_exp(-trap)), gamma = lambda * dt;
  const F mu_next = last ? F(0) : (F(1) - F(1) / (F(1) + trapezoidal_exp(-trap_next))) * dt_next;
  return {lambda, gamma, mu_next, gamma + mu_next};
}

// The weight of q_r . k_r' in row r's correction: c_t [r' > r] - mu_{t+1}.
template <class F>
LATTN_TRAPEZOIDAL_HD inline F trapezoidal_correction_weight(const TrapezoidalWeights<F>& w, int r, int r2) {
  return (r2 > r ? w.c : F(0)) - w.mu_next;
}

// dt's and trap's gradients from dc_t (= dgamma_t: c_t = gamma_t + mu_{t+1}) and dmu_t, the
// gradient of mu_t through token t - 1 (0 at a sequence's first token): gamma_t = lambda_t dt_t,
// mu_t = (1 - lambda_t) dt_t.
template <class F>
struct TrapezoidalInputGrads {
  F ddt, dtrap;
};
template <class F>
LATTN_TRAPEZOIDAL_HD inline TrapezoidalInputGrads<F> trapezoidal_input_grads(F lambda, F dt, F dgamma, F dmu) {
  return {lambda * dgamma + (F(1) - lambda) * dmu, lambda * (F(1) - lambda) * dt * (dgamma - dmu)};
}

}  // namespace lattn

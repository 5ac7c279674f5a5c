// Any shape of docs/spec.md section 1c (grouped q/k heads, Dk != Dv, packed documents) run by a
// kernel variant that computes square dense problems only: each sequence (the whole batch when not
// packed, else each document) is gathered into a square dense copy, run, and scattered back.
//
//   q, k  -> expanded to one q/k head per value head, padded with zero columns to P = max(Dk, Dv)
//            (q scaled by sqrt(P / Dk), so the kernel's 1 / sqrt(P) is the problem's 1 / sqrt(Dk))
//   v, dO -> padded to P;  g (vector) -> padded with log-gate 0;  h0, dhT -> padded to P x P
// Zero key channels and value columns stay zero through every rule and decay, so the padded
// problem's outputs are the problem's, padded; dq and dk are summed over the value heads a q/k head
// serves. The copies are taken from the run's allocator (temp_mb counts them) and cost time beside
// the kernel's: the records name such a run's variant "<kernel>+gather".
#pragma once

#include <cstddef>

#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {

// `inner` made to take every shape; it keeps no chunk states.
CpuVariant gathered(const CpuVariant& inner);

// The square dense problem the adapter hands the kernel for `problem`'s longest sequence.
Problem gathered_problem(const Problem& problem);

}  // namespace lattn::cpu

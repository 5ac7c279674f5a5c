// One walk over a column block of a state of D rows (Dk for S and G, Dv for S^T and G^T) for one
// token, the building block of the delta rule's scan kernels (cpu_scan_delta.cpp). Row by row,
// with r the row's W columns:
//
//   r <- r + b1[i] c1            (update 1)
//   r <- r . A                   (the decay: a scalar, a factor per row, or a vector over the columns)
//   y1 += x1[i] r,  y2 += x2[i] r (readouts of the decayed state)
//   r <- r + b2[i] c2            (update 2)
//   y3 += x3[i] r                (readout of the updated state)
//
// each stage present or not. Unlike the additive rule's pass (cpu_scan_pass.hpp), which applies six
// tokens to a row while it is in registers, a delta-rule token cannot start before the previous
// one's readout is complete: its update needs v_t - S'_t^T k_t, a sum over every row. So a walk is
// one token, and the forward pipelines instead: walk t finishes token t-1's update (update 1 with
// its w_{t-1}) and reads out token t in the same pass over the rows, so that every row is loaded
// and stored once per token with 3 to 4 vector operations between (docs/kernels.md).
//
// The block is packed: D rows of W floats, W = delta_walk_width(vec) (32 on AVX-512); columns past
// the state's last are zero and stay zero, since every column operand is zero-padded.
#pragma once

#include "kernels/cpu/vec.hpp"

namespace lattn::cpu {

enum class WalkDecay { none, scalar, rows, columns };

struct DeltaWalk {
  int D = 0;           // state rows
  float* S = nullptr;  // the packed block, D x W
  WalkDecay decay = WalkDecay::none;
  float a_scalar = 1.0f;          // WalkDecay::scalar
  const float* a_rows = nullptr;  // WalkDecay::rows: D factors
  const float* a_cols = nullptr;  // WalkDecay::columns: W factors
  // Row operands, D floats (null: the stage is absent); x2 only with x1.
  const float *b1 = nullptr, *x1 = nullptr, *x2 = nullptr, *b2 = nullptr, *x3 = nullptr;
  // Column operands and readouts, W floats each (the readouts overwritten).
  const float *c1 = nullptr, *c2 = nullptr;
  float *y1 = nullptr, *y2 = nullptr, *y3 = nullptr;
};

// Columns of a walk's block at this vector width.
int delta_walk_width(Vec vec);

// The stages a walk may combine (anything else throws std::logic_error): b1 x1 [x2] (the forward
// recurrence), b1 alone (the last pending update), b1 b2 x3 (the reverse recurrences), x1 b2 x3
// (the dq pass).
void run_delta_walk(const DeltaWalk& walk, Vec vec);

}  // namespace lattn::cpu

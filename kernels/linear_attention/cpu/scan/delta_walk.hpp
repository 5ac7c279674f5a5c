// One walk over a column block of a state of D rows (Dk for S and G, Dv for S^T and G^T) for one
// token, the building block of the delta rule's scan kernels (cpu/scan/scan_delta.cpp). Row by row,
// with r the row's W columns:
//
//   r <- r + b1[i] c1            (update 1)
//   r <- r . A                   (the decay: a scalar, a factor per row, or a vector over the columns)
//   y1 += x1[i] r,  y2 += x2[i] r (readouts of the decayed state)
//   r <- r + b2[i] c2            (update 2)
//   y3 += x3[i] r                (readout of the updated state)
//
// each stage present or not. Unlike the additive rule's pass (cpu/scan/scan_pass.hpp), which applies six
// tokens to a row while it is in registers, a delta-rule token cannot start before the previous
// one's readout is complete: its update needs v_t - S'_t^T k_t, a sum over every row. So the
// backward's walks are one token each, pipelined: a walk finishes the previous token's update and
// reads out its own in the same pass over the rows, every row loaded and stored once per token with
// 3 to 4 vector operations between. The forward's walk (DeltaPairWalk below) reads out two tokens
// from one state, the second's readouts corrected afterwards by the first's update (docs/kernels.md).
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

// A walk for two tokens at once, the forward's (cpu/scan/scan_delta_forward.cpp): row by row,
//
//   r <- r + b1[i] c1            (the first pending update)
//   r <- r . A                   (the decays of both tokens: a scalar or a factor per row)
//   r <- r + b2[i] c2            (the second pending update, its row operand scaled by the later decay)
//   y_j += x_j[i] r              (readouts, j < readouts: 0, 2 or 4)
//
// With a row loaded and stored once per two tokens, a row costs 2 + readouts vector FMAs (and a
// multiply) per load and store instead of half that, which is what bounds the one-token walk.
struct DeltaPairWalk {
  int D = 0;
  float* S = nullptr;                        // the packed block, D x W
  WalkDecay decay = WalkDecay::none;         // none, scalar or rows
  float a_scalar = 1.0f;                     // WalkDecay::scalar
  const float* a_rows = nullptr;             // WalkDecay::rows: D factors
  const float *b1 = nullptr, *b2 = nullptr;  // row operands, D floats each
  const float *c1 = nullptr, *c2 = nullptr;  // column operands, W floats each
  int readouts = 0;
  const float* x[4] = {};  // row operands of the readouts, D floats each
  float* y[4] = {};        // the readouts, W floats each (overwritten)
};

void run_delta_pair_walk(const DeltaPairWalk& walk, Vec vec);

// The walks' decay factors: exp(g) of tokens [first, first + count) of a head whose gates are
// `width` floats per token (Dk for decay vector, 1 otherwise), those before T, into rows of
// `stride` floats, zero past `width`. Shared by the delta rule's and DPLR's scans.
void take_exp_gates(const float* g, int T, int width, int stride, float* buf, int first, int count);

// Columns of a walk's block at this vector width.
int delta_walk_width(Vec vec);

// The stages a walk may combine (anything else throws std::logic_error): b1 x1 [x2] (the forward
// recurrence), b1 alone (the last pending update), b1 b2 x3 (the reverse recurrences), x1 b2 x3
// (the dq pass).
void run_delta_walk(const DeltaWalk& walk, Vec vec);

}  // namespace lattn::cpu

// One recurrent pass over a state of `rows` rows (the key channels, or the value channels of a
// transposed state), the building block of every scan kernel (forward, and the three passes of the
// backward):
//
//   for t in order (forward or reverse):
//     S   <- A_t S + upd_scale * b_t c_t^T          (b_t = upd_row[t], c_t = upd_col[t])
//     y_t  = out_scale * S^T r_t                     (r_t = read_row[t], y_t written to out[t])
//
// A_t is gamma, or a gate: a scalar per token, or a vector per token that scales S's rows or its
// columns (vector gates act on the key channels, which are the rows of S and G and the columns of
// their transposes). The first step of a pass decays the entering state only when `decay_first`
// is set (the forward recurrence does, the reverse one starts from dhT undecayed). Columns of S are
// independent, so a pass is run on a column range: threads can split one head's columns.
#pragma once

#include "kernels/cpu/vec.hpp"

namespace lattn::cpu {


// How the gate of a gated pass scales the state: one factor per token, per row, or per column.
enum class GateScale { scalar, rows, columns };

struct ScanPass {
  int T = 0, rows = 0;        // tokens, state rows
  // Floats from one token to the next: of the row operands (upd_row, read_row: `rows` each) and of
  // the column operands and outputs (upd_col, out: a value for each state column).
  int row_step = 0, col_step = 0;
  const float* upd_row = nullptr;
  const float* upd_col = nullptr;
  const float* read_row = nullptr;
  float* out = nullptr;
  // S[i][j] is at S[i * ld + (j - s_col0)]: a pass may hold only some columns, packed (see
  // cpu/scan/scan.cpp: a column block walked with a row stride of a multiple of 4 KiB thrashes L1 sets).
  float* S = nullptr;
  int ld = 0;
  int s_col0 = 0;
  float gamma = 1.0f, upd_scale = 1.0f, out_scale = 1.0f;
  // Gated passes: A_t's factors, exp(g) already taken, for step t (in token order, 0 .. T-1) at
  // gate + (t + gate_shift) * gate_stride (gate_stride 1 for scalar gates, Dk for vector gates); the
  // reverse recurrences decay by the gate of the token after (gate_shift 1). gamma is then unused.
  const float* gate = nullptr;
  GateScale gate_scale = GateScale::scalar;
  int gate_stride = 1, gate_shift = 0;
  bool decay_first = true;
  bool reverse = false;
  // Whether the row operands come from memory (the first column block a thread walks over these
  // tokens): the walk then prefetches each next group's rows; from cache, prefetching only costs.
  bool prefetch_next_rows = true;
  // Write full-width output blocks with non-temporal stores where rows start on cache lines: for
  // outputs no step reads back while they could still be cached (a head's T x D rows pass through
  // L2 once). That spares the read of each output line before its write, a fifth of the
  // forward's memory traffic, which is what bounds the scan at D = 32 and 64 on two cores.
  bool stream_out = false;
};

// The three are the tuned choices of kernels/cpu/tuning.hpp at this width (`scan`), read when called:
// Tokens one walk over a column block applies (the last walk of a pass may apply fewer, at a
// lower rate): token tiles should be a multiple of it.
int scan_tokens_per_walk(Vec vec);
// Columns are processed in blocks of this many (the last may be ragged): a work item's granularity.
int scan_column_block(Vec vec);
// Whether the first column block of a tile prefetches the next group's row operands
// (ScanPass::prefetch_next_rows).
bool scan_prefetch_rows(Vec vec);
// Runs `pass` on the state's columns [col_begin, col_end).
void run_scan_pass(const ScanPass& pass, int col_begin, int col_end, Vec vec);

}  // namespace lattn::cpu

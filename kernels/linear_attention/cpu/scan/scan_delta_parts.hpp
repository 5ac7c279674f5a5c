// What the delta rule's scan forward (cpu/scan/scan_delta_forward.cpp) and backward (cpu/scan/scan_delta.cpp)
// share: a problem's context, one thread's scratch and its carve, the packed column blocks of a
// state, one slice's inputs, the tile's gates, and the forward recurrence, which the backward runs
// again (F1). The method is in cpu/scan/scan_delta.cpp's header.
#pragma once

#include <cstddef>

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"

namespace lattn::cpu::scan_delta {

constexpr int kTile = 64;  // tokens per tile: 64 tokens of ~5 row operands of D = 128 are 160 KiB, in L2
constexpr int kPairs = kTile / 2;  // the forward's pairs of tokens per tile

struct Ctx {
  Vec vec;
  int Dk, Dv, W;
  int Dkp, Dvp;  // Dk, Dv rounded up to W
  int gw;        // gate floats per token in the tile buffer
  Decay decay;
  float s;
  // Where the backward keeps e_t: in dq (false), or in T x Dv floats of the thread's scratch, T the
  // longest slice's tokens (e_tokens).
  bool e_scratch;
  int e_tokens;
};

Ctx context(const Problem& p);

// One thread's buffers, carved from its block (base null: only counted).
struct Scratch {
  double* dg_acc;  // Dkp: dg's running sums per key channel
  float *S, *ST;   // packed states, Dk x Dvp and (backward only) Dv x Dkp
  float *gates;    // exp(g) of a tile's tokens and the ones before and after it, (kTile + 2) x gw
  float *stage;    // e of a tile's tokens, kTile x Dv (backward only)
  float *carry, *carry2;  // Dvp each: the pending updates' column operands of each block
  float *c1, *c2, *y1, *y2, *y3, *y4;  // W each
  float* qk;       // kTile: q_t . k_t (forward)
  // The forward's pairs (prepare_pairs), kPairs of each: a_{t-1} a_t (vector gates), a_t . k_{t-1},
  // a_{t+1} . k_{t+1}, a_{t+1} . q_{t+1} (Dk floats each), and three scalars (a_{t-1} a_t for scalar
  // decays, k_t . (a_{t+1} . k_{t+1}), k_t . (a_{t+1} . q_{t+1})).
  float *pair_a, *pair_b2, *pair_k, *pair_q, *pair_decay, *pair_kk, *pair_kq;
  float* e;        // e_tokens x Dv: e_t (backward, Ctx::e_scratch)
  std::size_t used = 0;
};

Scratch carve(const Ctx& x, float* base, bool backward);

// Columns [c0, c1) of a rows x cols matrix (src [rows][cols], or with `transposed` the transpose
// of src [cols][rows]) into blocks of W columns, zero-padded: block c / W at dst + c * rows, row i
// at i * W.
void pack_blocks(const float* src, bool transposed, float* dst, int rows, int cols, int W, int c0, int c1);
void unpack_blocks(const float* src, float* dst, int rows, int cols, int W, int c0, int c1);

// One slice's inputs.
struct Head {
  const float *q, *k, *v, *beta, *g;  // g: this slice's log-gates, or null
  float gamma;                         // retnet's (1 otherwise)
  int T;
};

Head head_of(const Problem& p, const HeadSlice& h, const float* q, const float* k, const float* v,
             const float* beta, const float* g);

// exp(g) of tokens [first, first + count) (those before T) into the tile buffer.
void take_gates(const Ctx& x, const Head& h, float* buf, int first, int count);

// The forward recurrence on value columns [c0, c1) of one slice from h0: o (when given), e_t = v_t -
// u_t (when given, rows e_step apart) and hT (when given), with the forward's or the backward's
// scratch (cpu/scan/scan_delta_forward.cpp).
void forward_columns(const Ctx& x, const Head& h, const float* h0, int c0, int c1, const Scratch& s, float* o, float* e,
                     std::size_t e_step, float* hT);

}  // namespace lattn::cpu::scan_delta

// The shape of one decode step (docs/spec.md section 1d) and the tensor layouts every backend shares.
//
// Layouts (row-major, contiguous), T = tokens of the step, K = kept_slots() (min(snapshots, T)):
//   q, k, v, o        : [batch][heads][T][dim]          (row t is the step's token t)
//   state (h0 -> hT)  : [batch][heads][dim][dim]        (rows: key dim, columns: value dim)
//   g (decay scalar)  : [batch][heads][T]               (log-gates, one per token)
//   g (decay vector)  : [batch][heads][T][dim]          (log-gates per token and key channel)
//   beta (rule delta) : [batch][heads][T]
//   snapshots         : [batch][heads][K - 1][dim][dim] (slot i - 1 holds the state i tokens before
//                                                        the step's end; only when K > 1)
// A step reads the state and writes the new one over it (in place, as inference engines keep it);
// slot 0 of docs/spec.md section 1d's snapshots is that state itself, so only the earlier slots are a
// tensor of their own. The recurrence is the linear-attention op's (kernels/linear_attention).
#pragma once

#include <cstddef>

#include "kernels/linear_attention/problem.hpp"

namespace lattn {

struct DecodeProblem {
  int batch = 1;
  int heads = 1;
  int tokens = 1;
  int dim = 1;
  int snapshots = 1;  // the states kept: the final one and up to snapshots - 1 before it
  Decay decay = Decay::none;
  Rule rule = Rule::additive;

  bool delta() const { return rule == Rule::delta; }
  std::size_t heads_total() const { return std::size_t(batch) * heads; }
  int kept_slots() const { return snapshots < tokens ? snapshots : tokens; }
  // The earlier states written to the snapshots tensor (slot 0 is the state itself).
  int extra_slots() const { return kept_slots() - 1; }
  std::size_t head_state_elems() const { return std::size_t(dim) * dim; }
  std::size_t state_elems() const { return heads_total() * head_state_elems(); }
  std::size_t token_elems() const { return heads_total() * std::size_t(tokens) * dim; }
  int gate_width() const { return decay == Decay::vector ? dim : decay == Decay::scalar ? 1 : 0; }
  std::size_t gate_elems() const { return heads_total() * std::size_t(tokens) * gate_width(); }
  std::size_t beta_elems() const { return heads_total() * std::size_t(tokens); }
  std::size_t snapshot_elems() const { return state_elems() * std::size_t(extra_slots()); }
};

// Pointers of one step. `state` is read and overwritten; o and snapshots are fully overwritten.
// g only for a gated decay, beta only for the delta rule, snapshots only when extra_slots() > 0.
// In: q, k, v's element type (void on the GPU, where they may be bf16); F: everything else's.
template <class In, class F = float>
struct DecodeArgs {
  const In* q;
  const In* k;
  const In* v;
  F* state;
  F* o;
  const F* g = nullptr;
  const F* beta = nullptr;
  F* snapshots = nullptr;
};

}  // namespace lattn

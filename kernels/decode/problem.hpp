// The shape of one decode step (docs/spec.md section 1d) and the tensor layouts every backend shares.
//
// Layouts (row-major, contiguous), T = tokens of the step, K = kept_slots() (min(snapshots, T)),
// H value heads, Hk = qk_heads() q/k heads, Dk = dim, Dv = value_dim():
//   q, k              : [batch][Hk][T][Dk]          (row t is the step's token t)
//   v, o              : [batch][H][T][Dv]
//   state (h0 -> hT)  : [batch][H][Dk][Dv]          (rows: key dim, columns: value dim)
//   g (decay scalar)  : [batch][H][T]               (log-gates, one per token)
//   g (decay vector)  : [batch][H][T][Dk]           (log-gates per token and key channel)
//   beta (rule delta) : [batch][H][T]
//   a, b (rule dplr)  : [batch][H][T][Dk]          (docs/spec.md section 1f)
//   rule trapezoidal (docs/spec.md section 1e), R = rank rows per token: q, k [batch][Hk][T][R][Dk],
//   v, o [batch][H][T][R][Dv]; dt, trap [batch][H][T]; the previous token's rows k_prev
//   [batch][H][R][Dk] and v_prev [batch][H][R][Dv] (zero before a sequence's first token), and the
//   step's last token's, k_last and v_last (the same shapes: the next step's k_prev and v_prev)
//   u (bonus)         : [H][Dk]                     (RWKV-6's bonus, docs/spec.md section 1g)
//   snapshots         : [batch][H][K - 1][Dk][Dv]   (slot i - 1 holds the state i tokens before the
//                                                    step's end; only when K > 1; float32)
//   state pool        : [slots][H][Dk][Dv]          (a pooled step, state_slots > batch: sequence b's
//                                                    states are slot state_index[b]'s, as an engine's
//                                                    cache of recurrent states is indexed; otherwise
//                                                    the state tensor above, slot b for sequence b)
// The states are float32 or bf16 (state_bf16: stored as bf16 bits, read into float32, stepped in
// float32 over all of the step's tokens and rounded to bf16 once, when written back).
// Value head h reads q/k head h / group() where it lies (grouped heads, docs/spec.md section 1c: the
// point of sharing a q/k head is reading it once per group, so no kernel copies it out per value head).
// A step reads the state and writes the new one over it (in place, as inference engines keep it);
// slot 0 of docs/spec.md section 1d's snapshots is that state itself, so only the earlier slots are a
// tensor of their own. The recurrence is the linear-attention op's (kernels/linear_attention).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/linear_attention/problem.hpp"

namespace lattn {

struct DecodeProblem {
  int batch = 1;
  int heads = 1;  // value heads (each has its own state)
  int tokens = 1;
  int dim = 1;        // the key head dim Dk: the state's rows
  int snapshots = 1;  // the states kept: the final one and up to snapshots - 1 before it
  Decay decay = Decay::none;
  Rule rule = Rule::additive;
  int heads_k = 0;  // q/k heads (docs/spec.md section 1c); 0: heads
  int dim_v = 0;    // the value head dim Dv: the state's columns; 0: dim
  int state_slots = 0;     // the pool's slots; 0 or batch: no pool, sequence b's states in slot b
  bool state_bf16 = false;  // the states stored as bf16 (updated in float32, rounded once per step)
  int rank = 1;             // rows of q, k, v, o per token (rule trapezoidal's MIMO rank)
  bool bonus = false;       // RWKV-6's bonus (docs/spec.md section 1g): an input u [H][Dk]
  // DeltaProduct (docs/spec.md section 1h; rule delta): writes per token, k, v and beta carrying
  // householder rows per token ([..][tokens * householder][..]); 1: one.
  int householder = 1;

  bool delta() const { return rule == Rule::delta; }
  bool dplr() const { return rule == Rule::dplr; }
  bool trapezoidal() const { return rule == Rule::trapezoidal; }
  int rows() const { return rank > 1 ? rank : 1; }
  int qk_heads() const { return heads_k > 0 ? heads_k : heads; }
  int value_dim() const { return dim_v > 0 ? dim_v : dim; }
  bool pooled() const { return state_slots > batch; }
  int slots() const { return pooled() ? state_slots : batch; }
  std::size_t pool_elems() const { return std::size_t(slots()) * std::size_t(heads) * head_state_elems(); }
  // Where value head bh's (b * heads + h) state starts in the states, in elements: slot
  // state_index[b] of the pool, or slot b without one.
  std::size_t state_offset(std::size_t bh, const int* state_index) const {
    const std::size_t b = bh / std::size_t(heads), h = bh % std::size_t(heads);
    const std::size_t slot = state_index ? std::size_t(state_index[b]) : b;
    return (slot * std::size_t(heads) + h) * head_state_elems();
  }
  int group() const { return heads / qk_heads(); }  // value heads per q/k head
  std::size_t heads_total() const { return std::size_t(batch) * heads; }
  int kept_slots() const { return snapshots < tokens ? snapshots : tokens; }
  // The earlier states written to the snapshots tensor (slot 0 is the state itself).
  int extra_slots() const { return kept_slots() - 1; }
  std::size_t head_state_elems() const { return std::size_t(dim) * std::size_t(value_dim()); }
  std::size_t state_elems() const { return heads_total() * head_state_elems(); }
  // Value head bh's (b * heads + h) q/k head, as an index into [batch][Hk].
  std::size_t key_head(std::size_t bh) const {
    const std::size_t b = bh / std::size_t(heads), h = bh % std::size_t(heads);
    return b * std::size_t(qk_heads()) + h / std::size_t(group());
  }
  std::size_t key_elems() const { return std::size_t(batch) * qk_heads() * std::size_t(tokens) * rows() * dim; }  // q, k
  std::size_t value_elems() const { return heads_total() * std::size_t(tokens) * rows() * value_dim(); }      // v, o
  // The previous token's rows per value head (rule trapezoidal): k_prev, k_last; v_prev, v_last.
  std::size_t carry_k_elems() const { return trapezoidal() ? heads_total() * rows() * std::size_t(dim) : 0; }
  std::size_t carry_v_elems() const { return trapezoidal() ? heads_total() * rows() * std::size_t(value_dim()) : 0; }
  int gate_width() const { return decay == Decay::vector ? dim : decay == Decay::scalar ? 1 : 0; }
  std::size_t gate_elems() const { return heads_total() * std::size_t(tokens) * gate_width(); }
  std::size_t beta_elems() const { return heads_total() * std::size_t(tokens); }
  std::size_t low_rank_elems() const { return heads_total() * std::size_t(tokens) * dim; }  // a, b (dplr)
  std::size_t snapshot_elems() const { return state_elems() * std::size_t(extra_slots()); }
};

// Pointers of one step. The states are read and overwritten: `state` (float32) or `state_bf16` (bf16
// bits, for a problem with state_bf16), the pool's slots when state_index is given (one slot per
// sequence, `batch` entries, distinct), else [batch][H][Dk][Dv]. o and snapshots are fully
// overwritten. g only for a gated decay, beta only for the delta rule, a and b only for dplr,
// snapshots only when extra_slots() > 0.
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
  std::uint16_t* state_bf16 = nullptr;
  const int* state_index = nullptr;
  const F* a = nullptr;  // rule dplr: the low-rank part's write and read directions
  const F* b = nullptr;
  // rule trapezoidal: the step sizes and lambda's logits, the previous token's rows, and the last
  // token's rows written out (the layouts above).
  const F* dt = nullptr;
  const F* trap = nullptr;
  const F* k_prev = nullptr;
  const F* v_prev = nullptr;
  F* k_last = nullptr;
  F* v_last = nullptr;
  const F* u = nullptr;  // the bonus, [H][Dk] (DecodeProblem::bonus)
};

}  // namespace lattn

// The shape of one causal linear-attention problem and the tensor layouts every backend shares.
//
// Layouts (row-major, contiguous), Hk = qk_heads(), Dk = dim, Dv = value_dim(), N = sequences():
//   q, k, dq, dk        : [batch][Hk][seq][Dk]     (row t is token t; q/k head hk serves value heads
//                                                  hk G .. hk G + G - 1, G = heads / Hk)
//   v, o, dO, dv        : [batch][heads][seq][Dv]
//   h0, hT, dhT, dh0    : [N][heads][Dk][Dv]       (rows: key dim, columns: value dim; one state per
//                                                  sequence: per batch entry, or per packed document)
//   g, dg (decay scalar): [batch][heads][seq]      (log-gates, one per token)
//   g, dg (decay vector): [batch][heads][seq][Dk]  (log-gates per token and key channel)
//   beta, dbeta (delta) : [batch][heads][seq]      (write strengths in (0, 1), one per token)
//   a, b, da, db (dplr) : [batch][heads][seq][Dk]  (the transition's low-rank part, per value head)
//   dt, trap, ddt, dtrap: [batch][heads][seq]      (rule trapezoidal: step sizes and lambda's logits)
//   u, du (bonus)       : [heads][Dk]              (RWKV-6's bonus of the current token, per value head)
// With rule trapezoidal and rank R > 1 (MIMO) each token has R rows of q, k, v and o: q, k
// [batch][Hk][seq][R][Dk], v, o [batch][heads][seq][R][Dv] (docs/spec.md section 1e). With
// householder n > 1 (DeltaProduct) k, v and beta have n rows per token (docs/spec.md section 1h).
// A packed batch (cu_seqlens) is batch 1 whose seq tokens are documents one after another; the state
// restarts at each document (docs/spec.md section 1c). slice() gives one (sequence, head) pair's
// offsets into every tensor, whatever the shape.
// The mathematics is in docs/kernels.md (docs/spec.md section 1). The op's table row (tensors, inputs,
// flop model) is op.cpp beside this file.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lattn {

// How the state decays between tokens (docs/spec.md sections 1 and 1b): `none` (gamma 1), `retnet`
// (gamma_h = 1 - 2^(-5-h) for head h), or data-dependent gates, an input g of log-gates <= 0:
// `scalar` (A_t = exp(g_t) scales the whole state: Mamba2, simple GLA) or `vector` (A_t =
// diag(exp(g_t)) scales the state's rows, the key channels: GLA, RWKV-6).
enum class Decay { none, retnet, scalar, vector };

inline bool gated(Decay decay) { return decay == Decay::scalar || decay == Decay::vector; }

// How token t is written into the state (docs/spec.md section 1b): `additive` (S_t = S'_t + k_t v_t^T) or
// `delta` (S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T: DeltaNet, with the gates Gated DeltaNet and
// KDA), S'_t = A_t S_{t-1} being the decayed state. An input beta [B][H][T] exists for `delta` only.
// `dplr` (RWKV-7's diagonal plus low rank, docs/spec.md section 1f): S_t = (A_t + a_t b_t^T) S_{t-1}
// + k_t v_t^T, with inputs a, b [B][H][T][Dk].
// `trapezoidal` (Mamba-3, docs/spec.md section 1e): S_t = exp(g_t) S_{t-1} + beta_t k_{t-1} v_{t-1}^T +
// gamma_t k_t v_t^T from the step sizes dt and lambda = sigmoid(trap); scalar gates only, scale 1.
enum class Rule { additive, delta, trapezoidal, dplr };

// The rules' names, in enum order: what configs and records write.
const std::vector<std::string>& rule_names();
std::string to_string(Rule rule);
// Throws RuntimeFailure for a name rule_names() does not hold.
Rule rule_from(const std::string& name);

// The decays' names, in enum order (then those add_fixed_decay added): what configs and records write.
const std::vector<std::string>& decay_names();
std::string to_string(Decay decay);
// Throws RuntimeFailure for a name decay_names() does not hold.
Decay decay_from(const std::string& name);

// One (sequence, value head) pair of a problem: where its rows start in each tensor, its length
// and its head index (retnet's gamma_h). Rows of one pair are contiguous in every tensor.
struct HeadSlice {
  std::size_t key;    // q, k, dq, dk (the pair's q/k head)
  std::size_t value;  // v, o, dO, dv
  std::size_t gate;   // g, dg
  std::size_t beta;   // beta, dbeta
  std::size_t state;  // h0, hT, dhT, dh0
  int seq;            // the pair's tokens
  int head;           // the value head, 0 .. heads - 1
};

struct Problem {
  int batch = 1;
  int heads = 1;
  int seq = 1;
  int dim = 1;
  int chunk = 64;  // only the chunked form reads it
  Decay decay = Decay::none;
  Rule rule = Rule::additive;
  int heads_k = 0;           // q/k heads (docs/spec.md section 1c); 0: heads
  int dim_v = 0;             // the value head dim; 0: dim
  // A packed batch's document boundaries, as flash-linear-attention's cu_seqlens: 0, the end of
  // each document, the last being seq (batch 1); empty: dense.
  std::vector<int> cu_seqlens = {};
  int rank = 1;  // rows of q, k, v, o per token (rule trapezoidal's MIMO rank; 1 elsewhere)
  // RWKV-6 (docs/spec.md section 1g; rule additive): o_t = s (S_{t-1} + diag(u) k_t v_t^T)^T q_t, the
  // output read from the state before token t's decay and write, plus the current token's bonus.
  bool bonus = false;
  // DeltaProduct (docs/spec.md section 1h; rule delta): n >= 1 Householder writes per token, k, v,
  // beta and their gradients carrying n rows per token ([..][seq * n][..], token-major); 1: the rule
  // of section 1b.
  int householder = 1;

  bool delta() const { return rule == Rule::delta; }
  bool dplr() const { return rule == Rule::dplr; }
  bool trapezoidal() const { return rule == Rule::trapezoidal; }
  int rows() const { return rank > 1 ? rank : 1; }  // q/k/v/o rows per token
  int qk_heads() const { return heads_k > 0 ? heads_k : heads; }
  int value_dim() const { return dim_v > 0 ? dim_v : dim; }
  int group() const { return heads / qk_heads(); }  // value heads per q/k head
  bool packed() const { return cu_seqlens.size() > 1; }
  // What every kernel takes as it is: one q/k head per value head, a square state, no packing.
  bool square_dense() const { return qk_heads() == heads && value_dim() == dim && !packed(); }
  int sequences() const { return packed() ? int(cu_seqlens.size()) - 1 : batch; }  // states per head
  std::size_t slices() const { return std::size_t(sequences()) * heads; }
  HeadSlice slice(std::size_t index) const {
    const int n = int(index / heads), h = int(index % heads);
    const int b = packed() ? 0 : n;
    const int start = packed() ? cu_seqlens[n] : 0;
    const std::size_t row = std::size_t(b) * heads + h, at = row * seq + start;
    const std::size_t R = std::size_t(rows());
    return {((std::size_t(b) * qk_heads() + h / group()) * seq + std::size_t(start)) * R * dim,
            at * R * value_dim(),
            at * gate_width(),
            at,
            (std::size_t(n) * heads + h) * dim * value_dim(),
            packed() ? cu_seqlens[n + 1] - start : seq,
            h};
  }
  std::size_t key_elems() const { return std::size_t(batch) * qk_heads() * seq * rows() * dim; }      // q, k
  std::size_t value_elems() const { return heads_total() * seq * std::size_t(rows()) * value_dim(); }  // v, o
  std::size_t heads_total() const { return std::size_t(batch) * heads; }
  // Square dense problems only (the kernels' own sizes): one of q, k, v, o; one head's rows.
  std::size_t token_elems() const { return heads_total() * seq * std::size_t(rows()) * dim; }
  std::size_t head_token_elems() const { return std::size_t(seq) * rows() * dim; }
  std::size_t state_elems() const { return slices() * dim * std::size_t(value_dim()); }  // one of h0, hT
  std::size_t head_state_elems() const { return std::size_t(dim) * value_dim(); }
  int chunks() const { return (seq + chunk - 1) / chunk; }
  // Log-gates per token: dim for vector gates, one for scalar gates, none otherwise.
  int gate_width() const { return decay == Decay::vector ? dim : decay == Decay::scalar ? 1 : 0; }
  std::size_t gate_elems() const { return heads_total() * seq * std::size_t(gate_width()); }
  std::size_t head_gate_elems() const { return std::size_t(seq) * gate_width(); }
  std::size_t beta_elems() const { return heads_total() * seq; }  // beta, dbeta (rule delta)
  // a, b, da, db (rule dplr): Dk per token of each value head; a slice's rows start at
  // low_rank_offset (its token offset, HeadSlice::beta, times Dk).
  std::size_t low_rank_elems() const { return heads_total() * seq * std::size_t(dim); }
  std::size_t low_rank_offset(const HeadSlice& h) const { return h.beta * std::size_t(dim); }
  std::size_t bonus_elems() const { return bonus ? std::size_t(heads) * dim : 0; }  // u, du
};

// A decay added at run time (docs/adding-a-kernel.md; tests/kernels/test_variants.cpp's toy decay): a fixed
// gamma_h per head, like retnet's. It becomes a Decay value past `vector`, named in decay_names();
// the reference takes it through decay_gamma, and a backend's variant rows take it only where a
// row names it (no built-in row does). Adding a name twice returns the first one's value.
Decay add_fixed_decay(const std::string& name, double (*gamma)(int head));
// The gamma of a decay add_fixed_decay made; throws std::logic_error for any other.
double fixed_decay_gamma(Decay decay, int head);

// gamma_h of docs/spec.md section 1: 1 - 2^(-5-h) for `retnet`, an added decay's own, 1 for the
// others (gated decays take their decay from g instead).
inline double decay_gamma(Decay decay, int head) {
  if (decay == Decay::retnet) return 1.0 - std::ldexp(1.0, -5 - head);
  if (decay > Decay::vector) return fixed_decay_gamma(decay, head);
  return 1.0;
}

// The chunked form with vector gates works in sub-chunks of this many rows (cpu/chunked/chunked_gated.cpp):
// the scores between two sub-chunks are products of operands scaled relative to a point between
// them, those within one are summed by hand.
constexpr int kGateSubChunk = 32;

inline double attention_scale(int dim) { return 1.0 / std::sqrt(double(dim)); }
// The readout's scale s of o_t = s S_t^T q_t: Dk^-1/2, but 1 for the trapezoidal rule, whose step
// sizes dt scale the writes instead (Mamba-3's kernels have no other scale; docs/spec.md section 1e).
inline double output_scale(const Problem& p) { return p.trapezoidal() ? 1.0 : attention_scale(p.dim); }

// Pointers of one forward call. Outputs are fully overwritten. g: the log-gates of a gated decay
// (null otherwise); beta: the delta rule's write strengths (null for the additive rule).
template <class T>
struct ForwardArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* h0;
  T* o;
  T* hT;
  const T* g = nullptr;
  const T* beta = nullptr;
  const T* a = nullptr;  // rule dplr: the low-rank part's write direction a and read direction b
  const T* b = nullptr;
  const T* dt = nullptr;    // rule trapezoidal: step sizes dt_t > 0
  const T* trap = nullptr;  // rule trapezoidal: lambda_t's logits
  const T* u = nullptr;  // the bonus (Problem::bonus), [heads][Dk]
};

// Pointers of one backward call: the forward's inputs, the cotangents, and the gradients
// (overwritten). g and dg only for a gated decay, beta and dbeta only for the delta rule, a, b, da
// and db only for dplr.
template <class T>
struct BackwardArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* h0;
  const T* dO;
  const T* dhT;
  T* dq;
  T* dk;
  T* dv;
  T* dh0;
  const T* g = nullptr;
  T* dg = nullptr;
  const T* beta = nullptr;
  T* dbeta = nullptr;
  const T* a = nullptr;  // rule dplr's inputs and their gradients (null otherwise)
  const T* b = nullptr;
  T* da = nullptr;
  T* db = nullptr;
  const T* dt = nullptr;  // rule trapezoidal: its inputs and their gradients
  const T* trap = nullptr;
  T* ddt = nullptr;
  T* dtrap = nullptr;
  const T* u = nullptr;  // the bonus and its gradient (Problem::bonus), [heads][Dk]
  T* du = nullptr;
};

}  // namespace lattn

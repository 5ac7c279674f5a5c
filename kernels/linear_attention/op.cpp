// Causal linear attention (docs/spec.md section 1) as a table row: the kernel suite's config keys, the two
// forms and their flop models, the tensors, the inputs of docs/spec.md section 3, the float64 reference
// (reference.cpp) and the tolerances. The kernels are in cpu/ and cuda/ beneath this file.
// Over 500 lines, and past 650 (near 780) with the trapezoidal and dplr rules, RWKV-6's bonus and DeltaProduct:
// the keys, the flop models and the inputs are one row, read together; each rule or form adds its
// inputs, tensors and flop terms beside the others'. The next rule should move the per-rule inputs and
// flop models into files of their own.
#include "kernels/linear_attention/op.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/linear_attention/packing.hpp"
#include "kernels/linear_attention/reference.hpp"

namespace lattn {

namespace token_shapes {

int householder(const Case& c) {
  const std::string text = c.option("householder");
  return text.empty() || c.option("rule") != "delta" ? 1 : std::stoi(text);
}

std::vector<std::size_t> rows(std::size_t heads, const Case& c, std::size_t width, int writes) {
  std::vector<std::size_t> shape = {std::size_t(c.batch), heads, std::size_t(c.seq) * std::size_t(writes)};
  if (mimo_rank(c) > 1) shape.push_back(std::size_t(mimo_rank(c)));
  shape.push_back(width);
  return shape;
}
std::vector<std::size_t> keys(const Case& c) { return rows(std::size_t(qk_heads(c)), c, std::size_t(c.dim)); }
std::vector<std::size_t> values(const Case& c) { return rows(std::size_t(c.heads), c, std::size_t(value_dim(c))); }
std::vector<std::size_t> step_keys(const Case& c) {
  return rows(std::size_t(qk_heads(c)), c, std::size_t(c.dim), householder(c));
}
std::vector<std::size_t> step_values(const Case& c) {
  return rows(std::size_t(c.heads), c, std::size_t(value_dim(c)), householder(c));
}
std::vector<std::size_t> betas(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq) * householder(c)};
}

}  // namespace token_shapes

namespace {

// Sizes beyond these are refused when the config is read, before anything is allocated.
constexpr long kMaxMimoRank = 16;
constexpr long kMaxBatch = 4096, kMaxHeads = 4096, kMaxSeq = 1L << 24, kMaxDim = 1024, kMaxChunk = 8192;

// A varlen text's documents. A case asks for them for each shape, flop model and record, and a
// draw fills up to kMaxDocuments uniforms, so each thread keeps its last draw: the draw is a
// function of the text alone, and a thread's own copy needs no lock.
std::vector<int> drawn_documents(const std::string& varlen) {
  thread_local std::string last_text;
  thread_local std::vector<int> last;
  if (varlen != last_text) {
    std::string text = varlen;
    std::vector<int> drawn = draw_varlen(varlen);
    // Both copies made before either is replaced: a failed one leaves the pair as it was.
    last = std::move(drawn);
    last_text = std::move(text);
  }
  return last;
}

// A packed case's documents (settle_case has made it batch 1 with seq the documents' sum).
std::vector<int> documents(const Case& c) {
  if (!c.option("lengths").empty()) return lengths_of(c.option("lengths"));
  if (!c.option("varlen").empty()) return drawn_documents(c.option("varlen"));
  return {};
}
int sequences(const Case& c) {
  const std::size_t n = documents(c).size();
  return n ? int(n) : c.batch;
}

using token_shapes::betas;
using token_shapes::householder;
using token_shapes::keys;
using token_shapes::step_keys;
using token_shapes::step_values;
using token_shapes::values;
// h0, hT (dh0, dhT): [N][H][Dk][Dv], N sequences (the packed documents, else the batch).
std::vector<std::size_t> states(const Case& c) {
  return {std::size_t(sequences(c)), std::size_t(c.heads), std::size_t(c.dim), std::size_t(value_dim(c))};
}
// The log-gates g (and dg): [B][H][T] for scalar gates, [B][H][T][Dk] for vector gates.
std::vector<std::size_t> gates(const Case& c) {
  std::vector<std::size_t> shape = {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq)};
  if (c.decay == "vector") shape.push_back(std::size_t(c.dim));
  return shape;
}
bool is_gated(const Case& c) { return c.decay == "scalar" || c.decay == "vector"; }
// The delta rule (docs/spec.md section 1b): its beta and dbeta exist only there. A case without the option
// (a plugin's or a test's, built by hand) is additive.
bool is_delta(const Case& c) { return c.option("rule") == "delta"; }
// The diagonal-plus-low-rank rule (docs/spec.md section 1f): a, b (and da, db) [B][H][T][Dk], per value head.
bool is_dplr(const Case& c) { return c.option("rule") == "dplr"; }
std::vector<std::size_t> low_rank(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq), std::size_t(c.dim)};
}
// The trapezoidal rule (docs/spec.md section 1e): its dt and trap (and gradients) are betas' shape.
bool is_trapezoidal(const Case& c) { return c.option("rule") == "trapezoidal"; }
// RWKV-6's bonus (docs/spec.md section 1g): additive rule, vector gates, `bonus: true`; its u and du
// [H][Dk] exist only there (case_limit refuses the key elsewhere).
bool bonus_applies(const Case& c) {
  const std::string rule = c.option("rule");
  return (rule.empty() || rule == "additive") && c.decay == "vector";
}
bool has_bonus(const Case& c) { return c.option("bonus") == "true" && bonus_applies(c); }
std::vector<std::size_t> bonuses(const Case& c) { return {std::size_t(c.heads), std::size_t(c.dim)}; }

// gate_norm's default (GLA's normaliser) and its largest value: past it the gates are 1 to float32.
constexpr double kDefaultGateNorm = 16, kMaxGateNorm = 1e6;

double gate_norm(const Case& c) {
  const std::string text = c.option("gate_norm");
  return text.empty() ? kDefaultGateNorm : std::stod(text);
}

// The forward is 4 D^2 flops per token and head (the state update and the readout, 2 D^2 each);
// the backward's three recurrences (S for dq, G for dk and dv) add 10 D^2.
// Gated (docs/performance.md): every pass also scales its state by the gate, D^2 per token, and
// takes exp of the gates (counted one flop each, W per token: D for vector gates, 1 for scalar);
// the backward is three passes (dq on S^T, dv on G, dk on G^T: 15 D^2, the reverse two sharing one
// tile's exps) and dg from q.dq - k.dk, summed in reverse (4 D).
// Delta rule (cpu/scan/scan_delta.cpp, docs/performance.md): per token the forward applies the pending
// update (2 D^2), decays (D^2, not for none: the recurrence's count, though the kernel's walk of two
// tokens multiplies once for both) and reads out S'^T k and S'^T q (4 D^2), with
// 7 D for w, o and q . k and W exps; the backward is four walks, F1 (4 D^2 + decay), R1, R2 and F2
// (6 D^2 + decay each), 15 D of per-token vector work, and for gates 6 D (dg) and 3 W exps.
// The sizes one token's flops depend on (docs/spec.md section 1c): DD = Dk Dv for the state
// products, D = (Dk + Dv) / 2 for the per-token vector work and the score products (Q K^T is Dk wide,
// P V Dv wide), W the gate width (Dk for vector gates), C the chunk (shorter for a shorter sequence).
struct TokenSizes {
  double DD, D, W, C;
  double Dk, Dv, G;  // G: value heads per q/k head
};

// A form's flops per token and head, summed over the case's sequences (B of seq tokens, or the
// packed documents): flops count the tokens computed, and a short document's chunk is its length.
double sum_over_sequences(const Case& c, double (*per_token)(const Case&, const TokenSizes&)) {
  const double dk = c.dim, dv = value_dim(c);
  const double W = c.decay == "vector" ? dk : c.decay == "scalar" ? 1.0 : 0.0;
  // DeltaProduct (docs/spec.md section 1h) counts the delta rule's over the seq * n interleaved steps
  // the kernels compute, their readouts of the zero q rows included.
  const int n = householder(c);
  const auto of = [&](int length) {
    // A chunk counts rows: R of them per token for the trapezoidal rule's MIMO rank R, n per token
    // for DeltaProduct's interleaved steps.
    const int steps = length * n;
    return double(steps) * c.heads *
           per_token(c, {dk * dv, (dk + dv) / 2, W, double(std::min<long>(c.chunk, long(steps) * mimo_rank(c))), dk, dv,
                         double(c.heads) / qk_heads(c)});
  };
  const std::vector<int> docs = documents(c);
  if (docs.empty()) return c.batch * of(c.seq);
  double total = 0;
  for (int length : docs) total += of(length);
  return total;
}

// DPLR (docs/spec.md section 1f), the scan (cpu/scan/scan_dplr.cpp), per token and head: the forward's
// one walk over the state multiplies by the decay (DD, not for none), writes a_t u_t^T and k_t v_t^T
// (4 DD) and reads out o_t and u_{t+1} (4 DD), with W exps. The backward walks four times: the
// forward again without o (6 DD + decay), G and G^T in reverse (two writes and two readouts each:
// 8 DD + decay) and S^T forward (a readout before the step and one after: 8 DD + decay), 3 W exps
// and 10 D for dg's sums where gated.
double dplr_scan_token_flops(const Case& c, const TokenSizes& z) {
  const double decay = c.decay == "none" ? 0.0 : 1.0;
  const double forward = (8.0 + decay) * z.DD + z.W;
  const double backward = (30.0 + 4.0 * decay) * z.DD + 3.0 * z.W + (is_gated(c) ? 10.0 * z.D : 0.0);
  return c.mode == Mode::fwd ? forward : forward + backward;
}

// DPLR, the chunked form (cpu/chunked/chunked_dplr.cpp), per token and head with a chunk of C rows:
// the state products B^ S, Q^ S, A~^T U, K~^T V and the decay (9 DD); the four gated intra-chunk
// products' causal pairs, 2 flops a pair and channel each ((C + 1) / 2 pairs a token for q.k and
// q.a, (C - 1) / 2 for b.k and b.a: 4 C Dk); A_bk V, T Y, A_qa U and A_qk V over whole C x C
// blocks (8 C Dv); the solve (C^2 / 3); the gated operands (8 D and 3 W exps). The backward runs
// the forward over the chunks again for their entering states (without o: 7 DD + 4 C Dk + 4 C Dv +
// C^2 / 3), recomputes each chunk's products (2 DD + 4 C Dk + 4 C Dv + C^2 / 3), and adds dU, dV
// from dS (4 DD), the operands' gradients dQ^, dB^, dA~, dK~ (8 DD), the entering state's gradient
// (7 DD), the products' and their transposes' (14 C Dv), the pairs' gradients (dq, db, dk and da,
// two products each: 8 C Dk) and 16 D of per-channel work, with 2 W exps. Work the kernel does
// past the causal pairs (the vector gates' whole lane blocks within a sub-chunk) is not counted.
double dplr_chunked_token_flops(const Case& c, const TokenSizes& z) {
  const double DD = z.DD, C = z.C, Dk = z.Dk, Dv = z.Dv, D = z.D, W = z.W;
  const double forward = 9.0 * DD + 4.0 * C * Dk + 8.0 * C * Dv + C * C / 3.0 + 8.0 * D + 3.0 * W;
  const double backward = 28.0 * DD + 16.0 * C * Dk + 22.0 * C * Dv + 2.0 * C * C / 3.0 + 16.0 * D + 2.0 * W;
  return c.mode == Mode::fwd ? forward : forward + backward;
}

// The forward is 4 D^2 flops per token and head (the state update and the readout, 2 D^2 each);
// the backward's three recurrences (S for dq, G for dk and dv) add 10 D^2.
// Gated (docs/performance.md): every pass also scales its state by the gate, D^2 per token, and
// takes exp of the gates (counted one flop each, W per token: D for vector gates, 1 for scalar);
// the backward is three passes (dq on S^T, dv on G, dk on G^T: 15 D^2, the reverse two sharing one
// tile's exps) and dg from q.dq - k.dk, summed in reverse (4 D).
// Delta rule (cpu/scan/scan_delta.cpp, docs/performance.md): per token the forward applies the pending
// update (2 D^2), decays (D^2, not for none: the recurrence's count, though the kernel's walk of two
// tokens multiplies once for both) and reads out S'^T k and S'^T q (4 D^2), with
// 7 D for w, o and q . k and W exps; the backward is four walks, F1 (4 D^2 + decay), R1, R2 and F2
// (6 D^2 + decay each), 15 D of per-token vector work, and for gates 6 D (dg) and 3 W exps.
double scan_token_flops(const Case& c, const TokenSizes& z);
double chunked_token_flops(const Case& c, const TokenSizes& z);

// The trapezoidal rule (cpu/trapezoidal.cpp): the scalar-gated additive form on R rows per token
// (`inner`, the gated count of the form), plus per token the write weights and v's scaling
// (2 R Dv + 8), the token's R x R correction of the readout (2 R^2 (Dk + Dv)); the backward's
// correction (R^2 (6 Dk + 6 Dv)), and v's and the weights' gradients (3 R Dv + 12).
double trapezoidal_token_flops(const Case& c, const TokenSizes& z, double (*form)(const Case&, const TokenSizes&)) {
  Case inner = c;
  inner.options["rule"] = "additive";
  const double R = mimo_rank(c);
  const double extra = 2 * R * z.Dv + 8 + 2 * R * R * (z.Dk + z.Dv);
  const double extra_backward = R * R * (6 * z.Dk + 6 * z.Dv) + 3 * R * z.Dv + 12;
  return R * form(inner, z) + extra + (c.mode == Mode::fwd ? 0.0 : extra_backward);
}

double scan_token_flops(const Case& c, const TokenSizes& z) {
  if (is_trapezoidal(c)) return trapezoidal_token_flops(c, z, scan_token_flops);
  const double DD = z.DD, D = z.D, W = z.W;
  if (is_dplr(c)) return dplr_scan_token_flops(c, z);
  if (is_delta(c)) {
    const double decay = c.decay == "none" ? 0.0 : 1.0;
    const double forward = (6.0 + decay) * DD + 7.0 * D + W;
    const double backward = (22.0 + 4.0 * decay) * DD + 15.0 * D + (is_gated(c) ? 6.0 * D + 3.0 * W : 0.0);
    return c.mode == Mode::fwd ? forward : forward + backward;
  }
  if (!is_gated(c)) return (c.mode == Mode::fwd ? 4.0 : 14.0) * DD;
  // The bonus (docs/spec.md section 1g): q . (u . k) and its v row, 5 D; backward c = do . v, its
  // terms in dq, dk, dv and du and the bonus again, 16 D.
  const double bonus = has_bonus(c) ? 5.0 * D : 0.0, bonus_back = has_bonus(c) ? 16.0 * D : 0.0;
  const double forward = 5.0 * DD + W + bonus;
  return c.mode == Mode::fwd ? forward : forward + 15.0 * DD + 2.0 * W + 4.0 * D + bonus_back;
}

double scan_flops(const Case& c) { return sum_over_sequences(c, scan_token_flops); }

// Per token and head: 4 D^2 for the inter-chunk products (Q S and the state update K^T V) and
// 2 C D for the causal half of the intra-chunk products (Q K^T and P V over C rows); the
// backward's products are twice the forward's.
// Gated, what cpu/chunked/chunked_gated.cpp does (docs/performance.md has the derivation):
//   scalar: the same products with the causal mask exp(b_i - b_j) made per chunk (C/2 exps and
//     C/2 multiplies per token), the state scaled once per chunk (D^2 / C), 4 per token for the
//     cumulative gates and the row weights; backward 8 D^2 + 5 C D (the scores recomputed) + C
//     (the mask) + 2 D^2 / C (the state gradient's scaling and dg's rowsum(dS . S)) + 4 D (dg) + 4.
//   vector: sub-chunks of c = kGateSubChunk rows; the scores between sub-chunks as products
//     (C D (nb - 1) / nb), within a sub-chunk by hand (3 D per pair: 1.5 (c + 1) D per token),
//     12 D of gate arithmetic per token (cumulative gates, exps, scaled operands), the state's
//     rows scaled per chunk; backward: the scores again, dA, dQ and dK each with a block part
//     (C D (nb - 1) / nb + the scaled copies they read, C D (nb - 1) / (2 c nb)) and a
//     sub-chunk part by hand, P V^T, the state products (8 D^2), 30 D of elementwise gate work.
// Delta rule, the WY form of cpu/chunked/chunked_delta_forward.cpp (docs/performance.md derives each term), per
// token: the state products (K.G) S, (Q.G) S and the state update, 6 D^2 (+ D^2 / C for the decay);
// the causal halves of the scores A_qk, A_kk and of T R and A_qk W, (C + 1) D each, or for vector
// gates the scores by hand (6 D per pair: 3 (C + 1) D); the inverse T by forward substitution,
// C^2 / 3; gate and elementwise work. The backward recomputes the chunk's scores, T and W, then
// dW, T^T dW, dO W^T, dR W^T, the state-side products (dO S^T, dV S^T, W dS^T: 6 D^2) and the
// score sides, the state gradient (4 D^2), dbeta and dg.
double chunked_token_flops(const Case& c, const TokenSizes& z) {
  if (is_trapezoidal(c)) return trapezoidal_token_flops(c, z, chunked_token_flops);
  const double DD = z.DD, D = z.D, C = z.C;
  if (is_dplr(c)) return dplr_chunked_token_flops(c, z);
  if (is_delta(c)) {
    const double solve = C * C / 3.0, half = (C + 1) * D;
    double forward = 0, backward = 0;
    if (c.decay == "vector") {
      forward = 6.0 * DD + DD / C + 3.0 * half + 2.0 * half + solve + 12.0 * D;
      backward = 14.0 * DD + 3.0 * DD / C + 13.0 * half + solve + C + 25.0 * D;
    } else {
      forward = 6.0 * DD + DD / C + 2.0 * C * D + 2.0 * half + solve + C + 2.0 * D + 3.0;
      backward = 14.0 * DD + DD / C + 2.0 * C * D + 9.0 * half + solve + 2.0 * C + 6.0 * D + 5.0 +
                 (is_gated(c) ? 2.0 * DD / C + 6.0 * D : 0.0);
    }
    return c.mode == Mode::fwd ? forward : forward + backward;
  }
  // Grouped heads: the forward's Q K^T (C Dk of the 2 C D) is made once per q/k head and chunk and
  // shared by its G value heads (cpu/chunked/chunked_tiled_forward.cpp, cpu/chunked/chunked_gated.cpp's scalar gates).
  const double scores = C * (z.Dk / z.G + z.Dv);
  if (c.decay == "scalar") {
    const double forward = 4.0 * DD + scores + C + DD / C + 4.0;
    const double backward = 8.0 * DD + 5.0 * C * D + C + 2.0 * DD / C + 4.0 * D + 4.0;
    return c.mode == Mode::fwd ? forward : forward + backward;
  }
  if (c.decay == "vector") {
    const double sub = std::min<double>(kGateSubChunk, C), nb = std::ceil(C / sub), off = (nb - 1) / nb;
    const double diagonal = 1.5 * (sub + 1) * D;
    // The bonus's diagonal scores q . (u . k) (3 D); backward their dq, dk, du and dg terms (12 D).
    const double bonus = has_bonus(c) ? 3.0 * D : 0.0, bonus_back = has_bonus(c) ? 12.0 * D : 0.0;
    const double forward =
        4.0 * DD + DD / C + C * D * off + C * D * off / (2 * sub) + C * D + diagonal + 12.0 * D + bonus;
    const double backward = 8.0 * DD + 3.0 * DD / C + C * D * off * (3 + 3 / (2 * sub)) + 3.0 * C * D +
                            3.0 * diagonal + 30.0 * D + bonus_back;
    return c.mode == Mode::fwd ? forward : forward + backward;
  }
  const double forward = 4.0 * DD + 2.0 * C * D;
  return c.mode == Mode::fwd ? 4.0 * DD + scores : 4.0 * DD + scores + 2.0 * forward;
}

double chunked_flops(const Case& c) { return sum_over_sequences(c, chunked_token_flops); }

// logsigmoid(z) = -log(1 + exp(-z)), without overflow for either sign.
double log_sigmoid(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

// Whether the delta rule's keys are L2-normalised (docs/spec.md section 3; `normalize_keys`, default true).
bool normalizes_keys(const Case& c) { return is_delta(c) && c.option("normalize_keys") != "false"; }

// Each row of k divided by its L2 norm, in double (a zero row stays zero).
void normalize_rows(std::vector<float>& k, std::size_t dim) {
  for (std::size_t r = 0; r + dim <= k.size(); r += dim) {
    double sum = 0;
    for (std::size_t d = 0; d < dim; ++d) sum += double(k[r + d]) * k[r + d];
    const double inv = sum > 0 ? 1.0 / std::sqrt(sum) : 0.0;
    for (std::size_t d = 0; d < dim; ++d) k[r + d] = float(k[r + d] * inv);
  }
}

// Stream numbers of docs/spec.md section 3 (core/random.hpp): fixed for good.
TensorSet make_inputs(const Case& c, std::uint64_t seed) {
  TensorSet set;
  const struct {
    const char* name;
    Role role;
    std::vector<std::size_t> (*shape)(const Case&);
    std::uint64_t stream;
  } made[] = {{"q", Role::input, keys, 1},    {"k", Role::input, step_keys, 2},     {"v", Role::input, step_values, 3},
              {"h0", Role::input, states, 4}, {"dO", Role::cotangent, values, 5}, {"dhT", Role::cotangent, states, 6}};
  for (const auto& m : made) fill_normal(set.add(m.name, m.role, m.shape(c)).data, seed, m.stream);
  if (is_gated(c)) {
    // g = logsigmoid(z) / gate_norm, z ~ N(0, 1) (docs/spec.md section 3): log-gates <= 0.
    auto& g = set.add("g", Role::input, gates(c)).data;
    fill_normal(g, seed, 7);
    const double norm = gate_norm(c);
    for (float& x : g) x = float(log_sigmoid(double(x)) / norm);
  }
  if (is_delta(c)) {
    // beta = sigmoid(z'), z' ~ N(0, 1), stream 8; keys L2-normalised unless the case says not.
    auto& beta = set.add("beta", Role::input, betas(c)).data;
    fill_normal(beta, seed, 8);
    for (float& x : beta) x = float(1.0 / (1.0 + std::exp(-double(x))));
    if (normalizes_keys(c)) normalize_rows(set.at("k").data, std::size_t(c.dim));
  }
  if (is_dplr(c)) {
    // RWKV-7's contractive transition (docs/spec.md section 1f): b = kappa, L2-normalised (stream 10),
    // a = -(alpha . kappa) with alpha ~ U(0, 1] per channel (stream 11).
    auto& b = set.add("b", Role::input, low_rank(c)).data;
    fill_normal(b, seed, 10);
    normalize_rows(b, std::size_t(c.dim));
    auto& a = set.add("a", Role::input, low_rank(c)).data;
    fill_uniform(a, seed, 11);
    const std::vector<float>& read = set.at("b").data;  // looked up again: the add may move it
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = -a[i] * read[i];
  }
  if (is_trapezoidal(c)) {
    // dt = softplus(z), z ~ N(0, 1), stream 31: step sizes around 0.7, so that the writes weigh
    // against h0; trap ~ N(0, 1), stream 32: lambda's logits (docs/spec.md section 3).
    auto& dt = set.add("dt", Role::input, betas(c)).data;
    fill_normal(dt, seed, 31);
    for (float& x : dt) x = float(-log_sigmoid(-double(x)));
    fill_normal(set.add("trap", Role::input, betas(c)).data, seed, 32);
  }
  // RWKV-6's bonus u ~ N(0, 1), stream 30 (docs/spec.md section 3).
  if (has_bonus(c)) fill_normal(set.add("u", Role::input, bonuses(c)).data, seed, 30);
  return set;
}

// Every tensor is [sequence][head][...] with the sequence outermost (q and k over the q/k heads), and
// each pair's outputs depend on its own inputs alone (a head's decay on its index alone), so the
// first pairs of a case are a case of their own whose tensors are the first elements of its.
// Packed documents are not cut: their states are per document. The bonus's u and du are [H][Dk],
// per head: a part of the first heads of one sequence is theirs only for one sequence.
std::optional<Case> check_part(const Case& c, int pairs) {
  if (!documents(c).empty() || pairs <= 0) return std::nullopt;
  const int group = c.heads / qk_heads(c);
  Case part = c;
  if (pairs >= c.heads) {
    part.batch = std::min(c.batch, (pairs + c.heads - 1) / c.heads);
  } else {
    part.batch = 1;
    part.heads = std::min(c.heads, (pairs + group - 1) / group * group);
    if (group > 1) part.options["heads_k"] = std::to_string(part.heads / group);
    settle_shape_keys(part);
  }
  if (part.batch == c.batch && part.heads == c.heads) return std::nullopt;
  // The bonus's du sums over the batch: a part of fewer sequences has another du.
  if (has_bonus(c) && part.batch != c.batch) return std::nullopt;
  return part;
}

Reference compute_reference(const Case& c, const TensorSet& in, bool backward) {
  const Problem p = linear_problem(c);
  Reference ref;
  const auto q = widened(in, "q"), k = widened(in, "k"), v = widened(in, "v"), h0 = widened(in, "h0");
  auto& o = ref.values["o"];
  auto& hT = ref.values["hT"];
  o.assign(p.value_elems(), 0.0);
  hT.assign(p.state_elems(), 0.0);
  const std::vector<double> g = gated(p.decay) ? widened(in, "g") : std::vector<double>();
  const std::vector<double> beta = p.delta() ? widened(in, "beta") : std::vector<double>();
  const std::vector<double> u = p.bonus ? widened(in, "u") : std::vector<double>();
  const double* g_or_null = g.empty() ? nullptr : g.data();
  const double* beta_or_null = beta.empty() ? nullptr : beta.data();
  const std::vector<double> dt = p.trapezoidal() ? widened(in, "dt") : std::vector<double>();
  const std::vector<double> trap = p.trapezoidal() ? widened(in, "trap") : std::vector<double>();
  const std::vector<double> low_a = p.dplr() ? widened(in, "a") : std::vector<double>();
  const std::vector<double> low_b = p.dplr() ? widened(in, "b") : std::vector<double>();
  const double* a_or_null = low_a.empty() ? nullptr : low_a.data();
  const double* b_or_null = low_b.empty() ? nullptr : low_b.data();
  const double* u_or_null = u.empty() ? nullptr : u.data();
  ForwardArgs<double> args{q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data(), g_or_null, beta_or_null,
                           a_or_null, b_or_null};
  args.dt = dt.empty() ? nullptr : dt.data();
  args.trap = trap.empty() ? nullptr : trap.data();
  args.u = u_or_null;
  reference::forward(p, args);
  if (backward) {
    const auto dO = widened(in, "dO"), dhT = widened(in, "dhT");
    const std::size_t n = std::size_t(p.householder);  // k, v and beta rows per token
    ref.values["dq"].assign(p.key_elems(), 0.0);
    ref.values["dk"].assign(p.key_elems() * n, 0.0);
    ref.values["dv"].assign(p.value_elems() * n, 0.0);
    ref.values["dh0"].assign(p.state_elems(), 0.0);
    double *dg = nullptr, *dbeta = nullptr;
    if (!g.empty()) {
      ref.values["dg"].assign(p.gate_elems(), 0.0);
      dg = ref.values["dg"].data();
    }
    if (!beta.empty()) {
      ref.values["dbeta"].assign(p.beta_elems() * n, 0.0);
      dbeta = ref.values["dbeta"].data();
    }
    double *da = nullptr, *db = nullptr;
    if (p.dplr()) {
      ref.values["da"].assign(p.low_rank_elems(), 0.0);
      ref.values["db"].assign(p.low_rank_elems(), 0.0);
      da = ref.values["da"].data();
      db = ref.values["db"].data();
    }
    BackwardArgs<double> grads{q.data(), k.data(), v.data(), h0.data(), dO.data(), dhT.data(), ref.values["dq"].data(),
                               ref.values["dk"].data(), ref.values["dv"].data(), ref.values["dh0"].data(), g_or_null, dg,
                               beta_or_null, dbeta, a_or_null, b_or_null, da, db};
    if (p.trapezoidal()) {
      for (const char* name : {"ddt", "dtrap"}) ref.values[name].assign(p.beta_elems(), 0.0);
      grads.dt = args.dt, grads.trap = args.trap;
      grads.ddt = ref.values["ddt"].data(), grads.dtrap = ref.values["dtrap"].data();
    }
    if (!u.empty()) {
      ref.values["du"].assign(p.bonus_elems(), 0.0);
      grads.u = u_or_null, grads.du = ref.values["du"].data();
    }
    reference::backward(p, grads);
    ref.has_backward = true;
  }
  return ref;
}

// Why these values: docs/harness.md, "Tolerances".
double tolerance(const std::string& dtype) {
  if (dtype == "float32") return 1e-4;
  if (dtype == "bf16") return 3e-2;
  throw UsageError("dtype", "no tolerance known for '" + dtype + "'");
}

// gate_norm (docs/spec.md section 3): a real in (0, 1e6], only for the gated decays, so that the plan does
// not vary it and records leave it out for the others.
Axis gate_norm_axis() {
  Axis a{"gate_norm", Param::option, {"16"}, "gate strengths of the gated decays: g = logsigmoid(z) / gate_norm"};
  a.kind = Kind::real;
  a.real_lo = 0;
  a.real_hi = kMaxGateNorm;
  a.applies = is_gated;
  return a;
}

// rule (docs/spec.md sections 1b, 1e and 1f): additive, delta, trapezoidal or dplr, for every decay; it always applies, so every record
// says which rule ran.
Axis rule_axis() {
  Axis a{"rule", Param::option, {"additive"}, "update rules (additive, delta, trapezoidal, dplr)"};
  a.kind = Kind::name;
  a.choices = rule_names();
  return a;
}

// normalize_keys (docs/spec.md section 3): the delta rule's keys are L2-normalised unless false (a test
// switch: with raw keys the delta rule's state can grow without bound).
Axis normalize_keys_axis() {
  Axis a{"normalize_keys", Param::option, {"true"}, "delta rule only: L2-normalise the keys (true, false)"};
  a.kind = Kind::boolean;
  a.applies = is_delta;
  return a;
}

// mimo_rank (docs/spec.md section 1e): the trapezoidal rule's rows per token (1: SISO); records
// write it for that rule only.
Axis mimo_rank_axis() {
  Axis a{"mimo_rank", Param::option, {"1"}, "trapezoidal rule only: rows of q, k, v per token (MIMO rank; 1: SISO)", 1,
         kMaxMimoRank};
  a.applies = is_trapezoidal;
  return a;
}

// householder (docs/spec.md section 1h): DeltaProduct's writes per token, delta rule only (case_limit
// refuses n > 1 elsewhere, so the key is not dropped silently); records write it only past 1, so the
// delta rule's records compare with those written before the key.
Axis householder_axis() {
  Axis a{"householder", Param::option, {"1"}, "delta rule: Householder writes per token (DeltaProduct; 1: one)", 1, 64};
  a.recorded_at_default = false;
  return a;
}

// bonus (docs/spec.md section 1g): RWKV-6's form of GLA, for the additive rule with vector gates
// (case_limit refuses it elsewhere); records write it only when true, so the records of GLA cases
// compare with those written before.
Axis bonus_axis() {
  Axis a{"bonus", Param::option, {"false"}, "additive rule, vector decay: RWKV-6's bonus form (true, false)"};
  a.kind = Kind::boolean;
  a.recorded_at_default = false;
  return a;
}

Axis packing_axis(const char* key, const char* help, std::string (*canonical)(const std::string&)) {
  Axis a{key, Param::option, {""}, help};
  a.kind = Kind::text;
  a.canonical = canonical;
  a.recorded_at_default = false;
  return a;
}

// A packed case is one sequence of its documents' tokens (batch 1, seq their sum), whatever the
// batch and seq keys said; heads_k and dim_v equal to heads and dim are their defaults.
void settle_case(Case& c) {
  settle_shape_keys(c);
  const std::vector<int> docs = documents(c);
  if (docs.empty()) return;
  long total = 0;
  for (int length : docs) total += length;
  c.batch = 1;
  c.seq = int(total);
}

std::optional<std::string> case_limit(const Case& c) {
  const int hk = qk_heads(c);
  if (hk > c.heads || c.heads % hk != 0)
    return "heads_k " + std::to_string(hk) + " does not divide heads " + std::to_string(c.heads) +
           " (each q/k head serves heads / heads_k value heads)";
  if (!c.option("lengths").empty() && !c.option("varlen").empty())
    return "lengths and varlen both pack the batch: give one of them";
  if (is_trapezoidal(c) && c.decay != "scalar")
    return "rule trapezoidal takes decay scalar only (its alpha_t = exp(g_t) is one log-gate per token and head)";
  if (const std::string n = c.option("householder"); !n.empty() && n != "1") {
    const std::string rule = c.option("rule").empty() ? "additive" : c.option("rule");
    if (rule != "delta")
      return "householder " + n + " applies to rule delta only (DeltaProduct's writes per token); rule " + rule +
             " writes once per token";
    if (c.decay != "none" && c.decay != "scalar" && c.decay != "vector")
      return "householder " + n + " takes decay none, scalar or vector (the gate acts once per token; decay " +
             c.decay + " would act at every write)";
  }
  if (c.option("bonus") == "true" && !bonus_applies(c))
    return "bonus true (RWKV-6's form) applies to rule additive with decay vector only, not rule " +
           (c.option("rule").empty() ? std::string("additive") : c.option("rule")) + " with decay " + c.decay;
  return std::nullopt;
}

// A packed case's records name how many documents it packs (their lengths are its lengths or
// varlen key).
std::vector<std::pair<std::string, long>> extra_identity(const Case& c) {
  const std::size_t docs = documents(c).size();
  if (docs == 0) return {};
  return {{"documents", long(docs)}};
}

}  // namespace

namespace {

std::vector<std::string>& mutable_decay_names() {
  static std::vector<std::string> names = {"none", "retnet", "scalar", "vector"};
  return names;
}

// The gammas of the decays add_fixed_decay added, in order, from Decay::vector + 1 on.
std::vector<double (*)(int)>& added_gammas() {
  static std::vector<double (*)(int)> gammas;
  return gammas;
}

}  // namespace

const std::vector<std::string>& decay_names() { return mutable_decay_names(); }

Decay add_fixed_decay(const std::string& name, double (*gamma)(int head)) {
  std::vector<std::string>& names = mutable_decay_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return Decay(i);
  names.push_back(name);
  added_gammas().push_back(gamma);
  return Decay(names.size() - 1);
}

double fixed_decay_gamma(Decay decay, int head) {
  const std::size_t index = std::size_t(decay) - std::size_t(Decay::vector) - 1;
  if (decay <= Decay::vector || index >= added_gammas().size())
    throw std::logic_error("decay " + std::to_string(int(decay)) + " was not added by add_fixed_decay");
  return added_gammas()[index](head);
}

std::string to_string(Decay decay) { return decay_names()[std::size_t(decay)]; }

const std::vector<std::string>& rule_names() {
  static const std::vector<std::string> names = {"additive", "delta", "trapezoidal", "dplr"};
  return names;
}

std::string to_string(Rule rule) { return rule_names()[std::size_t(rule)]; }

Rule rule_from(const std::string& name) {
  for (std::size_t i = 0; i < rule_names().size(); ++i)
    if (rule_names()[i] == name) return Rule(i);
  throw RuntimeFailure("no rule '" + name + "'");
}

Decay decay_from(const std::string& name) {
  for (std::size_t i = 0; i < decay_names().size(); ++i)
    if (decay_names()[i] == name) return Decay(i);
  throw RuntimeFailure("no decay '" + name + "'");
}

int qk_heads(const Case& c) {
  const std::string text = c.option("heads_k");
  const int hk = text.empty() ? 0 : std::stoi(text);
  return hk > 0 ? hk : c.heads;
}

int mimo_rank(const Case& c) {
  if (!is_trapezoidal(c)) return 1;
  const std::string text = c.option("mimo_rank");
  return text.empty() ? 1 : std::max(1, std::stoi(text));
}

int value_dim(const Case& c) {
  const std::string text = c.option("dim_v");
  const int dv = text.empty() ? 0 : std::stoi(text);
  return dv > 0 ? dv : c.dim;
}

Axis heads_k_axis(long max_heads) {
  Axis a{"heads_k", Param::option, {"0"}, "q/k heads (grouped heads: heads % heads_k == 0; 0: as many as heads)", 0,
         max_heads};
  a.recorded_at_default = false;
  return a;
}

Axis dim_v_axis(long max_dim) {
  Axis a{"dim_v", Param::option, {"0"}, "value head dims (the state is dim x dim_v; 0: as dim)", 0, max_dim};
  a.recorded_at_default = false;
  return a;
}

void settle_shape_keys(Case& c) {
  if (qk_heads(c) == c.heads && c.options.count("heads_k")) c.options["heads_k"] = "0";
  if (value_dim(c) == c.dim && c.options.count("dim_v")) c.options["dim_v"] = "0";
}

Problem linear_problem(const Case& c) {
  const std::string rule = c.option("rule");
  Problem p{c.batch, c.heads, c.seq, c.dim, c.chunk, decay_from(c.decay), rule.empty() ? Rule::additive : rule_from(rule)};
  p.heads_k = qk_heads(c) == c.heads ? 0 : qk_heads(c);
  p.dim_v = value_dim(c) == c.dim ? 0 : value_dim(c);
  p.rank = mimo_rank(c);
  p.bonus = has_bonus(c);
  p.householder = householder(c);
  const std::vector<int> docs = documents(c);
  if (!docs.empty()) {
    p.cu_seqlens = {0};
    for (int length : docs) p.cu_seqlens.push_back(p.cu_seqlens.back() + length);
  }
  return p;
}

LinearTensors bind_linear_tensors(const Case& c, const std::function<void*(const std::string&)>& data) {
  const auto get = [&](const char* name) -> void* {
    for (const TensorSpec& spec : c.op->tensors)
      if (spec.name == name) return spec.in(c) ? data(name) : nullptr;
    return nullptr;
  };
  const auto floats = [&](const char* name) { return static_cast<float*>(get(name)); };
  LinearTensors t;
  t.q = get("q"), t.k = get("k"), t.v = get("v"), t.dO = get("dO");
  t.h0 = floats("h0"), t.o = floats("o"), t.hT = floats("hT"), t.g = floats("g"), t.beta = floats("beta");
  t.dhT = floats("dhT"), t.dq = floats("dq"), t.dk = floats("dk"), t.dv = floats("dv"), t.dh0 = floats("dh0");
  t.dg = floats("dg"), t.dbeta = floats("dbeta");
  t.a = floats("a"), t.b = floats("b"), t.da = floats("da"), t.db = floats("db");
  t.dt = floats("dt"), t.trap = floats("trap"), t.ddt = floats("ddt"), t.dtrap = floats("dtrap");
  t.u = floats("u"), t.du = floats("du");
  return t;
}

ForwardArgs<float> cpu_forward_args(const LinearTensors& t) {
  const auto f = [](void* p) { return static_cast<const float*>(p); };
  ForwardArgs<float> a{f(t.q), f(t.k), f(t.v), t.h0, t.o, t.hT, t.g, t.beta, t.a, t.b};
  a.dt = t.dt, a.trap = t.trap, a.u = t.u;
  return a;
}

BackwardArgs<float> cpu_backward_args(const LinearTensors& t) {
  const auto f = [](void* p) { return static_cast<const float*>(p); };
  BackwardArgs<float> a{f(t.q), f(t.k), f(t.v), t.h0, f(t.dO), t.dhT, t.dq, t.dk, t.dv, t.dh0, t.g, t.dg, t.beta, t.dbeta,
                        t.a, t.b, t.da, t.db};
  a.dt = t.dt, a.trap = t.trap, a.ddt = t.ddt, a.dtrap = t.dtrap;
  a.u = t.u, a.du = t.du;
  return a;
}

const Op& linear_attention_op() {
  static const Op op = [] {
    Op o;
    o.name = "linear_attention";
    o.suite = "kernel";
    // The plan's order: dim outside seq, mode outside impl, as the reference results file has
    // them; the cases that share inputs and a reference come one after another.
    o.axes = {
        {"batch", Param::batch, {"2"}, "batch sizes", 1, kMaxBatch},
        {"heads", Param::heads, {"4"}, "head counts", 1, kMaxHeads},
        {"chunk", Param::chunk, {"128"}, "chunk sizes of the chunked form", 1, kMaxChunk},
        {"decay", Param::decay, {"none"}, "decay modes (none, retnet, scalar, vector)", 1, 0, decay_names()},
        rule_axis(),
        gate_norm_axis(),
        normalize_keys_axis(),
        mimo_rank_axis(),
        householder_axis(),
        bonus_axis(),
        heads_k_axis(kMaxHeads),
        dim_v_axis(kMaxDim),
        packing_axis("lengths", "a packed batch's document lengths, one value as \"7000 1000 192\" (sets batch 1, seq their sum)",
                     canonical_lengths),
        packing_axis("varlen", "a packed batch drawn: \"TOKENS MIN MAX [uniform|log] [SEED]\" (sets batch 1, seq TOKENS)",
                     canonical_varlen),
        {"dim", Param::dim, {"32", "64", "128"}, "head dims of the kernel suite", 1, kMaxDim},
        {"seq", Param::seq, {"512", "2048", "8192"}, "sequence lengths", 1, kMaxSeq},
        {"mode", Param::mode, {"fwd", "fwd_bwd"}, "modes (fwd, fwd_bwd)"},
        {"impl", Param::impl, {"scan", "chunked"}, "impls (scan, chunked)"},
        cache_axis("warm"),
    };
    o.forms = {{"scan", scan_flops}, {"chunked", chunked_flops}};
    o.tensors = {
        {"q", Role::input, keys, true},         {"k", Role::input, step_keys, true},
        {"v", Role::input, step_values, true},  {"h0", Role::input, states, false},
        {"dO", Role::cotangent, values, true},  {"dhT", Role::cotangent, states, false},
        {"o", Role::output, values, false},     {"hT", Role::output, states, false},
        {"dq", Role::gradient, keys, false},    {"dk", Role::gradient, step_keys, false},
        {"dv", Role::gradient, step_values, false}, {"dh0", Role::gradient, states, false},
        {"g", Role::input, gates, false, is_gated},  {"dg", Role::gradient, gates, false, is_gated},
        {"beta", Role::input, betas, false, is_delta}, {"dbeta", Role::gradient, betas, false, is_delta},
        {"a", Role::input, low_rank, false, is_dplr},  {"b", Role::input, low_rank, false, is_dplr},
        {"da", Role::gradient, low_rank, false, is_dplr}, {"db", Role::gradient, low_rank, false, is_dplr},
        {"dt", Role::input, betas, false, is_trapezoidal}, {"trap", Role::input, betas, false, is_trapezoidal},
        {"ddt", Role::gradient, betas, false, is_trapezoidal}, {"dtrap", Role::gradient, betas, false, is_trapezoidal},
        {"u", Role::input, bonuses, false, has_bonus}, {"du", Role::gradient, bonuses, false, has_bonus},
    };
    o.make_inputs = make_inputs;
    o.reference = compute_reference;
    o.tolerance = tolerance;
    o.settle = settle_case;
    o.limit = case_limit;
    o.extra_identity = extra_identity;
    o.check_part = check_part;
    return o;
  }();
  return op;
}

}  // namespace lattn

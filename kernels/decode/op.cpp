// The decode step (docs/spec.md section 1d) as a table row: the decode suite's keys, its one form and its
// flop and byte models, the tensors, the inputs (docs/spec.md section 3, the same streams as the
// linear-attention op's, so that a decode case and a kernel case of seq = tokens draw the same
// values), the float64 reference (reference.cpp) and the tolerances. The kernels are cpu.cpp
// and cuda.cu beside this file.
#include "kernels/decode/op.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/random.hpp"
#include "kernels/decode/reference.hpp"
#include "kernels/linear_attention/op.hpp"

namespace lattn {
namespace {

// Sizes beyond these are refused when the config is read. A step verifies at most a draft of a few
// tokens; 64 leaves room for long drafts.
constexpr long kMaxSlots = 1 << 20, kMaxBatch = 4096, kMaxHeads = 4096, kMaxTokens = 64, kMaxDim = 1024, kMaxSnapshots = 64;

using token_shapes::betas;
using token_shapes::householder;
using token_shapes::keys;
using token_shapes::step_keys;
using token_shapes::step_values;
using token_shapes::values;
// The trapezoidal rule's previous token's rows per value head: [B][H][R][Dk] and [B][H][R][Dv].
std::vector<std::size_t> carry_keys(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(mimo_rank(c)), std::size_t(c.dim)};
}
std::vector<std::size_t> carry_values(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(mimo_rank(c)), std::size_t(value_dim(c))};
}
std::vector<std::size_t> states(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.dim), std::size_t(value_dim(c))};
}
std::vector<std::size_t> snapshot_slots(const Case& c) {
  const DecodeProblem p = decode_problem(c);
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(p.extra_slots()), std::size_t(c.dim),
          std::size_t(value_dim(c))};
}
std::vector<std::size_t> gates(const Case& c) {
  std::vector<std::size_t> shape = {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq)};
  if (c.decay == "vector") shape.push_back(std::size_t(c.dim));
  return shape;
}
bool is_gated(const Case& c) { return c.decay == "scalar" || c.decay == "vector"; }
bool is_delta(const Case& c) { return c.option("rule") == "delta"; }
// dt and trap (rule trapezoidal): [B][H][T].
std::vector<std::size_t> per_token(const Case& c) { return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq)}; }
bool is_trapezoidal(const Case& c) { return c.option("rule") == "trapezoidal"; }
bool is_dplr(const Case& c) { return c.option("rule") == "dplr"; }
// dplr's a and b (docs/spec.md section 1f): [B][H][T][Dk].
std::vector<std::size_t> low_rank(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq), std::size_t(c.dim)};
}
// RWKV-6's bonus form (docs/spec.md section 1g): the additive rule with vector gates; u [H][Dk].
bool bonus_applies(const Case& c) {
  const std::string rule = c.option("rule");
  return (rule.empty() || rule == "additive") && c.decay == "vector";
}
bool has_bonus(const Case& c) { return bonus_applies(c) && c.option("bonus") == "true"; }
std::vector<std::size_t> bonuses(const Case& c) { return {std::size_t(c.heads), std::size_t(c.dim)}; }
bool has_snapshots(const Case& c) { return decode_problem(c).extra_slots() > 0; }
bool is_pooled(const Case& c) { return decode_problem(c).pooled(); }
std::vector<std::size_t> sequences(const Case& c) { return {std::size_t(c.batch)}; }

// Per token and value head, what cpu.cpp does, with DD = Dk Dv the state's size: additive, the
// decayed update and the readout (4 DD, DD more for a decay); delta, the two readouts of the decayed
// state (4 DD, the decay folded into their row weights) and the update with its decay (2 DD, DD more
// for a decay), 6 D for the row weights and w, o (D = (Dk + Dv) / 2, as the kernel suite counts the
// per-token vector work); and W exps for the gates (Dk for vector gates, 1 for scalar).
// Trapezoidal (cpu/trapezoidal.cpp), R rows per token: the decay (DD), the 2 R rank-one writes of
// the previous and the current token (4 R DD) and the R readouts (2 R DD), and per token the row
// weights (2 R Dk) and 8 for the exps and weights.
double step_flops(const Case& c) {
  const double Dk = c.dim, Dv = value_dim(c), DD = Dk * Dv, tokens = double(c.batch) * c.heads * c.seq;
  const double decay = c.decay == "none" ? 0.0 : 1.0;
  const double W = c.decay == "vector" ? Dk : c.decay == "scalar" ? 1.0 : 0.0;
  if (is_trapezoidal(c)) {
    const double R = mimo_rank(c);
    return tokens * ((6.0 * R + 1.0) * DD + 2.0 * R * Dk + 8.0);
  }
  // DeltaProduct: the delta rule's per write, n writes per token (the CPU step walks them as tokens).
  if (is_delta(c)) return tokens * householder(c) * ((6.0 + decay) * DD + 3.0 * (Dk + Dv) + W);
  // dplr (cpu/dplr.cpp): the read u = S^T b (2 DD), the two writes (4 DD), the readout (2 DD) and
  // the decay (DD, none for none).
  if (is_dplr(c)) return tokens * ((8.0 + decay) * DD + W);
  // The bonus: q . (u . k) (3 Dk) and its v row (2 Dv).
  return tokens * ((4.0 + decay) * DD + W + (has_bonus(c) ? 3.0 * Dk + 2.0 * Dv : 0.0));
}

double log_sigmoid(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

// Stream numbers of docs/spec.md section 3, as the linear-attention op draws them.
TensorSet make_inputs(const Case& c, std::uint64_t seed) {
  TensorSet set;
  fill_normal(set.add("q", Role::input, keys(c)).data, seed, 1);
  fill_normal(set.add("k", Role::input, step_keys(c)).data, seed, 2);
  fill_normal(set.add("v", Role::input, step_values(c)).data, seed, 3);
  auto& h0 = set.add("h0", Role::input, states(c)).data;
  fill_normal(h0, seed, 4);
  // A bf16 state starts from h0 as the pool holds it: rounded to bf16 before any backend or the
  // reference sees it, so that the check measures the step's own rounding.
  if (decode_problem(c).state_bf16)
    for (float& x : h0) x = bf16_bits_to_float(float_to_bf16_bits(x));
  if (decode_problem(c).pooled()) {
    // Sequence b's slot: the first `batch` of a seeded shuffle of the pool's slots (stream 9), as
    // continuous batching leaves them, neither sorted nor together. Slot numbers as floats: exact
    // below 2^24, far above the largest pool.
    const int slots = decode_problem(c).state_slots;
    std::vector<float> draws(static_cast<std::size_t>(slots));
    fill_uniform(draws, seed, 9);
    std::vector<int> order(static_cast<std::size_t>(slots));
    for (int i = 0; i < slots; ++i) order[std::size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return draws[std::size_t(a)] < draws[std::size_t(b)]; });
    auto& index = set.add("state_index", Role::input, sequences(c)).data;
    for (std::size_t b = 0; b < index.size(); ++b) index[b] = float(order[b]);
  }
  if (is_gated(c)) {
    // g = logsigmoid(z) / 16 (docs/spec.md section 3's default gate_norm): log-gates <= 0.
    auto& g = set.add("g", Role::input, gates(c)).data;
    fill_normal(g, seed, 7);
    for (float& x : g) x = float(log_sigmoid(double(x)) / 16.0);
  }
  if (is_delta(c)) {
    // beta = sigmoid(z'), stream 8; each key row divided by its L2 norm (docs/spec.md section 3).
    auto& beta = set.add("beta", Role::input, betas(c)).data;
    fill_normal(beta, seed, 8);
    for (float& x : beta) x = float(1.0 / (1.0 + std::exp(-double(x))));
    // Looked up now, not held from its add: each add may move the set's tensors.
    std::vector<float>& k = set.at("k").data;
    const std::size_t dim = std::size_t(c.dim);
    for (std::size_t r = 0; r + dim <= k.size(); r += dim) {
      double sum = 0;
      for (std::size_t d = 0; d < dim; ++d) sum += double(k[r + d]) * k[r + d];
      const double inv = sum > 0 ? 1.0 / std::sqrt(sum) : 0.0;
      for (std::size_t d = 0; d < dim; ++d) k[r + d] = float(k[r + d] * inv);
    }
  }
  if (is_trapezoidal(c)) {
    // As the kernel suite draws them (docs/spec.md section 1e): dt = softplus(z) (stream 31), trap
    // ~ N(0, 1) (32); the previous token's rows ~ N(0, 1) (33, 34).
    auto& dt = set.add("dt", Role::input, per_token(c)).data;
    fill_normal(dt, seed, 31);
    for (float& x : dt) x = float(std::log1p(std::exp(double(x))));
    fill_normal(set.add("trap", Role::input, per_token(c)).data, seed, 32);
    fill_normal(set.add("k_prev", Role::input, carry_keys(c)).data, seed, 33);
    fill_normal(set.add("v_prev", Role::input, carry_values(c)).data, seed, 34);
  }
  if (is_dplr(c)) {
    // As the kernel suite draws them (docs/spec.md section 1f): b = kappa / |kappa| (stream 10),
    // a = -(alpha . b), alpha ~ U(0, 1] (stream 11).
    auto& b = set.add("b", Role::input, low_rank(c)).data;
    fill_normal(b, seed, 10);
    const std::size_t dim = std::size_t(c.dim);
    for (std::size_t r = 0; r + dim <= b.size(); r += dim) {
      double sum = 0;
      for (std::size_t d = 0; d < dim; ++d) sum += double(b[r + d]) * b[r + d];
      const double inv = sum > 0 ? 1.0 / std::sqrt(sum) : 0.0;
      for (std::size_t d = 0; d < dim; ++d) b[r + d] = float(b[r + d] * inv);
    }
    auto& a = set.add("a", Role::input, low_rank(c)).data;
    fill_uniform(a, seed, 11);
    const std::vector<float>& read = set.at("b").data;  // looked up again: the add may move it
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = -a[i] * read[i];
  }
  // RWKV-6's bonus u ~ N(0, 1), stream 30, as the kernel suite draws it.
  if (has_bonus(c)) fill_normal(set.add("u", Role::input, bonuses(c)).data, seed, 30);
  return set;
}

Reference compute_reference(const Case& c, const TensorSet& in, bool) {
  const DecodeProblem p = decode_problem(c);
  Reference ref;
  const auto q = widened(in, "q"), k = widened(in, "k"), v = widened(in, "v"), h0 = widened(in, "h0");
  const std::vector<double> g = gated(p.decay) ? widened(in, "g") : std::vector<double>();
  const std::vector<double> beta = p.delta() ? widened(in, "beta") : std::vector<double>();
  const std::vector<double> low_a = p.dplr() ? widened(in, "a") : std::vector<double>();
  const std::vector<double> low_b = p.dplr() ? widened(in, "b") : std::vector<double>();
  const std::vector<double> u = p.bonus ? widened(in, "u") : std::vector<double>();
  auto& o = ref.values["o"];
  auto& hT = ref.values["hT"];
  o.assign(p.value_elems(), 0.0);
  hT = h0;
  std::vector<double>* snapshots = nullptr;
  if (p.extra_slots() > 0) {
    snapshots = &ref.values["snapshots"];
    snapshots->assign(p.snapshot_elems(), 0.0);
  }
  DecodeArgs<double, double> args{q.data(), k.data(), v.data(), hT.data(), o.data(), g.empty() ? nullptr : g.data(),
                                  beta.empty() ? nullptr : beta.data(), snapshots ? snapshots->data() : nullptr};
  std::vector<double> dt, trap, k_prev, v_prev;
  if (p.trapezoidal()) {
    dt = widened(in, "dt"), trap = widened(in, "trap"), k_prev = widened(in, "k_prev"), v_prev = widened(in, "v_prev");
    ref.values["k_last"].assign(p.carry_k_elems(), 0.0);
    ref.values["v_last"].assign(p.carry_v_elems(), 0.0);
    args.dt = dt.data(), args.trap = trap.data(), args.k_prev = k_prev.data(), args.v_prev = v_prev.data();
    args.k_last = ref.values["k_last"].data(), args.v_last = ref.values["v_last"].data();
  }
  args.a = low_a.empty() ? nullptr : low_a.data();
  args.b = low_b.empty() ? nullptr : low_b.data();
  args.u = u.empty() ? nullptr : u.data();
  reference::decode_step(p, args);
  return ref;
}

Axis rule_axis() {
  Axis a{"rule", Param::option, {"delta"}, "update rules (additive, delta, trapezoidal, dplr)"};
  a.kind = Kind::name;
  a.choices = rule_names();
  return a;
}

// The trapezoidal rule's rows per token (docs/spec.md section 1e), as the kernel suite's key.
Axis mimo_rank_axis() {
  Axis a{"mimo_rank", Param::option, {"1"}, "trapezoidal rule only: rows of q, k, v per token (MIMO rank; 1: SISO)", 1, 16};
  a.applies = is_trapezoidal;
  return a;
}

// bonus (docs/spec.md section 1g): RWKV-6's form, additive rule with vector gates (case_limit refuses it
// elsewhere); recorded only when true.
Axis bonus_axis() {
  Axis a{"bonus", Param::option, {"false"}, "additive rule, vector decay: RWKV-6's bonus form (true, false)"};
  a.kind = Kind::boolean;
  a.recorded_at_default = false;
  return a;
}

// householder (docs/spec.md section 1h): DeltaProduct's writes per token, delta rule only (case_limit
// refuses n > 1 elsewhere); recorded only past 1.
Axis householder_axis() {
  Axis a{"householder", Param::option, {"1"}, "delta rule: Householder writes per token (DeltaProduct; 1: one)", 1, 64};
  a.recorded_at_default = false;
  return a;
}

Axis state_slots_axis() {
  Axis a{"state_slots", Param::option, {"0"},
         "slots of the state pool the batch's states are gathered from (0: none, the states contiguous)", 0, kMaxSlots};
  a.recorded_at_default = false;
  return a;
}

Axis state_dtype_axis() {
  Axis a{"state_dtype", Param::option, {"float32"}, "how the states are stored: float32 or bf16 (stepped in float32)",
         1, 0, {"float32", "bf16"}};
  a.kind = Kind::name;
  a.recorded_at_default = false;
  return a;
}

// A bf16 state's tolerance (docs/spec.md section 1d, "A bf16 state"): the float32 step's, plus the
// one rounding of the new state to bf16, at most u = 2^-8 of each element (8 significant bits, to
// nearest) and so at most 2^-8 of hT's norm.
double case_tolerance(const Case& c) {
  const double base = linear_attention_op().tolerance(c.dtype);
  return decode_problem(c).state_bf16 ? base + std::ldexp(1.0, -8) : base;
}

Axis snapshots_axis() {
  Axis a{"snapshots", Param::option, {"1"}, "states kept per step for rolling back a draft: the last K (slot 0 the new state)",
         1, kMaxSnapshots};
  a.kind = Kind::integer;
  return a;
}

std::optional<std::string> case_limit(const Case& c) {
  const DecodeProblem p = decode_problem(c);
  if (p.trapezoidal() && p.decay != Decay::scalar)
    return "rule trapezoidal takes decay scalar only, not " + c.decay;
  if (p.trapezoidal() && (p.pooled() || p.state_bf16))
    return std::string("rule trapezoidal steps float32 states in place only (no state_slots pool, no bf16 state: "
                       "the previous token's rows have neither)");
  if (p.state_slots > 0 && p.state_slots < p.batch)
    return "state_slots " + std::to_string(p.state_slots) + " is below batch " + std::to_string(p.batch) +
           " (the pool holds one slot per sequence stepped)";
  const int hk = qk_heads(c);
  if (hk > c.heads || c.heads % hk != 0)
    return "heads_k " + std::to_string(hk) + " does not divide heads " + std::to_string(c.heads) +
           " (each q/k head serves heads / heads_k value heads)";
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

// Records name the step's tokens as `tokens` beside the shared `seq`.
std::vector<std::pair<std::string, long>> identity(const Case& c) { return {{"tokens", c.seq}}; }

}  // namespace

DecodeProblem decode_problem(const Case& c) {
  const std::string rule = c.option("rule"), kept = c.option("snapshots"), slots = c.option("state_slots");
  DecodeProblem p{c.batch,
                  c.heads,
                  c.seq,
                  c.dim,
                  kept.empty() ? 1 : std::stoi(kept),
                  decay_from(c.decay),
                  rule.empty() ? Rule::additive : rule_from(rule),
                  qk_heads(c),
                  value_dim(c)};
  p.state_slots = slots.empty() ? 0 : std::stoi(slots);
  p.state_bf16 = c.option("state_dtype") == "bf16";
  p.rank = mimo_rank(c);
  p.bonus = has_bonus(c);
  p.householder = householder(c);
  return p;
}

double decode_step_bytes(const Case& c) {
  const DecodeProblem p = decode_problem(c);
  const double token_bytes = c.dtype == "bf16" ? 2.0 : 4.0;
  // The states read and written in their own dtype (the batch's slots of a pool, and its index);
  // q and k once per q/k head (its value heads read them where they lie), v and o per value head.
  const double state_bytes = p.state_bf16 ? 2.0 : 4.0;
  // DeltaProduct: k, v and beta n rows per token.
  const double n = p.householder;
  return state_bytes * 2.0 * double(p.state_elems()) + 4.0 * double(p.snapshot_elems()) +
         (p.pooled() ? 4.0 * p.batch : 0.0) +
         (1.0 + n) * token_bytes * double(p.key_elems()) + double(p.value_elems()) * (n * token_bytes + 4.0) +
         4.0 * double(p.gate_elems()) + (p.delta() ? 4.0 * n * double(p.beta_elems()) : 0.0) +
         // trapezoidal: the previous token's rows read and the last token's written (float32), dt and trap
         (p.trapezoidal() ? 8.0 * double(p.carry_k_elems() + p.carry_v_elems()) + 8.0 * double(p.beta_elems()) : 0.0) +
         // dplr: a and b read (float32)
         (p.dplr() ? 8.0 * double(p.low_rank_elems()) : 0.0) +
         (p.bonus ? 4.0 * p.heads * p.dim : 0.0);  // u, once per step
}

const Op& decode_op() {
  static const Op op = [] {
    Op o;
    o.name = "decode";
    o.suite = "decode";
    o.axes = {
        {"batch", Param::batch, {"1", "16", "64", "256"}, "sequences stepped together", 1, kMaxBatch},
        {"heads", Param::heads, {"16"}, "head counts (value heads: one state each)", 1, kMaxHeads},
        heads_k_axis(kMaxHeads),
        {"dim", Param::dim, {"128"}, "key head dims (the state is dim x dim_v per value head)", 1, kMaxDim},
        dim_v_axis(kMaxDim),
        rule_axis(),
        mimo_rank_axis(),
        {"decay", Param::decay, {"scalar"}, "decay modes (none, retnet, scalar, vector)", 1, 0, decay_names()},
        householder_axis(),
        bonus_axis(),
        {"tokens", Param::seq, {"1", "4"}, "tokens per sequence in one step (1: decoding; 2-8: verifying a draft)", 1,
         kMaxTokens},
        snapshots_axis(),
        state_slots_axis(),
        state_dtype_axis(),
        cache_axis("cold"),
        {"impl", Param::impl, {"step"}, "impls (step)"},
    };
    o.forms = {{"step", step_flops}};
    o.tensors = {
        {"q", Role::input, keys, true},
        {"k", Role::input, step_keys, true},
        {"v", Role::input, step_values, true},
        {"h0", Role::input, states, false},
        {"g", Role::input, gates, false, is_gated},
        {"beta", Role::input, betas, false, is_delta},
        {"a", Role::input, low_rank, false, is_dplr},
        {"b", Role::input, low_rank, false, is_dplr},
        {"dt", Role::input, per_token, false, is_trapezoidal},
        {"trap", Role::input, per_token, false, is_trapezoidal},
        {"k_prev", Role::input, carry_keys, false, is_trapezoidal},
        {"v_prev", Role::input, carry_values, false, is_trapezoidal},
        {"u", Role::input, bonuses, false, has_bonus},
        {"state_index", Role::input, sequences, false, is_pooled},
        {"o", Role::output, values, false},
        {"hT", Role::output, states, false},
        {"snapshots", Role::output, snapshot_slots, false, has_snapshots},
        {"k_last", Role::output, carry_keys, false, is_trapezoidal},
        {"v_last", Role::output, carry_values, false, is_trapezoidal},
    };
    o.make_inputs = make_inputs;
    o.reference = compute_reference;
    // The linear-attention op's tolerances (docs/harness.md, "Tolerances"): a step is its recurrence.
    o.tolerance = linear_attention_op().tolerance;
    o.case_tolerance = case_tolerance;
    // The shape keys of docs/spec.md section 1c, as the kernel suite takes them (linear_attention/op.hpp).
    o.settle = settle_shape_keys;
    o.limit = case_limit;
    o.extra_identity = identity;
    o.bytes = decode_step_bytes;
    return o;
  }();
  return op;
}

}  // namespace lattn

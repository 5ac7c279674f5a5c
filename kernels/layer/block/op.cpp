// The modern block's part of the layer suite's row (block/op.hpp). The block itself is block.hpp.
#include "kernels/layer/block/op.hpp"

#include <cmath>
#include <map>

#include "core/random.hpp"
#include "kernels/layer/block/mamba3.hpp"
#include "kernels/layer/block/reference.hpp"
#include "kernels/layer/block/rwkv7_op.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/op.hpp"

namespace lattn {
namespace {

constexpr long kMaxRank = 8192;  // the conv's limit is block::kMaxConv

std::size_t width(const Case& c) { return std::size_t(c.heads) * std::size_t(c.dim); }
int option_int(const Case& c, const char* key, int fallback) {
  const std::string text = c.option(key);
  return text.empty() ? fallback : std::stoi(text);
}
std::string option_or(const Case& c, const char* key, const char* fallback) {
  const std::string text = c.option(key);
  return text.empty() ? fallback : text;
}
bool is_delta(const Case& c) { return c.option("rule") == "delta"; }
bool is_mamba3(const Case& c) { return c.option("rule") == "trapezoidal"; }  // block/mamba3.hpp
bool is_gated(const Case& c) { return c.decay == "scalar" || c.decay == "vector"; }
bool projected(const Case& c) { return option_or(c, "gates", "input") == "projected"; }
bool has_conv(const Case& c) { return option_int(c, "short_conv", 0) > 0; }
bool norm_gate(const Case& c) { return option_or(c, "output_gate", "gate") == "norm"; }
bool input_g(const Case& c) { return !projected(c) && is_gated(c) && !rwkv7_block(c); }
bool input_beta(const Case& c) { return !projected(c) && is_delta(c); }
bool proj_scalar(const Case& c) { return projected(c) && c.decay != "vector"; }
bool proj_vector(const Case& c) { return projected(c) && c.decay == "vector"; }
bool proj_delta(const Case& c) { return projected(c) && is_delta(c); }
bool mamba(const Case& c) { return projected(c) && !is_delta(c); }
bool has_a_log(const Case& c) { return projected(c) && !is_mamba3(c); }  // Mamba-3's A is made from x
bool has_wz(const Case& c) { return norm_gate(c) || is_mamba3(c); }
int bc_groups(const Case& c) { return option_int(c, "bc_groups", 1); }
double rope_fraction(const Case& c) { return option_or(c, "rope_fraction", "0.5") == std::string("1") ? 1.0 : 0.5; }
int rope_angles(const Case& c) { return block::mamba3::rope_angles(c.dim, rope_fraction(c)); }
int rank(const Case& c) { return option_int(c, "gate_rank", 64); }

std::vector<std::size_t> conv_shape(const Case& c) { return {3 * width(c), std::size_t(option_int(c, "short_conv", 0))}; }
std::vector<std::size_t> square(const Case& c) { return {width(c), width(c)}; }
std::vector<std::size_t> to_heads(const Case& c) { return {width(c), std::size_t(c.heads)}; }
std::vector<std::size_t> to_rank(const Case& c) { return {width(c), std::size_t(rank(c))}; }
std::vector<std::size_t> from_rank(const Case& c) { return {std::size_t(rank(c)), width(c)}; }
std::vector<std::size_t> per_head(const Case& c) { return {std::size_t(c.heads)}; }
std::vector<std::size_t> bias_shape(const Case& c) { return {c.decay == "vector" ? width(c) : std::size_t(c.heads)}; }
std::vector<std::size_t> gate_shape(const Case& c) {
  std::vector<std::size_t> shape = {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq)};
  if (c.decay == "vector") shape.push_back(std::size_t(c.dim));
  return shape;
}
std::vector<std::size_t> to_angles(const Case& c) { return {width(c), std::size_t(rope_angles(c))}; }
std::vector<std::size_t> head_channels(const Case& c) { return {std::size_t(c.heads), std::size_t(c.dim)}; }
std::vector<std::size_t> state_rows(const Case& c) { return {std::size_t(c.dim)}; }
std::vector<std::size_t> beta_shape(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq)};
}

Axis named(const char* key, const char* fallback, std::vector<std::string> choices, const char* help) {
  Axis a{key, Param::option, {fallback}, help};
  a.kind = Kind::name;
  a.choices = std::move(choices);
  return a;
}

// u = Phi(z) for z ~ N(0, 1) is U[0, 1): uniform draws from the normal streams.
void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream, double lo, double hi,
                  double (*map)(double)) {
  fill_normal(out, seed, stream);
  for (float& x : out) x = float(map(lo + (hi - lo) * 0.5 * std::erfc(-double(x) / std::sqrt(2.0))));
}
double log_sigmoid(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

}  // namespace

LayerBlock layer_block(const Case& c) {
  LayerBlock b;
  b.short_conv = option_int(c, "short_conv", 0);
  b.projected_gates = projected(c);
  b.norm_gate = norm_gate(c);
  b.window = option_or(c, "attention", "swa") == "swa";
  b.gate_rank = proj_vector(c) ? rank(c) : 0;
  if (rwkv7_block(c)) add_rwkv7_block(c, b);
  if (is_mamba3(c)) {
    b.bc_groups = bc_groups(c);
    b.rope_fraction = rope_fraction(c);
  }
  return b;
}

bool layer_is_modern(const Case& c) {
  LayerProblem p;
  p.linear = linear_problem(c);
  p.block = layer_block(c);
  return p.modern();
}

bool layer_window_applies(const Case& c) { return !rwkv7_block(c) && option_or(c, "attention", "swa") == "swa"; }
// Mamba-3's gate blends nothing, and RWKV-7's time mixing has its own output stage.
bool layer_has_blend(const Case& c) { return !norm_gate(c) && !rwkv7_block(c) && !is_mamba3(c); }

std::vector<std::size_t> layer_qk_weight_shape(const Case& c) {
  return {width(c), is_mamba3(c) ? std::size_t(bc_groups(c)) * std::size_t(c.dim) : width(c)};
}
bool layer_has_norm_weight(const Case& c) { return !is_mamba3(c); }

Axis attention_axis() {
  return named("attention", "swa", {"swa", "none"}, "the block's softmax branch (swa: sliding window, none)");
}

std::vector<Axis> block_axes() {
  // The block's branch is Gated DeltaNet's, KDA's, Mamba2's or Mamba-3's (trapezoidal); dplr makes the
  // block RWKV-7's time mixing (rwkv7_op.hpp), whose own keys replace the others.
  Axis rule = named("rule", "additive", {"additive", "delta", "dplr", "trapezoidal"},
                    "update rules of the linear branch (additive, delta; dplr: RWKV-7's time mixing; trapezoidal: "
                    "the Mamba-3 block)");
  Axis conv{"short_conv", Param::option, {"0"}, "short convolution width on q, k, v (0: none)", 0, block::kMaxConv};
  Axis rank_axis{"gate_rank", Param::option, {"64"}, "low rank of projected vector gates (KDA)", 1, kMaxRank};
  rank_axis.applies = proj_vector;
  Axis groups{"bc_groups", Param::option, {"1"}, "groups of the Mamba-3 block's B and C (the authors' ngroups)", 1, 4096};
  groups.applies = is_mamba3;
  Axis rope = named("rope_fraction", "0.5", {"0.5", "1"}, "fraction of the Mamba-3 block's B and C channels rotated");
  rope.applies = is_mamba3;
  std::vector<Axis> axes = {rule,
                            conv,
                            attention_axis(),
                            named("gates", "input", {"input", "projected"}, "how g and beta are made (input, projected from x)"),
                            rank_axis,
                            named("output_gate", "gate", {"gate", "norm"},
                                  "output stage (gate: the blend, or Mamba-3's gate alone; norm: gated RMSNorm)"),
                            groups,
                            rope};
  for (std::size_t i = 1; i < axes.size(); ++i)
    if (!axes[i].applies) axes[i].applies = not_rwkv7_block;
  for (Axis& axis : rwkv7_axes()) axes.push_back(std::move(axis));
  return axes;
}

// The gates' gradients against dwv's scale, as dwq and dwk (hybrid/op.cpp): at T = 1 the gated norm
// makes the output nearly independent of a per-token scale of o, so Mamba2's dt and D and every
// gate's parameters have true gradients of order the norm's eps, and float32 returns its rounding.
std::vector<TensorSpec> block_tensors() {
  std::vector<TensorSpec> tensors = {
      {"conv", Role::input, conv_shape, false, has_conv},     {"wz", Role::input, square, false, has_wz},
      {"wa", Role::input, to_heads, false, proj_scalar},      {"wd", Role::input, to_rank, false, proj_vector},
      {"wu", Role::input, from_rank, false, proj_vector},     {"wb", Role::input, to_heads, false, proj_delta},
      {"a_log", Role::input, per_head, false, has_a_log},     {"dt_bias", Role::input, bias_shape, false, projected},
      {"d_skip", Role::input, per_head, false, mamba},        {"lin_g", Role::input, gate_shape, false, input_g},
      {"lin_beta", Role::input, beta_shape, false, input_beta},
      {"wda", Role::input, to_heads, false, is_mamba3},       {"wtrap", Role::input, to_heads, false, is_mamba3},
      {"wangle", Role::input, to_angles, false, is_mamba3},   {"b_bias", Role::input, head_channels, false, is_mamba3},
      {"c_bias", Role::input, head_channels, false, is_mamba3}, {"b_norm", Role::input, state_rows, false, is_mamba3},
      {"c_norm", Role::input, state_rows, false, is_mamba3},
      {"dconv", Role::gradient, conv_shape, false, has_conv}, {"dwz", Role::gradient, square, false, has_wz},
      {"dwa", Role::gradient, to_heads, false, proj_scalar, "dwv"},  {"dwd", Role::gradient, to_rank, false, proj_vector, "dwv"},
      {"dwu", Role::gradient, from_rank, false, proj_vector, "dwv"}, {"dwb", Role::gradient, to_heads, false, proj_delta, "dwv"},
      {"da_log", Role::gradient, per_head, false, has_a_log, "dwv"}, {"ddt_bias", Role::gradient, bias_shape, false, projected, "dwv"},
      {"dd_skip", Role::gradient, per_head, false, mamba, "dwv"},    {"dlin_g", Role::gradient, gate_shape, false, input_g},
      {"dlin_beta", Role::gradient, beta_shape, false, input_beta},
      {"dwda", Role::gradient, to_heads, false, is_mamba3, "dwv"},      {"dwtrap", Role::gradient, to_heads, false, is_mamba3, "dwv"},
      {"dwangle", Role::gradient, to_angles, false, is_mamba3, "dwv"},  {"db_bias", Role::gradient, head_channels, false, is_mamba3, "dwv"},
      {"dc_bias", Role::gradient, head_channels, false, is_mamba3, "dwv"}, {"db_norm", Role::gradient, state_rows, false, is_mamba3, "dwv"},
      {"dc_norm", Role::gradient, state_rows, false, is_mamba3, "dwv"},
  };
  for (TensorSpec& spec : rwkv7_tensors()) tensors.push_back(std::move(spec));
  return tensors;
}

// Stream numbers 14-23 and Mamba-3's 40-42 (core/random.hpp): fixed for good. W* ~ N(0, 1/fan_in), conv ~ N(0, 1/w),
// A_log = log(U[1, 16]), dt_bias = softplus^-1(U[1e-3, 1e-1]), D = 1 (docs/spec.md section 2b); input
// gates as the kernel suite draws them (gate_norm 16, beta = sigmoid(N(0, 1))).
void add_block_inputs(const Case& c, std::uint64_t seed, TensorSet& set) {
  if (rwkv7_block(c)) return add_rwkv7_inputs(c, seed, set);
  const double M = double(width(c));
  auto add = [&](const char* name, std::vector<std::size_t> (*shape)(const Case&), std::uint64_t stream, double std) {
    fill_normal(set.add(name, Role::input, shape(c)).data, seed, stream, std);
  };
  if (has_conv(c)) add("conv", conv_shape, 14, 1.0 / std::sqrt(double(option_int(c, "short_conv", 1))));
  if (has_wz(c)) add("wz", square, 15, 1.0 / std::sqrt(M));
  if (proj_scalar(c)) add("wa", to_heads, 16, 1.0 / std::sqrt(M));
  if (proj_delta(c)) add("wb", to_heads, 17, 1.0 / std::sqrt(M));
  if (proj_vector(c)) {
    add("wd", to_rank, 18, 1.0 / std::sqrt(M));
    add("wu", from_rank, 19, 1.0 / std::sqrt(double(rank(c))));
  }
  if (has_a_log(c))
    fill_uniform(set.add("a_log", Role::input, per_head(c)).data, seed, 20, 1.0, 16.0, [](double u) { return std::log(u); });
  if (projected(c) && !is_mamba3(c))
    fill_uniform(set.add("dt_bias", Role::input, bias_shape(c)).data, seed, 21, 1e-3, 1e-1,
                 [](double u) { return std::log(std::expm1(u)); });
  if (is_mamba3(c)) {  // the authors' initialisation: dt log-uniform in [1e-3, 1e-1], biases and norm weights 1
    fill_uniform(set.add("dt_bias", Role::input, bias_shape(c)).data, seed, 21, std::log(1e-3), std::log(1e-1),
                 [](double u) { return std::log(std::expm1(std::exp(u))); });
    add("wda", to_heads, 40, 1.0 / std::sqrt(M));
    add("wtrap", to_heads, 41, 1.0 / std::sqrt(M));
    add("wangle", to_angles, 42, 1.0 / std::sqrt(M));
    for (const char* name : {"b_bias", "c_bias"}) {
      auto& b = set.add(name, Role::input, head_channels(c)).data;
      std::fill(b.begin(), b.end(), 1.0f);
    }
    for (const char* name : {"b_norm", "c_norm"}) {
      auto& w = set.add(name, Role::input, state_rows(c)).data;
      std::fill(w.begin(), w.end(), 1.0f);
    }
  }
  if (mamba(c)) {
    auto& d = set.add("d_skip", Role::input, per_head(c)).data;
    std::fill(d.begin(), d.end(), 1.0f);
  }
  if (input_g(c)) {
    auto& g = set.add("lin_g", Role::input, gate_shape(c)).data;
    fill_normal(g, seed, 22);
    for (float& x : g) x = float(log_sigmoid(double(x)) / 16.0);
  }
  if (input_beta(c)) {
    auto& beta = set.add("lin_beta", Role::input, beta_shape(c)).data;
    fill_normal(beta, seed, 23);
    for (float& x : beta) x = float(1.0 / (1.0 + std::exp(-double(x))));
  }
}

Reference block_reference(const Case& c, const TensorSet& in, bool backward) {
  const LayerProblem p = layer_problem(c);
  std::map<std::string, std::vector<double>> inputs;
  Reference ref;
  for (const TensorSpec& spec : layer_op().tensors) {
    if (spec.exists && !spec.exists(c)) continue;
    if (is_input(spec.role)) {
      if (in.find(spec.name)) inputs[spec.name] = widened(in, spec.name);
      continue;
    }
    if (spec.role == Role::gradient && !backward) continue;
    std::size_t n = 1;
    for (std::size_t d : spec.shape(c)) n *= d;
    ref.values[spec.name].assign(n, 0.0);
  }
  auto get = [&](const char* name) -> double* {
    if (auto it = inputs.find(name); it != inputs.end()) return it->second.data();
    if (auto it = ref.values.find(name); it != ref.values.end()) return it->second.data();
    return nullptr;
  };
  const BlockArgs<double> args = block::bind_args<double>(get);
  if (backward)
    reference::block_forward_backward(p, args);
  else
    reference::block_forward(p, args);
  ref.has_backward = backward;
  return ref;
}

// Mamba-3 (block/mamba3.hpp), per token: the products (2 M cols for x W_in, 2 M^2 for Wo); per
// token and head the biased norms of B and C (4 Dh each, their sums of squares once per group),
// the rotation of q and k (6 per channel pair each, and a cosine and a sine per pair, counted 20),
// dt, A, g and the angles' sums (20 plus 2 per angle), the skip and the gate (8 per channel); the
// backward doubles the products and takes about three times the elementwise work; the kernel by
// its own op's model (its backward included).
double mamba3_flops(const Case& c) {
  const LayerProblem p = layer_problem(c);
  const block::mamba3::Layout l = block::mamba3::layout(p);
  const double R = double(l.R), M = l.M, RH = R * l.H, Dh = l.Dh, nA = l.nA;
  const double products = 2 * R * M * l.cols + 2 * R * M * M;
  const double elementwise = RH * (8 * Dh + 2 * (6 + 20) * nA + 20 + 2 * nA + 8 * Dh) + R * 2 * l.G * 3 * Dh;
  const double branch = linear_attention_op().flops(c);
  return c.mode == Mode::fwd ? products + elementwise + branch : 3 * products + 3 * elementwise + branch;
}

// Per token: the products (2 M cols for x W_in, 2 r M for KDA's second factor, 2 M^2 for Wo), the
// convolution (2 w per channel of q, k, v), silu (4 per channel), the L2 norms (3 per channel of q
// and k), the gates (4 per gate value), the output stage (8 per channel); the backward doubles the
// products and the convolution and takes about three times the elementwise work. The linear
// branch and the window by their own ops' models (each includes its own backward).
double block_flops(const Case& c) {
  if (rwkv7_block(c)) return rwkv7_flops(c);
  if (is_mamba3(c)) return mamba3_flops(c);
  const LayerProblem p = layer_problem(c);
  const block::Layout l = block::layout(p);
  const double R = double(l.R), M = l.M;
  const double products = 2 * R * M * l.cols + 2 * R * l.r * M + 2 * R * M * M;
  const double conv = l.conv ? 2.0 * l.w * 3 * M * R : 0.0;
  double elementwise = (l.conv ? 4 * 3 * M * R : 0.0) + (l.delta ? 6 * M * R : 0.0) + 8 * M * R;
  if (l.projected) elementwise += 4 * R * (l.vector ? M : l.H) + (l.mamba ? 2 * R * M : 0.0);
  double branches = linear_attention_op().flops(c);
  if (l.window) {
    Case window = c;
    window.impl = "blocked";
    branches += sliding_window_op().flops(window);
  }
  return c.mode == Mode::fwd ? products + conv + elementwise + branches
                             : 3 * products + 3 * conv + 3 * elementwise + branches;
}

// Mamba-3's block (block/mamba3.hpp) is its own form: the parts it has are fixed.
std::optional<std::string> mamba3_limit(const Case& c) {
  const std::string block = "rule trapezoidal is the Mamba-3 block";
  if (c.decay != "scalar") return block + ", whose decay is scalar: it needs decay scalar, not " + c.decay;
  if (!projected(c)) return block + ", whose gates are made from x: it needs gates projected";
  if (has_conv(c)) return block + ", which has no short convolution: it needs short_conv 0";
  if (layer_window_applies(c)) return block + ", which has no window: it needs attention none";
  if (norm_gate(c)) return block + " with its output gate alone (the authors' default): it needs output_gate gate";
  if (c.heads % bc_groups(c))
    return block + ": bc_groups " + std::to_string(bc_groups(c)) + " does not divide heads " + std::to_string(c.heads);
  if (rope_angles(c) < 1)
    return block + ": head_dim " + std::to_string(c.dim) + " at rope_fraction " + option_or(c, "rope_fraction", "0.5") +
           " rotates no channel pair";
  if (c.dim > block::mamba3::kMaxDim) return block + ": head_dim over " + std::to_string(block::mamba3::kMaxDim);
  return std::nullopt;
}

std::optional<std::string> block_limit(const Case& c) {
  if (rwkv7_block(c)) return rwkv7_limit(c);
  if (is_mamba3(c)) return mamba3_limit(c);
  const bool window = layer_window_applies(c);
  if (window == norm_gate(c))
    return std::string(norm_gate(c) ? "output_gate norm is the block without the window: it needs attention none"
                                    : "attention none leaves the gate nothing to blend: it needs output_gate norm");
  if (projected(c) && !is_gated(c))
    return "gates projected make the decay from x: decay must be scalar or vector, not " + c.decay;
  if (mamba(c) && c.decay != "scalar")
    return std::string("gates projected with rule additive is Mamba2: it needs decay scalar");
  return std::nullopt;
}

}  // namespace lattn

// RWKV-7's time mixing in the layer suite's row (block/rwkv7_op.hpp).
#include "kernels/layer/block/rwkv7_op.hpp"

#include <cmath>

#include "core/random.hpp"
#include "kernels/layer/block/rwkv7.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/op.hpp"

namespace lattn {
namespace {

constexpr long kMaxRank = 8192;

std::size_t width(const Case& c) { return std::size_t(c.heads) * std::size_t(c.dim); }
// The low rank a key sets, or its default (rwkv7_axes(): RWKV-LM's RWKV-v7 demo's 64, 64, 128).
std::size_t rank_of(const Case& c, const char* key) {
  const std::string text = c.option(key);
  if (!text.empty()) return std::size_t(std::stol(text));
  return std::string(key) == "out_gate_rank" ? 128 : 64;
}
std::vector<std::size_t> mix_shape(const Case& c) { return {6, width(c)}; }
std::vector<std::size_t> channels(const Case& c) { return {width(c)}; }
std::vector<std::size_t> decay_in(const Case& c) { return {width(c), rank_of(c, "decay_rank")}; }
std::vector<std::size_t> decay_out(const Case& c) { return {rank_of(c, "decay_rank"), width(c)}; }
std::vector<std::size_t> iclr_in(const Case& c) { return {width(c), rank_of(c, "iclr_rank")}; }
std::vector<std::size_t> iclr_out(const Case& c) { return {rank_of(c, "iclr_rank"), width(c)}; }
std::vector<std::size_t> gate_in(const Case& c) { return {width(c), rank_of(c, "out_gate_rank")}; }
std::vector<std::size_t> gate_out(const Case& c) { return {rank_of(c, "out_gate_rank"), width(c)}; }

// Uniform draws U[lo, hi) from a normal stream: u = Phi(z).
void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream, double lo, double hi) {
  fill_normal(out, seed, stream);
  for (float& x : out) x = float(lo + (hi - lo) * 0.5 * std::erfc(-double(x) / std::sqrt(2.0)));
}

}  // namespace

bool rwkv7_block(const Case& c) { return c.option("rule") == "dplr"; }
bool not_rwkv7_block(const Case& c) { return !rwkv7_block(c); }

void add_rwkv7_block(const Case& c, LayerBlock& b) {
  b.window = false;
  b.decay_rank = int(rank_of(c, "decay_rank"));
  b.iclr_rank = int(rank_of(c, "iclr_rank"));
  b.out_gate_rank = int(rank_of(c, "out_gate_rank"));
}

std::vector<Axis> rwkv7_axes() {
  std::vector<Axis> axes = {
      {"decay_rank", Param::option, {"64"}, "RWKV-7's decay low rank (rule dplr)", 1, kMaxRank},
      {"iclr_rank", Param::option, {"64"}, "RWKV-7's in-context learning rate low rank (rule dplr)", 1, kMaxRank},
      {"out_gate_rank", Param::option, {"128"}, "RWKV-7's output gate low rank (rule dplr)", 1, kMaxRank}};
  for (Axis& a : axes) a.applies = rwkv7_block;
  return axes;
}

// The decay's parameters reach the output only through the state a token finds: at T = 1 their
// true gradients are 0 (and kk's scale k_k, which reads and writes that state, likewise), so
// their error is taken against dwv's scale, as the other blocks' gates are.
std::vector<TensorSpec> rwkv7_tensors() {
  struct Part {
    const char* name;
    std::vector<std::size_t> (*shape)(const Case&);
    const char* floor;
  };
  const Part parts[] = {{"mix", mix_shape, nullptr}, {"w0", channels, "dwv"},    {"w1", decay_in, "dwv"},
                        {"w2", decay_out, "dwv"},    {"a0", channels, nullptr},  {"a1", iclr_in, nullptr},
                        {"a2", iclr_out, nullptr},   {"g1", gate_in, nullptr},   {"g2", gate_out, nullptr},
                        {"k_k", channels, "dwv"},    {"k_a", channels, nullptr}, {"r_k", channels, nullptr},
                        {"ln_b", channels, nullptr}};
  std::vector<TensorSpec> specs;
  for (const Part& part : parts) specs.push_back({part.name, Role::input, part.shape, false, rwkv7_block});
  for (const Part& part : parts)
    specs.push_back({std::string("d") + part.name, Role::gradient, part.shape, false, rwkv7_block, part.floor});
  return specs;
}

// Stream numbers 40-52 (core/random.hpp): fixed for good. RWKV-7-like ranges (docs/spec.md
// section 2b): lerp weights U[0, 1), w0 U[-6, 1) (per-token decays from exp(-e^-1/2 0.0025) to
// exp(-e^-1/2 0.73)), first factors N(0, 1/M), the decay's and learning rate's second factors
// N(0, 0.01/rank) (small, as RWKV-7 initialises them), the gate's N(0, 1/rank), a0 N(0, 1/4),
// k_k U[0.5, 1), k_a U[0.5, 1.5), r_k N(0, 0.01), ln_b N(0, 0.01); the norm weight is the layer's g.
void add_rwkv7_inputs(const Case& c, std::uint64_t seed, TensorSet& set) {
  const double M = double(width(c));
  auto normal = [&](const char* name, std::vector<std::size_t> (*shape)(const Case&), std::uint64_t stream, double std) {
    fill_normal(set.add(name, Role::input, shape(c)).data, seed, stream, std);
  };
  auto uniform = [&](const char* name, std::vector<std::size_t> (*shape)(const Case&), std::uint64_t stream, double lo,
                     double hi) { fill_uniform(set.add(name, Role::input, shape(c)).data, seed, stream, lo, hi); };
  uniform("mix", mix_shape, 40, 0.0, 1.0);
  uniform("w0", channels, 41, -6.0, 1.0);
  normal("w1", decay_in, 42, 1.0 / std::sqrt(M));
  normal("w2", decay_out, 43, 0.1 / std::sqrt(double(rank_of(c, "decay_rank"))));
  normal("a0", channels, 44, 0.5);
  normal("a1", iclr_in, 45, 1.0 / std::sqrt(M));
  normal("a2", iclr_out, 46, 0.1 / std::sqrt(double(rank_of(c, "iclr_rank"))));
  normal("g1", gate_in, 47, 1.0 / std::sqrt(M));
  normal("g2", gate_out, 48, 1.0 / std::sqrt(double(rank_of(c, "out_gate_rank"))));
  uniform("k_k", channels, 49, 0.5, 1.0);
  uniform("k_a", channels, 50, 0.5, 1.5);
  normal("r_k", channels, 51, 0.1);
  normal("ln_b", channels, 52, 0.1);
}

// Per token: the products (2 M^2 each for r, k, v and Wo; 2 M r twice per low rank), the six lerps
// (3 per channel each), the decay, learning rate and gate's activations and kk's norm (about 12 per
// channel), k's scale (3), the group norm (8), the bonus (3 per channel and 2 for its add) and the
// gate (1): about 47 per channel; the backward triples the products and the elementwise work. The
// dplr kernel by its own model (which includes its backward).
double rwkv7_flops(const Case& c) {
  const LayerProblem p = layer_problem(c);
  const block::rwkv7::Layout l = block::rwkv7::layout(p);
  const double R = double(l.R), M = l.M;
  const double products = 2 * R * M * 4 * M + 4 * R * M * (l.rw + l.ra + l.rg);
  const double elementwise = 47 * R * M;
  const double branch = linear_attention_op().flops(c);
  return c.mode == Mode::fwd ? products + elementwise + branch : 3 * products + 3 * elementwise + branch;
}

std::optional<std::string> rwkv7_limit(const Case& c) {
  if (c.decay != "vector")
    return "rule dplr in the layer suite is RWKV-7's time mixing, whose decay is per channel: it needs decay vector, not " +
           c.decay;
  if (c.dim > block::rwkv7::kMaxHeadDim)
    return "RWKV-7's time mixing takes head_dim up to " + std::to_string(block::rwkv7::kMaxHeadDim);
  return std::nullopt;
}

}  // namespace lattn

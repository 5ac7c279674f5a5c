// The hybrid linear + sliding-window block (docs/spec.md section 2) as a table row: the layer suite's
// config keys, its forms (the linear branch's: scan or chunked) and their flop model, the tensors,
// the inputs of docs/spec.md section 3, the float64 reference (reference.cpp) and the tolerances. The
// kernels are cpu.cpp and cuda/kernels.cu beside this file, on top of the linear-attention and
// sliding-window ones.
#include "kernels/layer/hybrid/op.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/layer/block/op.hpp"
#include "kernels/layer/hybrid/reference.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/op.hpp"

namespace lattn {
namespace {

constexpr long kMaxBatch = 4096, kMaxHeads = 4096, kMaxSeq = 1L << 24, kMaxDim = 1024, kMaxChunk = 8192;
// The model width heads * head_dim: a weight is width^2 floats (256 MiB at the limit).
constexpr long kMaxModelDim = 8192;

std::size_t width(const Case& c) { return std::size_t(c.heads) * std::size_t(c.dim); }
std::vector<std::size_t> rows(const Case& c) { return {std::size_t(c.batch), std::size_t(c.seq), width(c)}; }
std::vector<std::size_t> weight(const Case& c) { return {width(c), width(c)}; }
std::vector<std::size_t> channels(const Case& c) { return {width(c)}; }
std::vector<std::size_t> per_head(const Case& c) { return {std::size_t(c.heads)}; }

// The four M x M projections, the linear branch and the window by their own ops' models, and the
// norm and gate as elementwise work (squares and their sum, two scalings, the gate's blend). The
// backward: dx and dW per projection (2x), about twice the elementwise work; the branches'
// models include their own backward.
double layer_flops(const Case& c) {
  if (layer_is_modern(c)) return block_flops(c);
  const double R = double(c.batch) * c.seq, M = double(width(c));
  const double projections = 8 * R * M * M, elementwise = 8 * R * M;
  Case window = c;
  window.impl = "blocked";
  const double branches = linear_attention_op().flops(c) + sliding_window_op().flops(window);
  return c.mode == Mode::fwd ? projections + branches + elementwise : 3 * projections + branches + 3 * elementwise;
}

// Stream numbers of docs/spec.md section 3 (core/random.hpp): fixed for good. W* ~ N(0, 1/M), g = 1.
TensorSet make_inputs(const Case& c, std::uint64_t seed) {
  TensorSet set;
  const double w_std = 1.0 / std::sqrt(double(width(c)));
  fill_normal(set.add("x", Role::input, rows(c)).data, seed, 7);
  fill_normal(set.add("wq", Role::input, layer_qk_weight_shape(c)).data, seed, 8, w_std);
  fill_normal(set.add("wk", Role::input, layer_qk_weight_shape(c)).data, seed, 9, w_std);
  fill_normal(set.add("wv", Role::input, weight(c)).data, seed, 10, w_std);
  fill_normal(set.add("wo", Role::input, weight(c)).data, seed, 11, w_std);
  if (layer_has_norm_weight(c)) {
    auto& g = set.add("g", Role::input, channels(c)).data;
    std::fill(g.begin(), g.end(), 1.0f);
  }
  if (layer_has_blend(c)) fill_normal(set.add("beta", Role::input, per_head(c)).data, seed, 12);
  fill_normal(set.add("dOut", Role::cotangent, rows(c)).data, seed, 13);
  add_block_inputs(c, seed, set);
  return set;
}

// The float64 layer does not depend on the form: its linear branch is the scan reference.
Reference compute_reference(const Case& c, const TensorSet& in, bool backward) {
  if (layer_is_modern(c)) return block_reference(c, in, backward);
  const LayerProblem p = layer_problem(c);
  const auto x = widened(in, "x"), wq = widened(in, "wq"), wk = widened(in, "wk"), wv = widened(in, "wv"),
             wo = widened(in, "wo"), g = widened(in, "g"), beta = widened(in, "beta");
  Reference ref;
  auto& out = ref.values["out"];
  out.assign(p.token_elems(), 0.0);
  if (!backward) {
    reference::layer_forward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(), out.data()});
    return ref;
  }
  const auto dOut = widened(in, "dOut");
  auto& dx = ref.values["dx"];
  dx.assign(p.token_elems(), 0.0);
  for (const char* w : {"dwq", "dwk", "dwv", "dwo"}) ref.values[w].assign(p.weight_elems(), 0.0);
  ref.values["dg"].assign(p.model_dim(), 0.0);
  ref.values["dbeta"].assign(std::size_t(p.linear.heads), 0.0);
  reference::layer_forward_backward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(),
                                        dOut.data(), out.data(), dx.data(), ref.values["dwq"].data(),
                                        ref.values["dwk"].data(), ref.values["dwv"].data(), ref.values["dwo"].data(),
                                        ref.values["dg"].data(), ref.values["dbeta"].data()});
  ref.has_backward = true;
  return ref;
}

// Why these values (dbeta is one sum per head): docs/harness.md, "Tolerances".
double tolerance(const std::string& dtype) {
  if (dtype == "float32") return 1e-3;
  if (dtype == "bf16") return 5e-2;
  throw UsageError("dtype", "no tolerance known for '" + dtype + "'");
}

std::optional<std::string> limit(const Case& c) {
  const long w = long(width(c));
  if (w <= kMaxModelDim) return block_limit(c);
  return "layer heads " + std::to_string(c.heads) + " x head_dim " + std::to_string(c.dim) + " is a model width of " +
         std::to_string(w) + ", over the limit " + std::to_string(kMaxModelDim) + " (each weight is width^2 floats)";
}

// The reference results file's `dim` of a layer record is the head dim; these say so explicitly.
std::vector<std::pair<std::string, long>> extra_identity(const Case& c) {
  return {{"head_dim", c.dim}, {"model_dim", long(width(c))}};
}

}  // namespace

LayerProblem layer_problem(const Case& c, bool keep_chunk_states) {
  return LayerProblem{linear_problem(c), c.window, c.impl == "chunked", keep_chunk_states, layer_block(c)};
}

const Op& layer_op() {
  static const Op op = [] {
    Op o;
    o.name = "layer";
    o.suite = "layer";
    // seq outside impl outside mode, as the reference results file orders its layer records.
    o.axes = {
        {"batch", Param::batch, {"2"}, "batch sizes", 1, kMaxBatch},
        {"heads", Param::heads, {"8"}, "head counts", 1, kMaxHeads},
        {"head_dim", Param::dim, {"64"}, "head dims of the layer suite", 1, kMaxDim},
        {"window", Param::window, {"128"}, "sliding windows of the layer suite (attention swa)", 1, kMaxSeq},
        {"chunk", Param::chunk, {"128"}, "chunk sizes of the chunked form", 1, kMaxChunk},
        {"decay", Param::decay, {"none"}, "decay modes (none, retnet, scalar, vector)", 1, 0, decay_names()},
        {"seq", Param::seq, {"512", "2048"}, "sequence lengths", 1, kMaxSeq},
        {"impl", Param::impl, {"scan", "chunked"}, "impls (scan, chunked)"},
        {"mode", Param::mode, {"fwd", "fwd_bwd"}, "modes (fwd, fwd_bwd)"},
    };
    for (Axis& axis : block_axes()) o.axes.insert(o.axes.end() - 3, std::move(axis));  // after decay, before seq
    o.axes.push_back(cache_axis("warm"));
    o.forms = {{"scan", layer_flops}, {"chunked", layer_flops}};
    o.tensors = {
        {"x", Role::input, rows, true},          {"wq", Role::input, layer_qk_weight_shape, false},
        {"wk", Role::input, layer_qk_weight_shape, false}, {"wv", Role::input, weight, false},
        {"wo", Role::input, weight, false},      {"g", Role::input, channels, false, layer_has_norm_weight},
        {"beta", Role::input, per_head, false, layer_has_blend},  {"dOut", Role::cotangent, rows, true},
        {"out", Role::output, rows, false},      {"dx", Role::gradient, rows, false},
        // dwq and dwk against dwv's scale: where RMSNorm makes the output nearly independent of q
        // and k (one token, or head_dim 1) their true values are of order the norm's eps, and the
        // float32 forward's rounding of Lin alone moves them by 1e-3 to 1e-1 (docs/harness.md).
        {"dwq", Role::gradient, layer_qk_weight_shape, false, nullptr, "dwv"},
        {"dwk", Role::gradient, layer_qk_weight_shape, false, nullptr, "dwv"},
        {"dwv", Role::gradient, weight, false},  {"dwo", Role::gradient, weight, false},
        {"dg", Role::gradient, channels, false, layer_has_norm_weight}, {"dbeta", Role::gradient, per_head, false, layer_has_blend},
    };
    for (TensorSpec& spec : block_tensors()) o.tensors.push_back(std::move(spec));
    o.make_inputs = make_inputs;
    o.reference = compute_reference;
    o.tolerance = tolerance;
    o.limit = limit;
    o.extra_identity = extra_identity;
    return o;
  }();
  return op;
}

}  // namespace lattn

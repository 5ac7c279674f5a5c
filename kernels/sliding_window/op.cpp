// Sliding-window causal softmax attention (docs/spec.md section 2's Swa branch) as a table row: one form,
// "blocked" (query blocks against the key range their windows cover, cpu.cpp and cuda.cu beside
// this file), its flop model, tensors, inputs and the float64 reference (reference.cpp).
#include "kernels/sliding_window/op.hpp"

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/sliding_window/reference.hpp"

namespace lattn {
namespace {

std::vector<std::size_t> tokens(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq), std::size_t(c.dim)};
}

// Keys the causal window sees, summed over the queries of one head: sum_t min(t + 1, W).
double window_pairs(double T, double W) {
  if (T <= W) return T * (T + 1) / 2;
  return W * (W + 1) / 2 + (T - W) * W;
}

// Two products (scores and P V) over the causal pairs the window computes; the masked part of a
// query block's tile is not counted. The backward's five products (recomputed scores, dP, dQ,
// dK, dV) are 2.5 times the forward's.
double blocked_flops(const Case& c) {
  const double forward = 4.0 * double(c.batch) * c.heads * window_pairs(c.seq, c.window) * c.dim;
  return c.mode == Mode::fwd ? forward : 3.5 * forward;
}

// The linear-attention op's stream numbers for q, k, v and dO (core/random.hpp).
TensorSet make_inputs(const Case& c, std::uint64_t seed) {
  TensorSet set;
  fill_normal(set.add("q", Role::input, tokens(c)).data, seed, 1);
  fill_normal(set.add("k", Role::input, tokens(c)).data, seed, 2);
  fill_normal(set.add("v", Role::input, tokens(c)).data, seed, 3);
  fill_normal(set.add("dO", Role::cotangent, tokens(c)).data, seed, 5);
  return set;
}

Reference compute_reference(const Case& c, const TensorSet& in, bool backward) {
  const Problem p{c.batch, c.heads, c.seq, c.dim, 1, Decay::none};
  const auto q = widened(in, "q"), k = widened(in, "k"), v = widened(in, "v");
  Reference ref;
  auto& o = ref.values["o"];
  o.assign(p.token_elems(), 0.0);
  reference::sliding_window_forward(p, c.window, q.data(), k.data(), v.data(), o.data(), nullptr);
  if (backward) {
    const auto dO = widened(in, "dO");
    for (const char* g : {"dq", "dk", "dv"}) ref.values[g].assign(p.token_elems(), 0.0);
    reference::sliding_window_backward(p, c.window, q.data(), k.data(), v.data(), dO.data(), ref.values["dq"].data(),
                                       ref.values["dk"].data(), ref.values["dv"].data());
    ref.has_backward = true;
  }
  return ref;
}

double tolerance(const std::string& dtype) {
  if (dtype == "float32") return 1e-4;
  if (dtype == "bf16") return 3e-2;
  throw UsageError("dtype", "no tolerance known for '" + dtype + "'");
}

}  // namespace

const Op& sliding_window_op() {
  static const Op op = [] {
    Op o;
    o.name = "sliding_window";
    o.axes = {
        {"batch", Param::batch, {"1"}, "batch sizes", 1, 4096},
        {"heads", Param::heads, {"1"}, "head counts", 1, 4096},
        {"dim", Param::dim, {"64"}, "head dims", 1, 1024},
        {"window", Param::window, {"128"}, "keys each query attends to", 1, 1L << 24},
        {"seq", Param::seq, {"512"}, "sequence lengths", 1, 1L << 24},
        {"mode", Param::mode, {"fwd", "fwd_bwd"}, "modes (fwd, fwd_bwd)"},
        {"impl", Param::impl, {"blocked"}, "impls (blocked)"},
        cache_axis("warm"),
    };
    o.forms = {{"blocked", blocked_flops}};
    o.tensors = {
        {"q", Role::input, tokens, true},      {"k", Role::input, tokens, true},
        {"v", Role::input, tokens, true},      {"dO", Role::cotangent, tokens, true},
        {"o", Role::output, tokens, false},    {"dq", Role::gradient, tokens, false},
        {"dk", Role::gradient, tokens, false}, {"dv", Role::gradient, tokens, false},
    };
    o.make_inputs = make_inputs;
    o.reference = compute_reference;
    o.tolerance = tolerance;
    return o;
  }();
  return op;
}

}  // namespace lattn

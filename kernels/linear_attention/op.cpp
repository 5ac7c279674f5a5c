// Causal linear attention (SPEC section 1) as a table row: the kernel suite's config keys, the two
// forms and their flop models, the tensors, the inputs of SPEC section 3, the float64 reference
// (reference.cpp) and the tolerances. The kernels are cpu_*.cpp and cuda_*.cu beside this file.
#include "kernels/linear_attention/op.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/linear_attention/reference.hpp"

namespace lattn {
namespace {

// Sizes beyond these are refused when the config is read, before anything is allocated.
constexpr long kMaxBatch = 4096, kMaxHeads = 4096, kMaxSeq = 1L << 24, kMaxDim = 1024, kMaxChunk = 8192;

std::vector<std::size_t> tokens(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.seq), std::size_t(c.dim)};
}
std::vector<std::size_t> states(const Case& c) {
  return {std::size_t(c.batch), std::size_t(c.heads), std::size_t(c.dim), std::size_t(c.dim)};
}

// The forward is 4 D^2 flops per token and head (the state update and the readout, 2 D^2 each);
// the backward's three recurrences (S for dq, G for dk and dv) add 10 D^2.
double scan_flops(const Case& c) {
  const double D = c.dim;
  return double(c.batch) * c.heads * c.seq * (c.mode == Mode::fwd ? 4.0 : 14.0) * D * D;
}

// Per token and head: 4 D^2 for the inter-chunk products (Q S and the state update K^T V) and
// 2 C D for the causal half of the intra-chunk products (Q K^T and P V over C rows); the
// backward's products are twice the forward's.
double chunked_flops(const Case& c) {
  const double D = c.dim, C = std::min(c.chunk, c.seq);
  const double forward = double(c.batch) * c.heads * c.seq * (4.0 * D * D + 2.0 * C * D);
  return c.mode == Mode::fwd ? forward : 3.0 * forward;
}

// Stream numbers of SPEC section 3 (core/random.hpp): fixed for good.
TensorSet make_inputs(const Case& c, std::uint64_t seed) {
  TensorSet set;
  const struct {
    const char* name;
    Role role;
    bool token;
    std::uint64_t stream;
  } made[] = {{"q", Role::input, true, 1},      {"k", Role::input, true, 2},        {"v", Role::input, true, 3},
              {"h0", Role::input, false, 4},    {"dO", Role::cotangent, true, 5},   {"dhT", Role::cotangent, false, 6}};
  for (const auto& m : made) fill_normal(set.add(m.name, m.role, m.token ? tokens(c) : states(c)).data, seed, m.stream);
  return set;
}

Reference compute_reference(const Case& c, const TensorSet& in, bool backward) {
  const Problem p = linear_problem(c);
  Reference ref;
  const auto q = widened(in, "q"), k = widened(in, "k"), v = widened(in, "v"), h0 = widened(in, "h0");
  auto& o = ref.values["o"];
  auto& hT = ref.values["hT"];
  o.assign(p.token_elems(), 0.0);
  hT.assign(p.state_elems(), 0.0);
  reference::forward(p, {q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data()});
  if (backward) {
    const auto dO = widened(in, "dO"), dhT = widened(in, "dhT");
    for (const char* g : {"dq", "dk", "dv"}) ref.values[g].assign(p.token_elems(), 0.0);
    ref.values["dh0"].assign(p.state_elems(), 0.0);
    reference::backward(p, {q.data(), k.data(), v.data(), h0.data(), dO.data(), dhT.data(), ref.values["dq"].data(),
                            ref.values["dk"].data(), ref.values["dv"].data(), ref.values["dh0"].data()});
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

}  // namespace

const std::vector<std::string>& decay_names() {
  static const std::vector<std::string> names = {"none", "retnet"};
  return names;
}

std::string to_string(Decay decay) { return decay_names()[std::size_t(decay)]; }

Decay decay_from(const std::string& name) {
  for (std::size_t i = 0; i < decay_names().size(); ++i)
    if (decay_names()[i] == name) return Decay(i);
  throw RuntimeFailure("no decay '" + name + "'");
}

Problem linear_problem(const Case& c) {
  return Problem{c.batch, c.heads, c.seq, c.dim, c.chunk, decay_from(c.decay)};
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
        {"decay", Param::decay, {"none"}, "decay modes (none, retnet)", 1, 0, decay_names()},
        {"dim", Param::dim, {"32", "64", "128"}, "head dims of the kernel suite", 1, kMaxDim},
        {"seq", Param::seq, {"512", "2048", "8192"}, "sequence lengths", 1, kMaxSeq},
        {"mode", Param::mode, {"fwd", "fwd_bwd"}, "modes (fwd, fwd_bwd)"},
        {"impl", Param::impl, {"scan", "chunked"}, "impls (scan, chunked)"},
    };
    o.forms = {{"scan", scan_flops}, {"chunked", chunked_flops}};
    o.tensors = {
        {"q", Role::input, tokens, true},       {"k", Role::input, tokens, true},
        {"v", Role::input, tokens, true},       {"h0", Role::input, states, false},
        {"dO", Role::cotangent, tokens, true},  {"dhT", Role::cotangent, states, false},
        {"o", Role::output, tokens, false},     {"hT", Role::output, states, false},
        {"dq", Role::gradient, tokens, false},  {"dk", Role::gradient, tokens, false},
        {"dv", Role::gradient, tokens, false},  {"dh0", Role::gradient, states, false},
    };
    o.make_inputs = make_inputs;
    o.reference = compute_reference;
    o.tolerance = tolerance;
    return o;
  }();
  return op;
}

}  // namespace lattn

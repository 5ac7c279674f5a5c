// The DeltaProduct adapter of cpu/householder.hpp. Its tests: the op table (tests/op_table.hpp) and
// tests/kernels/test_shapes.cpp run it against the float64 reference.
#include "kernels/linear_attention/cpu/householder.hpp"

#include "kernels/linear_attention/householder.hpp"

namespace lattn::cpu {
namespace {

// Rows of q (per q/k head) and of o, dO and the gates (per value head), one per token.
std::size_t key_rows(const Problem& p) { return p.key_elems() / std::size_t(p.dim); }
std::size_t value_rows(const Problem& p) { return p.heads_total() * std::size_t(p.seq); }

// Scratch: the steps' q, g and o (forward); q, g, dO, dq and dg (backward).
std::size_t forward_floats(const Problem& s) { return s.key_elems() + s.gate_elems() + s.value_elems(); }
std::size_t backward_floats(const Problem& s) { return 2 * s.key_elems() + 2 * s.gate_elems() + s.value_elems(); }

}  // namespace

CpuVariant householder_stepped(const CpuVariant& inner) {
  CpuVariant v;
  v.name = inner.name + "+householder";
  v.takes = inner.takes;
  v.takes.householder = true;
  v.forward = [inner](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    Workspace<float> scratch(m, forward_floats(s));
    float* q = scratch.data();
    float* g = q + s.key_elems();
    float* o = g + s.gate_elems();
    interleave_rows(a.q, key_rows(p), p.dim, n, n - 1, q);
    if (a.g) interleave_rows(a.g, value_rows(p), W, n, 0, g);
    inner.forward(s, {q, a.k, a.v, a.h0, o, a.hT, a.g ? g : nullptr, a.beta}, m, keep);
    pick_rows(o, value_rows(p), p.value_dim(), n, n - 1, a.o);
  };
  v.backward = [inner](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    Workspace<float> scratch(m, backward_floats(s));
    float* q = scratch.data();
    float* dq = q + s.key_elems();
    float* g = dq + s.key_elems();
    float* dg = g + s.gate_elems();
    float* dO = dg + s.gate_elems();
    interleave_rows(a.q, key_rows(p), p.dim, n, n - 1, q);
    interleave_rows(a.dO, value_rows(p), p.value_dim(), n, n - 1, dO);
    if (a.g) interleave_rows(a.g, value_rows(p), W, n, 0, g);
    inner.backward(s,
                   {q, a.k, a.v, a.h0, dO, a.dhT, dq, a.dk, a.dv, a.dh0, a.g ? g : nullptr, a.dg ? dg : nullptr,
                    a.beta, a.dbeta},
                   m, kept);
    pick_rows(dq, key_rows(p), p.dim, n, n - 1, a.dq);
    if (a.dg) pick_rows(dg, value_rows(p), W, n, 0, a.dg);
  };
  v.forward_workspace_bytes = [inner](const Problem& p, bool keep) {
    const Problem s = householder_steps(p);
    return forward_floats(s) * sizeof(float) + inner.forward_workspace_bytes(s, keep);
  };
  v.backward_workspace_bytes = [inner](const Problem& p, bool kept) {
    const Problem s = householder_steps(p);
    return backward_floats(s) * sizeof(float) + inner.backward_workspace_bytes(s, kept);
  };
  if (inner.kept_states_bytes)
    v.kept_states_bytes = [inner](const Problem& p) { return inner.kept_states_bytes(householder_steps(p)); };
  return v;
}

}  // namespace lattn::cpu

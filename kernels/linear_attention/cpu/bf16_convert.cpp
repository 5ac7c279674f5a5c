// A float32 variant run on bf16 token tensors (cpu/bf16.hpp's bf16_converted): each call widens
// its bf16 tensors (q, k, v; and dO in the backward) into float32 scratch from the allocator, runs
// the float32 kernel on them and frees them. Widening is exact (a bf16 is the upper half of a
// float32), so the result is the float32 kernel's on the bf16-rounded inputs; the copies cost time
// and memory beside the kernel's, which the records count (temp_mb) and name ("+bf16cvt").
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {

void widen_bf16(const Bf16* in, float* out, std::size_t n) {
  const long blocks = long((n + 4095) / 4096);
#pragma omp parallel for schedule(static) if (blocks > 1 && !omp_in_parallel())
  for (long b = 0; b < blocks; ++b) {
    const std::size_t first = std::size_t(b) * 4096, last = std::min(n, first + 4096);
    for (std::size_t i = first; i < last; ++i) {
      const std::uint32_t bits = std::uint32_t(in[i]) << 16;
      std::memcpy(out + i, &bits, sizeof bits);
    }
  }
}

namespace {

// k and v: n rows per token for DeltaProduct's n writes (Problem::householder).
std::size_t step_key_elems(const Problem& p) { return p.key_elems() * std::size_t(p.householder); }
std::size_t step_value_elems(const Problem& p) { return p.value_elems() * std::size_t(p.householder); }

}  // namespace

std::size_t bf16_converted_forward_floats(const Problem& p) {
  return p.key_elems() + step_key_elems(p) + step_value_elems(p);
}
std::size_t bf16_converted_backward_floats(const Problem& p) {
  return p.key_elems() + step_key_elems(p) + step_value_elems(p) + p.value_elems();
}

CpuBf16Variant bf16_converted(const CpuVariant& inner) {
  CpuBf16Variant v;
  v.name = inner.name + "+bf16cvt";
  v.takes = inner.takes;
  v.forward = [inner](const Problem& p, const Bf16ForwardArgs& a, Allocator& m, float* keep) {
    Workspace<float> wide(m, bf16_converted_forward_floats(p));
    float* q = wide.data();
    float* k = q + p.key_elems();
    float* v = k + step_key_elems(p);
    widen_bf16(a.q, q, p.key_elems());
    widen_bf16(a.k, k, step_key_elems(p));
    widen_bf16(a.v, v, step_value_elems(p));
    inner.forward(p, {q, k, v, a.h0, a.o, a.hT, a.g, a.beta, a.a, a.b, a.dt, a.trap, a.u}, m, keep);
  };
  v.backward = [inner](const Problem& p, const Bf16BackwardArgs& a, Allocator& m, const float* kept) {
    Workspace<float> wide(m, bf16_converted_backward_floats(p));
    float* q = wide.data();
    float* k = q + p.key_elems();
    float* v = k + step_key_elems(p);
    float* dO = v + step_value_elems(p);
    widen_bf16(a.q, q, p.key_elems());
    widen_bf16(a.k, k, step_key_elems(p));
    widen_bf16(a.v, v, step_value_elems(p));
    widen_bf16(a.dO, dO, p.value_elems());
    inner.backward(p,
                   {q, k, v, a.h0, dO, a.dhT, a.dq, a.dk, a.dv, a.dh0, a.g, a.dg, a.beta, a.dbeta, a.a, a.b, a.da, a.db,
                    a.dt, a.trap, a.ddt, a.dtrap, a.u, a.du},
                   m, kept);
  };
  v.forward_workspace_bytes = [inner](const Problem& p, bool keep) {
    return bf16_converted_forward_floats(p) * sizeof(float) + inner.forward_workspace_bytes(p, keep);
  };
  v.backward_workspace_bytes = [inner](const Problem& p, bool kept) {
    return bf16_converted_backward_floats(p) * sizeof(float) + inner.backward_workspace_bytes(p, kept);
  };
  v.kept_states_bytes = inner.kept_states_bytes;
  return v;
}

}  // namespace lattn::cpu

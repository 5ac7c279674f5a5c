// The linear-attention op's table row (core/op.hpp): the kernel suite.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/op.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn {

const Op& linear_attention_op();

// The kernels' view of a case of this op (or of the layer's linear branch).
Problem linear_problem(const Case& kase);

// The shape keys of docs/spec.md section 1c, which the decode suite takes too. heads_k and dim_v as
// a case holds them: 0 (the default) is "as heads" / "as dim".
int qk_heads(const Case& kase);
int value_dim(const Case& kase);
// Their axes, up to the op's largest heads and dim. Records leave a key out at its default, so that
// square cases keep comparing with records written before the keys existed.
Axis heads_k_axis(long max_heads);
Axis dim_v_axis(long max_dim);
// heads_k and dim_v equal to heads and dim become their defaults (one case, one record identity).
void settle_shape_keys(Case& kase);

// One case's tensors of this op, bound by name once: the one binder the CPU rows, the CUDA rows
// and the plugin call share. q, k, v and dO are in the case's dtype (void*); the rest float32.
// A tensor the case does not have (by the op's TensorSpecs: g without a gated decay, beta without
// the delta rule, a and b without dplr, the cotangents and gradients in a forward) is null.
struct LinearTensors {
  void *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  float *h0 = nullptr, *o = nullptr, *hT = nullptr, *g = nullptr, *beta = nullptr, *dhT = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr, *dh0 = nullptr, *dg = nullptr, *dbeta = nullptr;
  float *a = nullptr, *b = nullptr, *da = nullptr, *db = nullptr;  // rule dplr only
  float *dt = nullptr, *trap = nullptr, *ddt = nullptr, *dtrap = nullptr;  // rule trapezoidal
  float *u = nullptr, *du = nullptr;  // RWKV-6's bonus and its gradient
};

// The trapezoidal rule's MIMO rank (`mimo_rank`, docs/spec.md section 1e): 1 for every other rule.
int mimo_rank(const Case& kase);

// The shapes of a case's per-token tensors, which the decode suite's cases share. q, k: [B][Hk][T][Dk];
// v, o: [B][H][T][Dv]; the trapezoidal rule's MIMO rank R > 1 gives each token R rows before the last
// axis; DeltaProduct's n Householder writes per token (docs/spec.md section 1h; `householder`, delta
// rule only, 1 elsewhere) give k, v and beta n rows per token: [..][T n][..].
namespace token_shapes {
int householder(const Case& kase);
std::vector<std::size_t> rows(std::size_t heads, const Case& kase, std::size_t width, int writes = 1);
std::vector<std::size_t> keys(const Case& kase);        // q
std::vector<std::size_t> values(const Case& kase);      // o
std::vector<std::size_t> step_keys(const Case& kase);   // k, with its writes
std::vector<std::size_t> step_values(const Case& kase); // v, with its writes
std::vector<std::size_t> betas(const Case& kase);       // [B][H][T n]
}  // namespace token_shapes

// `data(name)`: where the backend holds the named tensor (host or device memory).
LinearTensors bind_linear_tensors(const Case& kase, const std::function<void*(const std::string&)>& data);

// The CPU kernels' arguments (float32 throughout) from the bound tensors.
ForwardArgs<float> cpu_forward_args(const LinearTensors& t);
BackwardArgs<float> cpu_backward_args(const LinearTensors& t);

}  // namespace lattn

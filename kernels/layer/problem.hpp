// The shape of one layer case (docs/spec.md section 2) and the pointers of its calls, shared by every
// backend and the float64 reference.
//
// Layouts (row-major, contiguous; M = heads * head_dim):
//   x, dOut, out, dx           : [batch][seq][M]
//   wq, wk, wv, wo and grads   : [M][M]            (Q = x Wq: column h*head_dim + j is head h's channel j)
//   g, dg : [M]                beta, dbeta : [heads]
// The modern block's parts (docs/spec.md section 2b: short convolution, projected gates, gated norm) and
// their tensors' layouts are in block/block.hpp; RWKV-7's time mixing (rule dplr) in block/rwkv7.hpp.
#pragma once

#include <cstddef>

#include "kernels/linear_attention/problem.hpp"

namespace lattn {

// The parts of docs/spec.md section 2b a layer case may add to the block of section 2. All at their
// defaults (and an additive, ungated linear branch) is the hybrid block of section 2.
struct LayerBlock {
  int short_conv = 0;            // width of the causal depthwise convolution on q, k, v (0: none)
  bool projected_gates = false;  // g, beta (and Mamba2's dt) made from x; else inputs as in the kernel suite
  bool norm_gate = false;        // y = RMSNorm(o) w silu(x Wz); else the blend with the window branch
  bool window = true;            // the sliding-window softmax branch (`attention: swa`)
  int gate_rank = 0;             // KDA's low rank r (vector gates, projected): Wd is M x r, Wu r x M
  // Mamba-3 (rule trapezoidal, block/mamba3.hpp): B's and C's groups (the authors' ngroups), the
  // fraction of their channels rotated.
  int bc_groups = 1;
  double rope_fraction = 0.5;
  // RWKV-7's time mixing (rule dplr, block/rwkv7.hpp): the low ranks of its decay, in-context
  // learning rate and output gate projections.
  int decay_rank = 0, iclr_rank = 0, out_gate_rank = 0;
};

struct LayerProblem {
  Problem linear;        // batch, heads, seq, dim = head_dim, chunk and decay of the linear branch
  int window = 1;        // query t attends keys max(0, t - window + 1) .. t
  bool chunked = false;  // the linear branch's form: chunked, else scan
  // fwd_bwd on the CPU: the chunked branch's forward keeps its chunk states for the backward
  // (kernels/linear_attention/cpu/kernels.hpp), else the backward recomputes them.
  bool keep_chunk_states = true;
  LayerBlock block{};

  std::size_t model_dim() const { return std::size_t(linear.heads) * linear.dim; }
  std::size_t rows() const { return std::size_t(linear.batch) * linear.seq; }  // tokens of the batch
  std::size_t token_elems() const { return rows() * model_dim(); }            // one of x, out, Q, ...
  std::size_t weight_elems() const { return model_dim() * model_dim(); }
  // Whether the case needs the block of section 2b (block/cpu.cpp, block/reference.cpp) rather
  // than the hybrid block's own kernels (hybrid/cpu.cpp, hybrid/reference.cpp).
  bool modern() const {
    return block.short_conv > 0 || block.projected_gates || block.norm_gate || !block.window || gated(linear.decay) ||
           linear.delta();
  }
};

inline constexpr double kRmsNormEps = 1e-6;

template <class T>
struct LayerForwardArgs {
  const T *x, *wq, *wk, *wv, *wo, *g, *beta;
  T* out;
};

// The forward's inputs and output, the cotangent dOut, and the gradients of <out, dOut>.
template <class T>
struct LayerBackwardArgs {
  const T *x, *wq, *wk, *wv, *wo, *g, *beta, *dOut;
  T *out, *dx, *dwq, *dwk, *dwv, *dwo, *dg, *dbeta;
};

}  // namespace lattn

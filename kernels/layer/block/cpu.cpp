// The modern layer block on the CPU (block/cpu.hpp): what block.hpp's template needs from the CPU.
// The projections run through cpu/products.hpp's layer_product / layer_weight_product (the packed
// products at AVX-512, OpenBLAS's sgemm otherwise: product_path()); the linear branch is the kernel suite's
// scan or chunked kernel for the case's rule and decay, so the block times exactly the kernels the
// kernel suite times. A bf16 case (block_*_bf16) runs the same template with every product on AMX
// tiles and the chunked branch on its AMX row (cpu/products.hpp).
#include "kernels/layer/block/cpu.hpp"

#include <algorithm>

#include "kernels/layer/block/mamba3.hpp"
#include "kernels/layer/block/rwkv7.hpp"

#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/sliding_window/cpu.hpp"

namespace lattn::cpu {
namespace {

// amx: a bf16 case (products.hpp): every product on AMX tiles, the chunked branch on `amx_linear`.
struct CpuOps {
  Allocator& allocator;
  bool chunked;
  float* chunk_states;  // kept by the chunked forward for its backward, or null
  bool amx = false;
  const CpuBf16Variant* amx_linear = nullptr;

  Workspace<float> buffer(std::size_t n) { return Workspace<float>(allocator, n); }
  void product(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
    if (amx) return amx_product(false, trans_b, m, n, k, A, lda, B, ldb, 0.0f, C, ldc, allocator);
    layer_product(trans_b, m, n, k, A, lda, B, ldb, 0.0f, C, ldc, allocator);
  }
  void weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C) {
    if (amx) return amx_product(true, false, m, n, k, A, lda, B, ldb, 0.0f, C, n, allocator);
    float* const outs[1] = {C};
    layer_weight_product(m, n, k, A, lda, B, ldb, outs, n, allocator);
  }
  void linear_forward(const Problem& p, const ForwardArgs<float>& args) {
    if (amx_linear)
      amx_linear_forward(*amx_linear, p, args, allocator);
    else if (chunked)
      cpu::chunked_forward(p, args, allocator, chunk_states);
    else
      scan_forward(p, args, allocator);
  }
  void linear_backward(const Problem& p, const BackwardArgs<float>& args) {
    if (amx_linear)
      amx_linear_backward(*amx_linear, p, args, allocator);
    else if (chunked)
      chunked_backward(p, args, allocator, chunk_states);
    else
      scan_backward(p, args, allocator);
  }
  void window_forward(const Problem& p, int window, const float* q, const float* k, const float* v, float* o,
                      float* lse) {
    sliding_window_forward(p, window, {q, k, v, o, lse}, allocator);
  }
  void window_backward(const Problem& p, int window, const float* q, const float* k, const float* v, const float* o,
                       const float* lse, const float* dO, float* dq, float* dk, float* dv) {
    sliding_window_backward(p, window, {q, k, v, o, lse, dO, dq, dk, dv, true}, allocator);
  }
};

// The form of section 2b the case runs: RWKV-7's (rule dplr, block/rwkv7.hpp), Mamba-3's (rule
// trapezoidal, block/mamba3.hpp) or block.hpp's.
void run_block(const LayerProblem& p, const BlockArgs<float>& args, CpuOps& ops, bool backward) {
  if (p.linear.dplr())
    block::rwkv7::run(p, args, ops, backward);
  else if (p.linear.trapezoidal())
    block::mamba3::run(p, args, ops, backward);
  else
    block::run(p, args, ops, backward);
}

// What the scratch model needs of the form: its kept buffers, W_in's columns, KDA's rank, the window.
struct FormShape {
  std::size_t forward, backward;  // elements
  int M, cols, r;
  bool window;
};
FormShape form_shape(const LayerProblem& p, bool backward) {
  if (p.linear.trapezoidal()) {
    const block::mamba3::Layout l = block::mamba3::layout(p);
    const block::mamba3::Sizes s = block::mamba3::sizes(p, backward);
    return {s.forward(), s.backward(), l.M, l.cols, 0, false};
  }
  const block::Layout l = block::layout(p);
  const block::Sizes s = block::sizes(p, backward);
  return {s.forward(), s.backward(), l.M, l.cols, l.r, l.window};
}

// A bf16 case's chunked row, or nothing (float32, or a scan branch).
std::optional<CpuBf16Variant> amx_row(const LayerProblem& p, bool amx) {
  return amx && p.chunked ? std::optional(layer_amx_linear(p)) : std::nullopt;
}

std::size_t linear_forward_bytes(const LayerProblem& p, bool keep, const CpuBf16Variant* row) {
  if (row) return amx_linear_forward_bytes(*row, p.linear);
  return p.chunked ? chunked_forward_workspace_bytes(p.linear, keep) : scan_forward_workspace_bytes(p.linear);
}

std::size_t linear_backward_bytes(const LayerProblem& p, bool kept, const CpuBf16Variant* row) {
  if (row) return amx_linear_backward_bytes(*row, p.linear);
  return p.chunked ? chunked_backward_workspace_bytes(p.linear, kept) : scan_backward_workspace_bytes(p.linear);
}

std::size_t kept_states_bytes(const LayerProblem& p, bool amx) {
  return p.chunked && p.keep_chunk_states && !amx ? chunked_kept_states_bytes(p.linear) : 0;
}

// The products' scratch (float32: through product_path(), cpu/products.hpp; bf16: amx_product's):
// C = op(A) op(B) (m x n, k deep), and C = A^T B (m x n, k deep: the batch's tokens).
std::size_t product_bytes(int m, int n, int k, bool amx) {
  return amx ? amx_product_bytes(m, n, k) : layer_product_bytes(m, n, k);
}
std::size_t weight_product_bytes(int m, int n, int k, bool amx) {
  return amx ? amx_product_bytes(m, n, k) : layer_weight_product_bytes(m, n, k, n);
}

// RWKV-7's time mixing (rule dplr, block/rwkv7.hpp): its buffers and the largest of its calls' scratch.
std::size_t rwkv7_bytes(const LayerProblem& p, bool backward) {
  std::size_t transient = linear_forward_bytes(p, false, nullptr);
  if (backward) transient = std::max(transient, linear_backward_bytes(p, false, nullptr));
  block::rwkv7::for_each_product(p, backward, [&](bool weight, int m, int n, int k) {
    transient = std::max(transient, weight ? weight_product_bytes(m, n, k, false) : product_bytes(m, n, k, false));
  });
  const block::rwkv7::Sizes s = block::rwkv7::sizes(p, backward);
  return (s.forward() + s.backward()) * sizeof(float) + transient;
}

std::size_t forward_bytes(const LayerProblem& p, bool amx) {
  if (p.linear.dplr()) return rwkv7_bytes(p, false);
  const std::optional<CpuBf16Variant> row = amx_row(p, amx);
  const std::size_t window = form_shape(p, false).window ? sliding_window_forward_workspace_bytes(p.linear, p.window) : 0;
  std::size_t transient = std::max(linear_forward_bytes(p, false, row ? &*row : nullptr), window);
  // P = x W_in, [KDA] (x Wd) Wu, out = y Wo
  const FormShape l = form_shape(p, false);
  const int R = int(p.rows());
  transient = std::max({transient, product_bytes(R, l.cols, l.M, amx), product_bytes(R, l.M, l.M, amx)});
  if (l.r > 0) transient = std::max(transient, product_bytes(R, l.M, l.r, amx));
  return l.forward * sizeof(float) + transient;
}

std::size_t forward_backward_bytes(const LayerProblem& p, bool amx) {
  if (p.linear.dplr()) return rwkv7_bytes(p, true);
  const std::optional<CpuBf16Variant> row = amx_row(p, amx);
  const CpuBf16Variant* r = row ? &*row : nullptr;
  const FormShape l = form_shape(p, true);
  const int R = int(p.rows());
  const std::size_t kept_states = kept_states_bytes(p, amx);
  const bool kept = kept_states > 0;
  std::size_t transient =
      std::max({linear_forward_bytes(p, kept, r), linear_backward_bytes(p, kept, r),
                weight_product_bytes(l.M, l.M, R, amx), weight_product_bytes(l.M, l.cols, R, amx)});
  if (l.r > 0) transient = std::max(transient, weight_product_bytes(l.r, l.M, R, amx));
  // the row products: P, out, dy, dx and [KDA] (x Wd) Wu, d(x Wd)
  transient = std::max({transient, product_bytes(R, l.cols, l.M, amx), product_bytes(R, l.M, l.M, amx),
                        product_bytes(R, l.M, l.cols, amx)});
  if (l.r > 0)
    transient = std::max({transient, product_bytes(R, l.M, l.r, amx), product_bytes(R, l.r, l.M, amx)});
  if (l.window)
    transient = std::max({transient, sliding_window_forward_workspace_bytes(p.linear, p.window),
                          sliding_window_backward_workspace_bytes(p.linear, p.window)});
  return (l.forward + l.backward) * sizeof(float) + kept_states + transient;
}

}  // namespace

std::size_t block_kept_chunk_states_bytes(const LayerProblem& p) { return kept_states_bytes(p, false); }
std::size_t block_forward_workspace_bytes(const LayerProblem& p) { return forward_bytes(p, false); }
std::size_t block_forward_backward_workspace_bytes(const LayerProblem& p) { return forward_backward_bytes(p, false); }

void block_forward(const LayerProblem& p, const BlockArgs<float>& args, Allocator& allocator) {
  CpuOps ops{allocator, p.chunked, nullptr};
  run_block(p, args, ops, false);
}

void block_forward_backward(const LayerProblem& p, const BlockArgs<float>& args, Allocator& allocator) {
  Workspace<float> states(allocator, block_kept_chunk_states_bytes(p) / sizeof(float));
  CpuOps ops{allocator, p.chunked, states.size() ? states.data() : nullptr};
  run_block(p, args, ops, true);
}

// x (and dOut) widened once, exactly, for the float32 code around the products.
std::size_t block_forward_bf16_workspace_bytes(const LayerProblem& p) {
  return p.token_elems() * sizeof(float) + forward_bytes(p, true);
}

std::size_t block_forward_backward_bf16_workspace_bytes(const LayerProblem& p) {
  return 2 * p.token_elems() * sizeof(float) + forward_backward_bytes(p, true);
}

void block_forward_bf16(const LayerProblem& p, const BlockArgs<float>& args, const LayerBf16Tokens& tokens,
                        Allocator& allocator) {
  const std::optional<CpuBf16Variant> row = amx_row(p, true);
  Workspace<float> x(allocator, p.token_elems());
  widen_bf16(tokens.x, x.data(), x.size());
  BlockArgs<float> a = args;
  a.x = x.data();
  CpuOps ops{allocator, p.chunked, nullptr, true, row ? &*row : nullptr};
  run_block(p, a, ops, false);
}

void block_forward_backward_bf16(const LayerProblem& p, const BlockArgs<float>& args, const LayerBf16Tokens& tokens,
                                 Allocator& allocator) {
  const std::optional<CpuBf16Variant> row = amx_row(p, true);
  Workspace<float> x(allocator, p.token_elems()), dOut(allocator, p.token_elems());
  widen_bf16(tokens.x, x.data(), x.size());
  widen_bf16(tokens.dOut, dOut.data(), dOut.size());
  BlockArgs<float> a = args;
  a.x = x.data();
  a.dOut = dOut.data();
  CpuOps ops{allocator, p.chunked, nullptr, true, row ? &*row : nullptr};
  run_block(p, a, ops, true);
}

}  // namespace lattn::cpu

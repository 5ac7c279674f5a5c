// The layer on the GPU (docs/spec.md section 2): the same steps as the CPU layer (hybrid/cpu.cpp), the
// projections on the backend's sgemm (cuBLAS), the branches on the linear-attention and
// sliding-window kernels, the norm, gate and layout changes on kernels.cu's kernels, every scratch
// block from the allocator in the order of layer_scratch_slices. Host code.
#include <cuda_runtime_api.h>

#include "kernels/cuda/check.hpp"
#include "kernels/layer/hybrid/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/sliding_window/cuda.hpp"

namespace lattn::cuda {

// forward q k v Lin Swa Y and a projection tile (rows x M each), h0 (zeros, also the backward's
// dhT) and hT, the window's log-sum-exp and, for fwd_bwd, the norm's 1/RMS per row, and the
// chunked forward's chunk states; the backward then dY dLin dSwa, the two branches' dq dk dv, dg's
// row terms, the gate sums, dh0, the chunked backward's states and their gradients (its forward's
// states are not kept), and the window backward's own scratch.
std::vector<std::size_t> layer_scratch_slices(const LayerProblem& p, bool backward) {
  const std::size_t N = p.token_elems() * 4, S = p.linear.state_elems() * 4, R = p.linear.heads_total() * p.linear.seq * 4;
  const std::size_t states = p.chunked ? chunked_gated_states_bytes(p.linear, Dtype::f32) : 0;
  std::vector<std::size_t> slices = {N, N, N, N, N, N, N, S, S, R};
  if (backward) slices.push_back(R);  // rinv
  if (states) slices.push_back(states);
  if (!backward) return slices;
  for (int i = 0; i < 10; ++i) slices.push_back(N);
  slices.push_back(R);  // gate
  slices.push_back(S);  // dh0
  if (states) slices.insert(slices.end(), {states, states});
  const SwaProblem w{p.linear.batch, p.linear.heads, p.linear.seq, p.linear.dim, p.window};
  slices.push_back(swa_backward_workspace_bytes(w));
  return slices;
}

void layer_enqueue(const LayerProblem& p, bool backward, const LayerBackwardArgs<float>& a, Allocator& arena,
                   const DeviceGemm& gemm, cudaStream_t stream) {
  const Problem& lp = p.linear;
  const std::size_t N = p.token_elems(), S = lp.state_elems(), R = lp.heads_total() * lp.seq;
  const int M = int(p.model_dim()), rows = int(p.rows());
  Workspace<float> q(arena, N), k(arena, N), v(arena, N), lin(arena, N), swa(arena, N), y(arena, N), tile(arena, N),
      h0(arena, S), hT(arena, S), lse(arena, R);
  Workspace<float> rinv(arena, backward ? R : 0);
  LATTN_CUDA_CHECK(cudaMemsetAsync(h0.data(), 0, S * sizeof(float), stream));

  const float* w[3] = {a.wq, a.wk, a.wv};
  float* qkv[3] = {q.data(), k.data(), v.data()};
  for (int i = 0; i < 3; ++i) {
    gemm(false, false, rows, M, M, a.x, M, w[i], M, 0.0f, tile.data(), M);
    layer_rows_to_heads(p, tile.data(), M, qkv[i], stream);
  }
  const DeviceForward linear{q.data(), k.data(), v.data(), h0.data(), lin.data(), hT.data()};
  if (p.chunked)
    chunked_gated_forward(lp, Dtype::f32, linear, arena, stream);
  else
    scan_forward(lp, Dtype::f32, linear, arena, stream);
  const SwaProblem wp{lp.batch, lp.heads, lp.seq, lp.dim, p.window};
  swa_forward(wp, Dtype::f32, {q.data(), k.data(), v.data(), swa.data(), lse.data()}, arena, stream);
  layer_norm_gate_forward(p, a.g, a.beta, lin.data(), swa.data(), y.data(), rinv.data(), stream);
  gemm(false, false, rows, M, M, y.data(), M, a.wo, M, 0.0f, a.out, M);
  if (!backward) return;

  Workspace<float> dy(arena, N), dlin(arena, N), dswa(arena, N), dq(arena, N), dk(arena, N), dv(arena, N),
      dq2(arena, N), dk2(arena, N), dv2(arena, N), dg_terms(arena, N), gate(arena, R), dh0(arena, S);
  gemm(true, false, M, M, rows, y.data(), M, a.dOut, M, 0.0f, a.dwo, M);
  gemm(false, true, rows, M, M, a.dOut, M, a.wo, M, 0.0f, dy.data(), M);
  layer_norm_gate_backward(p,
                           {a.g, a.beta, lin.data(), swa.data(), rinv.data(), dy.data(), dlin.data(), dswa.data(),
                            dg_terms.data(), gate.data(), a.dg, a.dbeta},
                           stream);
  // h0 = 0 is dhT = 0 too: nothing reads the final state.
  const DeviceBackward lb{q.data(), k.data(), v.data(), h0.data(), dlin.data(),
                          h0.data(), dq.data(), dk.data(), dv.data(), dh0.data()};
  if (p.chunked)
    chunked_gated_backward(lp, Dtype::f32, lb, arena, stream);
  else
    scan_backward(lp, Dtype::f32, lb, arena, stream);
  swa_backward(wp, Dtype::f32,
               {q.data(), k.data(), v.data(), dswa.data(), swa.data(), lse.data(), dq2.data(), dk2.data(), dv2.data()},
               arena, stream);
  // Both branches' gradients, summed on the way back to the rows layout, into buffers the
  // backward no longer reads; then dx and the input projections' gradients.
  float* grads[3] = {tile.data(), y.data(), dg_terms.data()};
  layer_heads_to_rows(p, dq.data(), dq2.data(), grads[0], stream);
  layer_heads_to_rows(p, dk.data(), dk2.data(), grads[1], stream);
  layer_heads_to_rows(p, dv.data(), dv2.data(), grads[2], stream);
  float* dw[3] = {a.dwq, a.dwk, a.dwv};
  for (int i = 0; i < 3; ++i) {
    gemm(false, true, rows, M, M, grads[i], M, w[i], M, i == 0 ? 0.0f : 1.0f, a.dx, M);
    gemm(true, false, M, M, rows, a.x, M, grads[i], M, 0.0f, dw[i], M);
  }
}

}  // namespace lattn::cuda

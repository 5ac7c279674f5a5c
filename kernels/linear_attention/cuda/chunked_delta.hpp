// What the delta rule's chunked CUDA files share on the host (cuda/chunked_delta.cu, the host API
// and scratch; cuda/chunked_delta_prepare.cu, _states.cu, _output.cu, _dqk.cu, _wy.cu: one kernel
// each). Every pointer is device memory. The kernels' device-side helpers are in
// cuda/chunked_delta.cuh.
//
// Scratch token tensors have v's rows ([B][H][T][D] for D = Dk or Dv, a packed batch's documents one
// after another): per (sequence, value head) pair, W = T diag(beta) (K . exp(b)) (Dk wide) and U =
// T diag(beta) V, which the state pass overwrites with the pending values V_new = U - W S (Dv wide);
// the chunk states are one Dk x Dv matrix (row-major) per (chunk, value head), chunks numbered over
// every sequence in order. All three are in the token dtype (the tensor cores' operands in bf16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/dtype.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cuda {

// Mirrors DeltaShape (cuda/chunked_delta.cuh) for the launch code: host-side copies of the sizes
// and the device pointers of a packed problem's boundaries.
struct DeltaLaunch {
  const Problem* problem;
  Dtype dtype;
  int chunk;             // the chunk, at most the longest sequence
  int total_chunks;      // over every sequence, per value head
  const int* cu;         // packed: the documents' first tokens, device memory, else null
  const int* cu_chunks;  // packed: the documents' first chunks, device memory, else null
};

// Each file also gives its kernel's shared memory at the longest chunk (what the row's limits
// check) and its launch figures on the current device (*_info: kernels.hpp's ChunkedKernel).

// The chunk-parallel pass that makes W and U (cuda/chunked_delta_prepare.cu): A = beta K K^T with the
// gates (strictly lower), T = (I + A)^-1, W = T diag(beta) (K . exp(b)), U = T diag(beta) V.
void delta_prepare(const DeltaLaunch& l, const void* k, const void* v, const float* beta, const float* g, void* w,
                   void* u, cudaStream_t stream);
std::size_t delta_prepare_shared(const Problem& p, Dtype dtype);
ChunkedKernel delta_prepare_info(const Problem& p, Dtype dtype);

// The sequential pass over each pair's chunks (cuda/chunked_delta_states.cu), in blocks of 32 state
// columns. Forward: from S = h0, per chunk store S into states[c], V_new = U - W S (over U, in
// `values`), S <- exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T V_new; the last S into final_state (may
// be null). Reverse (the backward): from dS = dhT, per chunk in reverse store dS into states[c] (the
// gradient of the state leaving chunk c), dV_new = dV_local + (K . exp(b_{n-1} - b)) dS (over
// dV_local, in `values`, float32), dS <- exp(b_{n-1}) dS + s (Q . exp(b))^T dO - W^T dV_new, and
// the last dS into final_state (dh0); with gates also, per chunk, the row sums of dS . S over the
// block's columns (the state entering the chunk and its gradient, for dg) into row_sums.
struct DeltaStateArgs {
  const void* k;
  const void* w;
  const float* g;
  const float* s0;
  float* final_state;
  void* states;
  void* values;  // forward: U in, V_new out (token dtype); reverse: dV_local in, dV_new out (float32)
  // reverse only
  const void* q = nullptr;
  const void* dO = nullptr;
  const void* forward_states = nullptr;  // the forward's states, for dg's row sums
  float* row_sums = nullptr;             // [32-column block][chunk slot][Dk], gated decays only
};
void delta_state_pass(const DeltaLaunch& l, const DeltaStateArgs& a, bool reverse, cudaStream_t stream);
std::size_t delta_state_shared(const Problem& p, Dtype dtype, bool reverse);
ChunkedKernel delta_state_info(const Problem& p, Dtype dtype, bool reverse);
constexpr int kDeltaStateCols = 32;

// The chunk-parallel output (cuda/chunked_delta_output.cu), per chunk and block of 64 value columns:
// forward, O = s ((Q . exp(b)) S + A_qk V_new); backward, the local part of dV_new,
// dV_local = s A_qk^T dO (float32), with A_qk[i][m] = q_i . exp(b_i - b_m) . k_m (m <= i).
void delta_output(const DeltaLaunch& l, const void* q, const void* k, const float* g, const void* states, const void* x,
                  float* out, bool transposed, cudaStream_t stream);
std::size_t delta_output_shared(const Problem& p, Dtype dtype);
ChunkedKernel delta_output_info(const Problem& p, Dtype dtype, bool transposed);

// The backward's dq, k's write part of dk and W's gradient, per chunk and 64 key channels
// (cuda/chunked_delta_dqk.cu): dq = s exp(b) . (dO S^T) + dP * K, dk = exp(b_{n-1} - b) . (V_new dS'^T)
// + dP^T * Q, dW = -dV_new S^T, dP = s dO V_new^T (lower). dq and dk go to the value head's rows of
// the key parts ([B][H][T][Dk]) with `parts`, else to q's rows; dW has the key parts' rows too.
struct DeltaDqkArgs {
  const void *q, *k, *dO, *v_new, *states, *dstates;
  const float *g, *dv_new;
  float *dq, *dk, *dw;
  bool parts;
};
void delta_dqk(const DeltaLaunch& l, const DeltaDqkArgs& a, cudaStream_t stream);
std::size_t delta_dqk_shared(const Problem& p, Dtype dtype);
ChunkedKernel delta_dqk_info(const Problem& p, Dtype dtype);

// The backward through T, per chunk (cuda/chunked_delta_wy.cu): dv, dbeta, the rest of dk (added to
// what the dq / dk kernel wrote) and dg, from dV_new, dW and the reverse state pass's row sums.
struct DeltaWyArgs {
  const void *q, *k, *v, *v_new;
  const float *beta, *g, *dv_new, *dw, *dq, *row_sums;
  float *dk, *dv, *dbeta, *dg;
  bool parts;
};
void delta_wy(const DeltaLaunch& l, const DeltaWyArgs& a, cudaStream_t stream);
std::size_t delta_wy_shared(const Problem& p, Dtype dtype);
ChunkedKernel delta_wy_info(const Problem& p, Dtype dtype);

}  // namespace lattn::cuda

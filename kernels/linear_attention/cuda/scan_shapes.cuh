// The shapes of docs/spec.md section 1c as the scan kernels (cuda/scan.cu, cuda/scan_delta.cu) see
// them: one block row per (sequence, value head) pair, whose offsets into every tensor are those of
// Problem::slice(), computed on the device. A packed problem's document boundaries (cu_seqlens)
// live in device memory, copied there from the Problem for each call: N + 1 ints of scratch
// (scan_shape_bytes), so a block finds its document without the host walking the slices.
//
// dq and dk of a q/k head serve `group` value heads. Every scan pass writes them per value head,
// in the layout [B][H][T][Dk] ("key parts": a q/k head per value head), and sum_group_keys
// (cuda/scan.cu) adds each group's parts into dq and dk. Partials and one reduction rather than
// atomics: the result is deterministic, the per-value-head dq and dk are what dg's running sums
// need (cuda/scan.cu, cuda/scan_delta.cu), and the delta rule's last pass reads back the dk it
// wrote in the pass before, per value head. With group 1 the parts' layout is dq's own, and the
// passes write dq and dk directly (no scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cuda {

struct ScanShape {
  int T;               // tokens of a batch row (a packed batch: all its documents)
  int H, Hk, group;    // value heads, q/k heads, value heads per q/k head
  int Dk, Dv;          // key and value dims (the state is Dk x Dv)
  int gate_width;      // log-gates per token: Dk (vector), 1 (scalar), 0
  const int* cu;       // the packed documents' boundaries in device memory; null when dense
};

// One (sequence, value head) pair's rows, as Problem::slice gives them, plus `key_part`: its rows in
// the key parts (dq, dk per value head).
struct ScanSlice {
  std::size_t key, key_part, value, gate, beta, state;
  int seq, head;
};

__device__ __forceinline__ ScanSlice scan_slice(const ScanShape& s, int index) {
  const int n = index / s.H, h = index % s.H;
  const int b = s.cu ? 0 : n;
  const int start = s.cu ? s.cu[n] : 0;
  const std::size_t row = std::size_t(b) * s.H + h, at = row * s.T + start;
  ScanSlice out;
  out.key = ((std::size_t(b) * s.Hk + h / s.group) * s.T + start) * s.Dk;
  out.key_part = at * s.Dk;
  out.value = at * s.Dv;
  out.gate = at * s.gate_width;
  out.beta = at;
  out.state = (std::size_t(n) * s.H + h) * s.Dk * s.Dv;
  out.seq = s.cu ? s.cu[n + 1] - start : s.T;
  out.head = h;
  return out;
}

// The scratch a call's ScanShape takes: the document boundaries of a packed problem.
inline std::size_t scan_shape_bytes(const Problem& p) { return p.packed() ? p.cu_seqlens.size() * sizeof(int) : 0; }

// Elements of one set of key parts; none for group 1 (the passes then write dq and dk).
inline std::size_t key_part_elems(const Problem& p) {
  return p.group() > 1 ? p.heads_total() * std::size_t(p.seq) * std::size_t(p.dim) : 0;
}

// `p`'s shape, its document boundaries copied into `cu` (scan_shape_bytes of scratch). The copy is
// from pageable memory, which cudaMemcpyAsync stages before it returns: p may go as soon as it has.
inline ScanShape scan_shape(const Problem& p, const Workspace<int>& cu, cudaStream_t stream) {
  if (p.packed())
    LATTN_CUDA_CHECK(cudaMemcpyAsync(cu.data(), p.cu_seqlens.data(), scan_shape_bytes(p), cudaMemcpyHostToDevice, stream));
  return {p.seq, p.heads, p.qk_heads(), p.group(), p.dim, p.value_dim(), p.gate_width(), p.packed() ? cu.data() : nullptr};
}

}  // namespace lattn::cuda

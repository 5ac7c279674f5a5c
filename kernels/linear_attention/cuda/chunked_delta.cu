// The delta rule's chunked WY form on the GPU, every decay (docs/kernels.md; cuda/chunked_delta.hpp):
// the host API of kernels.hpp (the chunked table's `chunked_delta` row), its scratch in closed form
// and what the kernels cannot take. The launches, in order:
//   forward:   prepare (W, U; every chunk at once), state pass (h per chunk, V_new; sequential over
//              each pair's chunks), output (O; every chunk at once)
//   backward:  [prepare and state pass again, unless the forward's were kept], dV_local = s A_qk^T dO
//              (the output kernel transposed), the reverse state pass (dS per chunk, dV_new, dh0), the
//              dq / dk kernel, the WY backward (through T: dk, dv, dbeta, dg), and with grouped heads the
//              sums of each q/k head's dq and dk over its value heads.
// Scratch, each part in its own 256-byte-aligned block: a packed problem's boundaries; the forward's
// chunk states, W and U / V_new (kept for the backward, or the backward's own); the backward's
// state gradients, dV_new, dW (float32), with gated decays dg's partial sums, and with grouped heads
// dq and dk per value head.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/linear_attention/cuda/chunked_delta.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"

namespace lattn::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::size_t element_bytes(Dtype dtype) { return dtype == Dtype::f32 ? 4 : 2; }

int longest(const Problem& p) {
  if (!p.packed()) return p.seq;
  int most = 0;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n)
    most = std::max(most, p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  return most;
}

int effective_chunk(const Problem& p) { return std::max(1, std::min(p.chunk, longest(p))); }

// Every sequence's first chunk (sequences + 1 entries: the last is the total), chunks every p.chunk tokens.
std::vector<int> first_chunks(const Problem& p) {
  std::vector<int> first{0};
  for (int n = 0; n < p.sequences(); ++n) {
    const int length = p.packed() ? p.cu_seqlens[n + 1] - p.cu_seqlens[n] : p.seq;
    first.push_back(first.back() + (length + p.chunk - 1) / p.chunk);
  }
  return first;
}

std::size_t boundary_ints(const Problem& p) { return p.packed() ? 2 * p.cu_seqlens.size() : 0; }
std::size_t state_slots(const Problem& p) { return std::size_t(first_chunks(p).back()) * p.heads; }
std::size_t states_bytes(const Problem& p, Dtype dtype) {
  return state_slots(p) * std::size_t(p.dim) * p.value_dim() * element_bytes(dtype);
}
std::size_t value_rows(const Problem& p) { return p.heads_total() * std::size_t(p.seq); }
// The reverse state pass's blocks of state columns, each of which writes its row sums for dg.
std::size_t row_sum_tiles(const Problem& p) {
  return std::size_t((p.value_dim() + kDeltaStateCols - 1) / kDeltaStateCols);
}

// The forward's parts inside one block of kept_bytes: states, W, U / V_new.
struct Parts {
  void *states, *w, *uv;
};
Parts carve(const Problem& p, Dtype dtype, void* base) {
  auto* at = static_cast<unsigned char*>(base);
  Parts parts{};
  parts.states = at;
  parts.w = at + aligned(states_bytes(p, dtype));
  parts.uv = static_cast<unsigned char*>(parts.w) + aligned(value_rows(p) * p.dim * element_bytes(dtype));
  return parts;
}

// The launches' view of the problem, with a packed problem's boundaries copied to `bounds`
// (boundary_ints of scratch; from pageable memory, which cudaMemcpyAsync stages before it returns).
DeltaLaunch launch_of(const Problem& p, Dtype dtype, const Workspace<int>& bounds, std::vector<int>& host,
                      cudaStream_t stream) {
  const std::vector<int> first = first_chunks(p);
  DeltaLaunch l{&p, dtype, effective_chunk(p), first.back(), nullptr, nullptr};
  if (p.packed()) {
    host.assign(p.cu_seqlens.begin(), p.cu_seqlens.end());
    host.insert(host.end(), first.begin(), first.end());
    LATTN_CUDA_CHECK(
        cudaMemcpyAsync(bounds.data(), host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
    l.cu = bounds.data();
    l.cu_chunks = bounds.data() + p.cu_seqlens.size();
  }
  return l;
}

}  // namespace

std::size_t chunked_delta_kept_bytes(const Problem& p, Dtype dtype) {
  return aligned(states_bytes(p, dtype)) + aligned(value_rows(p) * p.dim * element_bytes(dtype)) +
         value_rows(p) * p.value_dim() * element_bytes(dtype);
}

std::size_t chunked_delta_forward_workspace_bytes(const Problem& p, Dtype dtype) {
  return boundary_ints(p) * sizeof(int) + chunked_delta_kept_bytes(p, dtype);
}

std::size_t chunked_delta_backward_workspace_bytes(const Problem& p, Dtype dtype, bool kept) {
  const std::size_t keys = value_rows(p) * p.dim, values = value_rows(p) * p.value_dim();
  const std::size_t sums = gated(p.decay) ? state_slots(p) * std::size_t(p.dim) * row_sum_tiles(p) : 0;
  return boundary_ints(p) * sizeof(int) + (kept ? 0 : chunked_delta_kept_bytes(p, dtype)) + states_bytes(p, dtype) +
         (values + keys + sums + (p.group() > 1 ? 2 * keys : 0)) * sizeof(float);
}

std::optional<std::string> chunked_delta_limits(const Problem& p) {
  if (p.dim > kDeltaMaxDim)
    return "the CUDA chunked delta kernels take dim (the key dim) up to " + std::to_string(kDeltaMaxDim) +
           ": each thread of the state pass keeps two key channels' gate sums";
  if (effective_chunk(p) > kDeltaChunkLimit)
    return "the CUDA chunked delta kernels take chunks of up to " + std::to_string(kDeltaChunkLimit) +
           " rows (the triangular solve's tile), not " + std::to_string(p.chunk);
  return std::nullopt;
}

std::optional<std::string> chunked_delta_unsupported(const Problem& p, Dtype dtype, std::size_t max_shared_bytes) {
  if (auto why = chunked_delta_limits(p)) return why;
  if (dtype == Dtype::bf16 && p.dim < kDeltaMinBf16Dim)
    return "the CUDA chunked delta kernels take bf16 from dim " + std::to_string(kDeltaMinBf16Dim) +
           ": with keys of fewer channels the delta rule's write cancels most of the state along each key, "
           "which their bf16 operands (the chunk states, V_new) cannot resolve to the bf16 tolerance (the scan "
           "keeps its state in float32)";
  const std::size_t most =
      std::max({delta_prepare_shared(p, dtype), delta_state_shared(p, dtype, false), delta_state_shared(p, dtype, true),
                delta_output_shared(p, dtype), delta_dqk_shared(p, dtype), delta_wy_shared(p, dtype)});
  if (most > max_shared_bytes)
    return "the CUDA chunked delta kernels need " + std::to_string(most) + " bytes of shared memory per block at dim " +
           std::to_string(p.dim) + "; this device has " + std::to_string(max_shared_bytes);
  return std::nullopt;
}

std::vector<ChunkedKernel> chunked_delta_kernels(const Problem& p, Dtype dtype) {
  return {delta_prepare_info(p, dtype),
          delta_state_info(p, dtype, false),
          delta_output_info(p, dtype, false),
          delta_output_info(p, dtype, true),
          delta_state_info(p, dtype, true),
          delta_dqk_info(p, dtype),
          delta_wy_info(p, dtype)};
}

void chunked_delta_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator,
                           cudaStream_t stream, void* kept) {
  if (auto why = chunked_delta_limits(p)) throw RuntimeFailure(*why);
  Workspace<int> bounds(allocator, boundary_ints(p));
  std::vector<int> host;
  const DeltaLaunch l = launch_of(p, dtype, bounds, host, stream);
  Workspace<unsigned char> own(allocator, kept ? 0 : chunked_delta_kept_bytes(p, dtype));
  const Parts f = carve(p, dtype, kept ? kept : own.data());
  delta_prepare(l, a.k, a.v, a.beta, a.g, f.w, f.uv, stream);
  DeltaStateArgs states{a.k, f.w, a.g, a.h0, a.hT, f.states, f.uv};
  delta_state_pass(l, states, false, stream);
  delta_output(l, a.q, a.k, a.g, f.states, f.uv, a.o, false, stream);
}

void chunked_delta_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator,
                            cudaStream_t stream, const void* kept) {
  if (auto why = chunked_delta_limits(p)) throw RuntimeFailure(*why);
  Workspace<int> bounds(allocator, boundary_ints(p));
  std::vector<int> host;
  const DeltaLaunch l = launch_of(p, dtype, bounds, host, stream);
  Workspace<unsigned char> own(allocator, kept ? 0 : chunked_delta_kept_bytes(p, dtype));
  const Parts f = carve(p, dtype, kept ? const_cast<void*>(kept) : own.data());
  if (!kept) {  // the forward's states, W and V_new again (no final state)
    delta_prepare(l, a.k, a.v, a.beta, a.g, f.w, f.uv, stream);
    delta_state_pass(l, {a.k, f.w, a.g, a.h0, nullptr, f.states, f.uv}, false, stream);
  }
  const std::size_t keys = value_rows(p) * p.dim, values = value_rows(p) * p.value_dim();
  const bool grouped = p.group() > 1;
  Workspace<unsigned char> dstates(allocator, states_bytes(p, dtype));
  Workspace<float> dv_new(allocator, values), dw(allocator, keys);
  Workspace<float> sums(allocator, gated(p.decay) ? state_slots(p) * std::size_t(p.dim) * row_sum_tiles(p) : 0);
  Workspace<float> dq_parts(allocator, grouped ? keys : 0), dk_parts(allocator, grouped ? keys : 0);
  const float* g = gated(p.decay) ? a.g : nullptr;
  delta_output(l, a.q, a.k, g, nullptr, a.dO, dv_new.data(), true, stream);  // dV_local = s A_qk^T dO
  DeltaStateArgs reverse{a.k, f.w, g, a.dhT, a.dh0, dstates.data(), dv_new.data()};
  reverse.q = a.q, reverse.dO = a.dO, reverse.forward_states = f.states, reverse.row_sums = sums.data();
  delta_state_pass(l, reverse, true, stream);
  float* dq = grouped ? dq_parts.data() : a.dq;
  float* dk = grouped ? dk_parts.data() : a.dk;
  delta_dqk(l, {a.q, a.k, a.dO, f.uv, f.states, dstates.data(), g, dv_new.data(), dq, dk, dw.data(), grouped}, stream);
  delta_wy(l,
           {a.q, a.k, a.v, f.uv, a.beta, g, dv_new.data(), dw.data(), dq, sums.data(), dk, a.dv, a.dbeta,
            gated(p.decay) ? a.dg : nullptr, grouped},
           stream);
  if (grouped) {
    sum_group_keys(p, dq_parts.data(), a.dq, stream);
    sum_group_keys(p, dk_parts.data(), a.dk, stream);
  }
}

}  // namespace lattn::cuda

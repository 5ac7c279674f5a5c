// What the CUDA tests hold the CUDA backend to beyond the correctness table, on a GPU (tests/cuda/)
// and on the CPU emulation (tests/cuda_emulation/test_backend.cpp): the layer case over two calls
// of one prepared case, and the scratch a call takes (layer and linear attention) against closed
// forms written out here rather than taken from the backend's own, so that the two are held to
// each other.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>

#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "test_util.hpp"

namespace lattn::test {

// Two calls of the layer case on `backend` (the second reuses the scratch and must overwrite every
// output), checked against the float64 reference.
inline Outcome run_layer_twice(Backend& backend, const LayerProblem& p, Mode mode, std::uint64_t seed = 5) {
  const Case kase = layer_case(p, mode, backend.name);
  if (auto why = backend.unsupported(kase)) throw std::runtime_error("unsupported: " + *why);
  const TensorSet all = make_case_inputs(kase, seed);
  const Reference reference = kase.op->reference(kase, all, kase.backward());
  auto prepared = backend.find(kase.op->name, kase.impl)->prepare(kase, all.inputs_for(mode));
  prepared->run();
  prepared->run();
  TensorSet outputs = make_case_outputs(kase);
  prepared->read_outputs(outputs);
  return {check_outputs(kase, outputs, reference), prepared->memory(), prepared->bwd_states()};
}

// Each block rounded up to 256 bytes: q k v Lin Swa Y and a projection tile, h0 and hT, the
// window's lse (and 1/RMS for fwd_bwd), then the chunked forward's chunk states (released when it
// returns); the backward's dY dLin dSwa, two sets of dq dk dv, dg's row terms, the gate sums, dh0,
// then the chunked backward's states and their gradients (released), then the window backward's
// one float per row.
inline std::size_t expected_cuda_layer_scratch(const LayerProblem& p, bool backward) {
  auto r256 = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t N = r256(p.token_elems() * 4), S = r256(p.linear.state_elems() * 4),
                    R = r256(p.linear.heads_total() * p.linear.seq * 4);
  const std::size_t states =
      p.chunked ? r256(p.linear.heads_total() * std::size_t(p.linear.chunks()) * p.linear.dim * p.linear.dim * 4) : 0;
  const std::size_t forward = 7 * N + 2 * S + R + (backward ? R : 0);
  if (!backward) return forward + states;
  return std::max(forward + states, forward + 10 * N + R + S + std::max(2 * states, R));
}

// A linear-attention case's temp, arg and out bytes on the CUDA backend: scan none; chunked one
// set of chunk states (B * H * chunks * D * D in the token dtype) for fwd, two for fwd_bwd (kept:
// the forward's set and the gradients' set; recomputed: the backward's two). Arguments are the
// tensors as stored (bf16 tokens at 2 bytes), outputs float32.
inline void check_linear_memory(const std::function<std::unique_ptr<Backend>(const BackendOptions&)>& make) {
  const Problem p{2, 2, 200, 16, 64, Decay::none};
  const std::size_t set = p.heads_total() * p.chunks() * p.dim * p.dim;
  for (const std::string impl : {"scan", "chunked"})
    for (const std::string dtype : {"float32", "bf16"})
      for (const Mode mode : {Mode::fwd, Mode::fwd_bwd})
        for (const bool keep : {true, false}) {
          INFO(impl << " " << dtype << " " << to_string(mode) << (keep ? " kept" : " recomputed"));
          const std::size_t es = dtype == "bf16" ? 2 : 4;
          auto backend = make(BackendOptions{0, 0, keep});
          const Outcome r = run_on(*backend, kernel_case(p, impl, mode, backend->name, dtype), 5);
          CHECK(r.check.passed);
          const std::size_t sets = impl == "scan" ? 0 : mode == Mode::fwd ? 1 : 2;
          CHECK(r.memory.temp_bytes == sets * set * es);
          CHECK(r.bwd_states == (impl == "chunked" && mode == Mode::fwd_bwd ? (keep ? "kept" : "recomputed") : ""));
          const std::size_t tokens = mode == Mode::fwd ? 3 : 4, states = mode == Mode::fwd ? 1 : 2;
          CHECK(r.memory.arg_bytes == tokens * p.token_elems() * es + states * p.state_elems() * 4);
          CHECK(r.memory.out_bytes == (tokens == 3 ? 1 : 4) * p.token_elems() * 4 + states * p.state_elems() * 4);
        }
}

// The additive rule's chunked kernels (cuda/chunked_gated*.cu) at the headline shape (batch 4, heads
// 64, seq 4096, dim 128, chunk 64), decay none (fixed gates: retnet launches alike), scalar and
// vector gates, float32 and bf16, one line each on stdout (what docs/cuda.md quotes, and what
// scripts/device_check.sh prints on a GPU). Every kernel must be able to keep the blocks per
// multiprocessor its launch bounds were built for resident.
inline void report_gated_chunked_kernels(const char* device) {
  for (Decay decay : {Decay::none, Decay::scalar, Decay::vector})
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
      const Problem p{4, 64, 4096, 128, 64, decay};
      for (const cuda::ChunkedKernel& k : cuda::chunked_gated_kernels(p, dtype)) {
        const std::string grid = k.grid_blocks ? std::to_string(k.grid_blocks) + " blocks of " : "";
        std::printf("occupancy on %s: %s %s %s: %s%d threads, %d rows per block, %zu bytes of shared memory, "
                    "launch bounds for %d blocks/SM, %d resident\n",
                    device, to_string(decay).c_str(), dtype == cuda::Dtype::f32 ? "float32" : "bf16", k.name.c_str(),
                    grid.c_str(), k.threads, k.rows_per_block, k.shared_bytes, k.launch_bounds_blocks,
                    k.resident_blocks);
        INFO(k.name);
        CHECK(k.resident_blocks >= k.launch_bounds_blocks);
      }
    }
  std::fflush(stdout);
}

// The delta rule's chunked kernels at the headline shape (chunk 64) for each kind of gate (none and
// retnet launch alike), one line each as above.
inline void report_chunked_delta_kernels(const char* device) {
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (Decay decay : {Decay::none, Decay::scalar, Decay::vector}) {
      const Problem p{4, 64, 4096, 128, 64, decay, Rule::delta};
      for (const cuda::ChunkedKernel& k : cuda::chunked_delta_kernels(p, dtype)) {
        std::printf("occupancy on %s: %s delta %s chunk 64 %s: %d threads, %zu bytes of shared memory, "
                    "launch bounds for %d blocks/SM, %d resident\n",
                    device, dtype == cuda::Dtype::f32 ? "float32" : "bf16", to_string(decay).c_str(), k.name.c_str(),
                    k.threads, k.shared_bytes, k.launch_bounds_blocks, k.resident_blocks);
        INFO(k.name);
        CHECK(k.resident_blocks >= k.launch_bounds_blocks);
      }
    }
  std::fflush(stdout);
}

}  // namespace lattn::test

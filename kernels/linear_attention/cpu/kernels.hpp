// CPU float32 kernels of docs/spec.md section 1, each entry point running the row of its form's variant
// table (cpu/variants.hpp) that takes the problem. Each runs on the OpenMP threads the caller has set
// (omp_set_num_threads) and takes every temporary from `allocator`, so temp_mb is counted.
// A fwd_bwd step is a forward, then a backward: ForwardArgs carry no dO or dhT, so no forward can
// read the gradients, which in a model arrive only after the whole forward.
// The *_workspace_bytes functions give each kernel's peak scratch in closed form; tests hold
// the kernels to them.
// bf16 token tensors take cpu/bf16.hpp's tables instead.
#pragma once

#include <cstddef>

#include "kernels/linear_attention/problem.hpp"
#include "core/workspace.hpp"

namespace lattn::cpu {

// Whether chunked_forward/backward take the register-tiled AVX-512 path now, else OpenBLAS.
bool chunked_uses_tiles();

// Threads a kernel that splits work over batch x heads will use.
int head_parallel_threads(const Problem& problem);

// Threads the scan kernels use: items are (slice, block of state columns), a slice being a
// (sequence or packed document, value head) pair, so fewer slices than threads still keeps every
// thread busy.
int scan_threads(const Problem& problem);

void scan_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator);
void scan_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator);
std::size_t scan_forward_workspace_bytes(const Problem& problem);
std::size_t scan_backward_workspace_bytes(const Problem& problem);

// The chunked backward needs the state entering each chunk of every head. A forward given `keep`
// (chunked_kept_states_bytes of it, allocated by the caller) leaves them there for a backward of
// the same problem and inputs given them as `kept`; a backward without them recomputes them, one
// head at a time per thread. chunked_kept_states_bytes is 0 where the implementation cannot keep
// them (the OpenBLAS path): pass null there.
std::size_t chunked_kept_states_bytes(const Problem& problem);
void chunked_forward(const Problem& problem, const ForwardArgs<float>& args, Allocator& allocator,
                     float* keep = nullptr);
void chunked_backward(const Problem& problem, const BackwardArgs<float>& args, Allocator& allocator,
                      const float* kept = nullptr);
std::size_t chunked_forward_workspace_bytes(const Problem& problem, bool keep = false);
std::size_t chunked_backward_workspace_bytes(const Problem& problem, bool kept = false);
// Peak scratch of chunked_forward keeping the chunk states (where it can) then chunked_backward
// taking them, the kept states included: what a fwd_bwd call holds.
std::size_t chunked_forward_backward_workspace_bytes(const Problem& problem);

}  // namespace lattn::cpu

// The decode step on the CPU (cpu.cpp): every rule and decay, grouped heads and a Dk x Dv
// state, float32, the state updated in place. Its reference is reference.cpp beside it; the test
// table (tests/op_table.hpp) and tests/kernels/test_decode.cpp check it.
#pragma once

#include <cstddef>

#include "core/workspace.hpp"
#include "kernels/decode/problem.hpp"

namespace lattn::cpu {

void decode_step(const DecodeProblem& p, const DecodeArgs<float>& args, Allocator& allocator);
// The scratch one step takes from the allocator: each thread's row weights for one value head's tokens.
std::size_t decode_step_workspace_bytes(const DecodeProblem& p, int threads);

// rule dplr's step (cpu/dplr.cpp), which decode_step hands dplr problems, and its floats per thread.
void decode_step_dplr(const DecodeProblem& p, const DecodeArgs<float>& args, Allocator& allocator);
std::size_t decode_dplr_thread_floats(const DecodeProblem& p);
// The trapezoidal rule's step (cpu/trapezoidal.cpp), which the two above hand rule trapezoidal to.
void decode_trapezoidal_step(const DecodeProblem& p, const DecodeArgs<float>& args, Allocator& allocator);
std::size_t decode_trapezoidal_workspace_bytes(const DecodeProblem& p, int threads);

}  // namespace lattn::cpu

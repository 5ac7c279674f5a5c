// The decode step's case on the CPU (kernels/decode/cpu.hpp): the states in their pool (one slot
// per sequence, or a pool of state_slots gathered through the case's state_index), float32 or bf16,
// stepped in place call after call, and for a cold case (core/op.hpp, cache_axis) rotated over
// copies of everything a call reads and writes that together pass twice the last-level cache
// (cold.hpp), or the caches evicted before each call where those copies would not fit in memory.
// make_decode_case wraps it in an InPlaceCase (src/run/in_place_case.hpp), which re-seeds every
// copy's states from h0 outside the timed region and has the check read one step from h0.
#pragma once

#include <memory>

#include "src/run/backend.hpp"

namespace lattn::cpu {

// The prepared case and the host bytes it will hold (its estimate: the copies, the pools, the
// scratch of `threads` threads).
std::unique_ptr<PreparedCase> make_decode_case(const Case& kase, const TensorSet& inputs);
std::size_t decode_case_bytes(const Case& kase, int threads);
// How many copies a cold case rotates over (1: warm, or evicting instead).
std::size_t decode_case_copies(const Case& kase);

}  // namespace lattn::cpu

// What the block runner asks of the emulated cp.async pipeline (pipeline.cpp) around each CUDA
// thread's run of a kernel. Internal to tests/cuda_emulation.
#pragma once

#include <cstddef>

namespace lattn_emu::detail {

// Forgets the calling thread's copies (a new block starts with none).
void pipeline_reset();
// The copies the calling thread issued and has not waited for.
std::size_t pipeline_pending();

}  // namespace lattn_emu::detail

// What the block runner asks of the emulated cp.async pipeline (pipeline.cpp) around each CUDA
// thread's run of a kernel. Internal to tests/cuda_emulation.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

namespace lattn_emu::detail {

struct PipelineCopy {
  void* dst;
  const void* src;
  std::size_t bytes, zfill;
};

// One CUDA thread's copies.
struct Pipeline {
  std::vector<PipelineCopy> open;              // issued, not yet committed
  std::deque<std::vector<PipelineCopy>> groups;  // committed, oldest first
};

// Forgets the calling thread's copies (a new block starts with none).
void pipeline_reset();
// The copies the calling thread issued and has not waited for.
std::size_t pipeline_pending();
// Exchanges the calling host thread's pipeline with `other` (the fiber runner carries each CUDA
// thread's own between its turns on one host thread).
void pipeline_swap(Pipeline& other);

}  // namespace lattn_emu::detail

// The emulated cp.async pipeline (include/cuda_pipeline.h): per CUDA thread, the copies issued
// since its last commit and the committed groups not yet waited for. __pipeline_wait_prior(n)
// does every copy of all but the newest n groups, in the waiting thread, so that the copies are
// that thread's writes (ThreadSanitizer then sees a reader that lacks the barrier after the wait).
// A thread that leaves the kernel with copies it never waited for fails the launch: on a GPU they
// would land in shared memory the kernel no longer reads, which is a wasted or a misplaced wait.
#include <cuda_pipeline.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "lattn_emu/device.hpp"
#include "pipeline_state.hpp"

namespace lattn_emu::detail {
namespace {

using Copy = PipelineCopy;

thread_local Pipeline t_pipeline;

void perform(const std::vector<Copy>& group) {
  for (const Copy& c : group) {
    const std::size_t copied = c.bytes - c.zfill;
    if (copied) std::memcpy(c.dst, c.src, copied);
    std::memset(static_cast<char*>(c.dst) + copied, 0, c.zfill);
  }
}

}  // namespace

void pipeline_reset() { t_pipeline = Pipeline{}; }

void pipeline_swap(Pipeline& other) {  // member swaps: a std::deque's move allocates
  t_pipeline.open.swap(other.open);
  t_pipeline.groups.swap(other.groups);
}

std::size_t pipeline_pending() {
  std::size_t n = t_pipeline.open.size();
  for (const auto& g : t_pipeline.groups) n += g.size();
  return n;
}

}  // namespace lattn_emu::detail

using lattn_emu::detail::t_pipeline;

void __pipeline_memcpy_async(void* dst, const void* src, std::size_t size, std::size_t zfill) {
  if (size != 4 && size != 8 && size != 16)
    lattn_emu::device_fail("__pipeline_memcpy_async of " + std::to_string(size) + " bytes (4, 8 or 16 only)");
  if (reinterpret_cast<std::uintptr_t>(dst) % size || reinterpret_cast<std::uintptr_t>(src) % size)
    lattn_emu::device_fail("__pipeline_memcpy_async of " + std::to_string(size) +
                           " bytes: a pointer not aligned to the size");
  if (zfill > size) lattn_emu::device_fail("__pipeline_memcpy_async: zfill over the size");
  t_pipeline.open.push_back({dst, src, size, zfill});
}

void __pipeline_commit() {
  t_pipeline.groups.push_back(std::move(t_pipeline.open));
  t_pipeline.open.clear();
}

void __pipeline_wait_prior(std::size_t prior) {
  while (t_pipeline.groups.size() > prior) {
    lattn_emu::detail::perform(t_pipeline.groups.front());
    t_pipeline.groups.pop_front();
  }
}

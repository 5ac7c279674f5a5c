// The rules a launch configuration must keep on the GPUs the project targets (CUDA Programming
// Guide, "Compute Capabilities", sm_80 and sm_90 alike): grid y and z up to 65535 blocks, x up to
// 2^31 - 1; at most 1024 threads per block (z at most 64), and no more than the kernel's
// __launch_bounds__; dynamic shared memory above 48 KiB only after cudaFuncSetAttribute raised the
// kernel's cudaFuncAttributeMaxDynamicSharedMemorySize that far, and never above the device's
// opt-in limit. A GPU rejects such a launch (cudaGetLastError); the emulation fails it outright,
// so a test cannot pass past it. And one promise a GPU does not check: a kernel whose
// __launch_bounds__ asks for N resident blocks per multiprocessor (ptxas limits its registers for
// them) must be launched with no more dynamic shared memory (plus the 1 KiB the runtime keeps per
// block) and threads than N blocks can have on one multiprocessor; otherwise fewer run at once
// than the kernel was compiled for (its static shared memory is not counted here).
#include <string>

#include "device_state.hpp"
#include "lattn_emu/device.hpp"

namespace lattn_emu::detail {
namespace {

std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

}  // namespace

void check_launch(const LaunchConfig& c) {
  const std::string who = std::string("launch of ") + c.name + " with grid " + dims(c.grid) + ", block " +
                          dims(c.block) + ", " + std::to_string(c.shared) + " bytes of dynamic shared memory: ";
  auto fail = [&](const std::string& why) { throw Error(who + why); };
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0) fail("a grid dimension is 0");
  if (c.grid.x > 2147483647u) fail("grid x is over 2^31 - 1");
  if (c.grid.y > 65535 || c.grid.z > 65535) fail("grid y and z are limited to 65535");
  if (c.block.x == 0 || c.block.y == 0 || c.block.z == 0) fail("a block dimension is 0");
  if (c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64) fail("block dimensions are limited to (1024,1024,64)");
  const unsigned long long threads = 1ull * c.block.x * c.block.y * c.block.z;
  if (threads > 1024) fail(std::to_string(threads) + " threads per block, over 1024");
  if (c.bounds.max_threads > 0 && threads > unsigned(c.bounds.max_threads))
    fail(std::to_string(threads) + " threads per block, over the kernel's launch bounds of " +
         std::to_string(c.bounds.max_threads) + " (__launch_bounds__)");
  DeviceState& d = device();
  const std::size_t limit = shared_optin_limit();
  if (c.bounds.min_blocks > 0) {
    const std::size_t blocks = std::size_t(c.bounds.min_blocks);
    if (blocks * (c.shared + kReservedSharedPerBlock) > limit + kReservedSharedPerBlock)
      fail("__launch_bounds__ promises " + std::to_string(blocks) + " blocks per multiprocessor, but " +
           std::to_string(blocks) + " blocks of this much shared memory do not fit in one (" +
           std::to_string(limit + kReservedSharedPerBlock) + " bytes)");
    if (blocks * threads > kMaxThreadsPerMultiprocessor)
      fail("__launch_bounds__ promises " + std::to_string(blocks) + " blocks per multiprocessor, over its " +
           std::to_string(kMaxThreadsPerMultiprocessor) + " threads");
  }
  std::lock_guard lock(d.mutex);
  if (c.stream && !d.streams.count(c.stream)) fail("the stream is not a live stream");
  if (c.shared > limit)
    fail("over the device's opt-in limit of " + std::to_string(limit) + " bytes per block");
  auto it = d.max_dynamic_shared.find(c.kernel);
  const std::size_t allowed = it == d.max_dynamic_shared.end() ? kDefaultSharedPerBlock : std::size_t(it->second);
  if (c.shared > allowed)
    fail(it == d.max_dynamic_shared.end()
             ? "over 48 KiB without cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)"
             : "over the " + std::to_string(allowed) +
                   " bytes cudaFuncAttributeMaxDynamicSharedMemorySize allows this kernel");
  d.log.push_back({c.name, c.grid, c.block, c.shared});
}

}  // namespace lattn_emu::detail

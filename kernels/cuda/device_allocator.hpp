// Device memory that counts: the CUDA backend's lattn::Allocator. Like the host CountingAllocator
// (src/counting_allocator.hpp) it tracks live and peak bytes (temp_mb) and keeps freed blocks for
// reuse, so a kernel that asks for the same scratch on every call pays cudaMalloc (which can
// synchronise the device) only on the cold call, never inside a timed sample.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "workspace.hpp"

namespace lattn::cuda {

class DeviceAllocator final : public Allocator {
 public:
  DeviceAllocator() = default;
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;
  ~DeviceAllocator() override;

  // Device memory on the current device, 256-byte aligned (cudaMalloc's alignment).
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;

  std::size_t live_bytes() const;
  std::size_t peak_bytes() const;
  void reset_peak();
  void release_cache();

 private:
  mutable std::mutex mutex_;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
  std::multimap<std::size_t, void*> cache_;
};

}  // namespace lattn::cuda

// An allocator that counts live and peak bytes (temp_mb) and keeps freed blocks for reuse, so
// that a kernel asking for the same scratch on every call pays for page faults (host) or
// cudaMalloc's device synchronisation (GPU) only on the first, cold call, which compile_s
// reports, never inside the timed samples. Where the memory comes from is a RawMemory: host
// memory here, device memory in the CUDA backend (backends/cuda/device_allocator.hpp).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "core/workspace.hpp"

namespace lattn {

struct RawMemory {
  std::size_t alignment;
  void* (*allocate)(std::size_t bytes);  // throws on failure
  void (*release)(void* ptr);
};

// 64-byte aligned host memory: a cache line, and an AVX-512 register.
RawMemory host_memory();
// 256-byte aligned host memory: what the plugin interface promises a plugin's scratch (docs/spec.md
// section 5), as cudaMalloc's alignment is on the GPU.
RawMemory host_memory_256();

class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(RawMemory raw = host_memory()) : raw_(raw) {}
  CountingAllocator(const CountingAllocator&) = delete;
  CountingAllocator& operator=(const CountingAllocator&) = delete;
  ~CountingAllocator() override;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;

  std::size_t live_bytes() const;
  std::size_t peak_bytes() const;
  // Starts a new peak from the bytes live now.
  void reset_peak();
  // Returns cached blocks to the system.
  void release_cache();

 private:
  std::size_t rounded(std::size_t bytes) const { return (bytes + raw_.alignment - 1) / raw_.alignment * raw_.alignment; }

  RawMemory raw_;
  mutable std::mutex mutex_;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
  std::multimap<std::size_t, void*> cache_;  // freed blocks by size
};

}  // namespace lattn

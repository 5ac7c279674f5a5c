#include "cuda/device_allocator.hpp"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace lattn::cuda {
namespace {
constexpr std::size_t kAlignment = 256;
std::size_t rounded(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

DeviceAllocator::~DeviceAllocator() { release_cache(); }

void* DeviceAllocator::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto cached = cache_.find(rounded(bytes));
  if (cached != cache_.end()) {
    ptr = cached->second;
    cache_.erase(cached);
  } else {
    LATTN_CUDA_CHECK(cudaMalloc(&ptr, rounded(bytes)));
  }
  live_ += bytes;
  if (live_ > peak_) peak_ = live_;
  return ptr;
}

void DeviceAllocator::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= bytes;
  try {
    cache_.emplace(rounded(bytes), ptr);
  } catch (...) {
    cudaFree(ptr);
  }
}

std::size_t DeviceAllocator::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

std::size_t DeviceAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = live_;
}

void DeviceAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, ptr] : cache_) cudaFree(ptr);
  cache_.clear();
}

}  // namespace lattn::cuda

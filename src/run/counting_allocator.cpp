#include "src/run/counting_allocator.hpp"

#include <cstdlib>
#include <new>

namespace lattn {

namespace {
// `bytes` reaches aligned_alloc rounded up to the alignment (CountingAllocator::rounded).
template <std::size_t kAlignment>
RawMemory aligned_host_memory() {
  return {kAlignment,
          [](std::size_t bytes) {
            void* ptr = std::aligned_alloc(kAlignment, bytes);
            if (!ptr) throw std::bad_alloc();
            return ptr;
          },
          [](void* ptr) { std::free(ptr); }};
}
}  // namespace

RawMemory host_memory() { return aligned_host_memory<64>(); }
RawMemory host_memory_256() { return aligned_host_memory<256>(); }

CountingAllocator::~CountingAllocator() { release_cache(); }

void* CountingAllocator::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto cached = cache_.find(rounded(bytes));
  if (cached != cache_.end()) {
    ptr = cached->second;
    cache_.erase(cached);
  } else {
    ptr = raw_.allocate(rounded(bytes));
  }
  live_ += bytes;
  if (live_ > peak_) peak_ = live_;
  return ptr;
}

void CountingAllocator::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= bytes;
  try {
    cache_.emplace(rounded(bytes), ptr);
  } catch (...) {
    raw_.release(ptr);
  }
}

std::size_t CountingAllocator::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

std::size_t CountingAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void CountingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = live_;
}

void CountingAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, ptr] : cache_) raw_.release(ptr);
  cache_.clear();
}

}  // namespace lattn

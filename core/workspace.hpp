// Every temporary a kernel needs is taken from an Allocator, so the backend can count the bytes
// (temp_mb) instead of guessing them. A kernel never calls malloc/new for scratch memory itself.
#pragma once

#include <cstddef>
#include <utility>

namespace lattn {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes; throws on failure, never returns null for bytes > 0.
  virtual void* allocate(std::size_t bytes) = 0;
  // `bytes` is the size given to the allocate() that returned `ptr`.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
};

// A typed scratch buffer owned for the duration of a scope.
template <class T>
class Workspace {
 public:
  Workspace(Allocator& allocator, std::size_t count)
      : allocator_(&allocator), count_(count),
        data_(count ? static_cast<T*>(allocator.allocate(count * sizeof(T))) : nullptr) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept
      : allocator_(other.allocator_), count_(std::exchange(other.count_, 0)),
        data_(std::exchange(other.data_, nullptr)) {}
  ~Workspace() {
    if (data_) allocator_->deallocate(data_, count_ * sizeof(T));
  }

  T* data() const { return data_; }
  std::size_t size() const { return count_; }
  T& operator[](std::size_t i) const { return data_[i]; }

 private:
  Allocator* allocator_;
  std::size_t count_;
  T* data_;
};

}  // namespace lattn

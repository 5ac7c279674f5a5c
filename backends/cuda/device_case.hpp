// A case on the GPU: device copies of its input tensors (bf16 bit patterns for the tensors its op
// keeps in the case's dtype, when that is bf16), float32 outputs (but those a plugin's row names, which
// a bf16 case holds as bf16, as the plugin interface has them, widened when read), its own stream and
// events, the cold case's L2 flush, and one call: the impl's kernels, bound to the device pointers once and
// enqueued by run() and time_ms(). Every CUDA impl row prepares one of these (cuda_backend.cpp).
//
// run() enqueues one call and waits for it; time_ms(n) records a CUDA event, enqueues n calls
// back to back, records another and waits for it (one synchronisation per sample), and returns the
// events' elapsed time. A case whose `cache` is cold (core/op.hpp, cache_axis): every call is preceded by a write over a buffer twice the L2
// size, outside its own pair of events, and the sample is the sum of the n calls' event times.
// Host-device copies happen in the constructor and read_outputs(), never inside a timed region.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/plugins/plugins.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"

namespace lattn::cuda {

// Device memory of one tensor (inputs and outputs: not scratch, so not counted as temp).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer();
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// The bytes of a cold case's flush buffer on `device` (twice its L2), 0 for a warm case.
std::size_t flush_bytes(int device, const Case& kase);

class DeviceCase final : public PreparedCase {
 public:
  // One call's work, enqueued on the case's stream (asynchronous).
  using Enqueue = std::function<void()>;

  // `bf16_outputs`: the outputs a bf16 case holds as bf16 bits on the device (a plugin writes o,
  // dq, dk, dv so); read_outputs widens them.
  DeviceCase(const Case& kase, const TensorSet& inputs, int device, const std::vector<std::string>& bf16_outputs = {});
  DeviceCase(const DeviceCase&) = delete;
  DeviceCase& operator=(const DeviceCase&) = delete;
  ~DeviceCase() override;

  void* data(const std::string& name);
  float* floats(const std::string& name) { return static_cast<float*>(data(name)); }
  cudaStream_t stream() const { return stream_; }
  // Scratch from here is counted as temp, unless bind() names another count.
  CountingAllocator& allocator() { return allocator_; }

  // Set once after construction: the call; what it says of the chunk states; what the call needs
  // alive beside the buffers (released before the stream); and, for a call that takes its scratch
  // elsewhere, the peak of that scratch.
  void bind(Enqueue enqueue, std::string bwd_states = {}, std::shared_ptr<void> context = {},
            std::function<std::size_t()> scratch_peak = {});

  // Why the call's scratch is not what it takes from the allocator (a Python impl's: temp_mb is
  // then unknown), and how to watch it another way (its library's statistics: watch_scratch()).
  using ScratchWatch = std::function<std::optional<ScratchSeen>(const std::function<void()>&)>;
  void set_temp_uncounted(std::string why, ScratchWatch watch = {}) {
    temp_uncounted_ = std::move(why);
    watch_ = std::move(watch);
  }

  void run() override;
  double time_ms(int calls) override;
  void watch_scratch() override;
  MemoryUsage memory() const override;
  void read_outputs(TensorSet& outputs) override;
  std::string bwd_states() const override { return bwd_states_; }

 private:
  struct Named {
    std::string name;
    bool output = false;
    DeviceBuffer buffer;
    bool bf16 = false;  // an output held as bf16 bits
  };

  void enqueue_counted();
  double elapsed_ms();

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer flush_;
  std::vector<Named> buffers_;
  CountingAllocator allocator_;
  std::size_t temp_peak_ = 0;
  Enqueue enqueue_;
  std::string bwd_states_;
  std::shared_ptr<void> context_;
  std::function<std::size_t()> scratch_peak_;
  std::string temp_uncounted_;
  ScratchWatch watch_;
  std::optional<ScratchSeen> seen_;
};

}  // namespace lattn::cuda

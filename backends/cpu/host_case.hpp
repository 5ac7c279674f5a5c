// A case on the CPU: its own 64-byte aligned copies of the input tensors, zeroed outputs, and one
// call (the impl's kernels, bound to those buffers once) that run() and time_ms() repeat with its
// scratch counted. Every CPU impl row prepares one of these (cpu_backend.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "src/plugins/plugins.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"

namespace lattn::cpu {

// Why a CPU row that runs float32 only cannot run a case's dtype, or nothing.
std::optional<std::string> cpu_dtype_unsupported(const Case& c);

// The backend's copies of a case's tensors, in bytes (its rows' memory estimates add the scratch):
// a bf16 case's tensors in the case dtype (kernels/<op>/op.cpp's in_case_dtype) at 2 bytes each.
std::size_t host_tensor_bytes(const Case& c);

class HostCase final : public PreparedCase {
 public:
  // One call of the case's kernels, taking every temporary from the allocator.
  using Call = std::function<void(Allocator&)>;
  // Runs one call with the impl's own allocator watched (ImplFunctions::watch_scratch).
  using ScratchWatch = std::function<std::optional<ScratchSeen>(const std::function<void()>&)>;

  // `scratch`: where the counted temporaries come from (a plugin's need 256-byte alignment).
  HostCase(const Case& kase, const TensorSet& inputs, RawMemory scratch = host_memory());

  // A tensor's buffer, input or output (the output names are the op's). A bf16 case holds the
  // tensors the op stores in the case dtype as bf16 bits (bf16_data); the others are float32.
  float* data(const std::string& name);
  std::uint16_t* bf16_data(const std::string& name);
  // Either, as the case holds it.
  void* raw_data(const std::string& name);

  // Set once after construction: the call, and what it says of the chunk states (bwd_states).
  void bind(Call call, std::string bwd_states = {}) {
    call_ = std::move(call);
    bwd_states_ = std::move(bwd_states);
  }
  // Why the call's scratch is not what it takes from the allocator (temp_mb is then unknown), and
  // how to watch it another way (a Python impl's library: watch_scratch()).
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
  // A case's buffers start on 64-byte lines, as a framework's tensors do (a std::vector's large
  // buffer starts 16 bytes into its mapping): a kernel may then stream whole output lines past the
  // cache, and timings do not hinge on where malloc put the data.
  template <class T>
  struct LineAligned {
    using value_type = T;
    LineAligned() = default;
    template <class U>
    LineAligned(const LineAligned<U>&) {}
    T* allocate(std::size_t n) {
      const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      if (void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes)) return static_cast<T*>(p);
      throw std::bad_alloc();
    }
    void deallocate(T* p, std::size_t) noexcept { std::free(p); }
    friend bool operator==(const LineAligned&, const LineAligned&) { return true; }
  };
  struct Buffer {
    std::string name;
    bool output = false;
    std::vector<float, LineAligned<float>> values;
    std::vector<std::uint16_t, LineAligned<std::uint16_t>> bf16 = {};  // instead of values
    bool is_bf16 = false;
  };

  std::vector<Buffer> buffers_;
  Call call_;
  std::string bwd_states_;
  std::string temp_uncounted_;
  ScratchWatch watch_;
  std::optional<ScratchSeen> seen_;
  CountingAllocator allocator_;
  std::size_t temp_peak_ = 0;
};

}  // namespace lattn::cpu

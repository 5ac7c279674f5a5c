#include "backends/cpu/host_case.hpp"

#include <algorithm>
#include <chrono>

#include "core/error.hpp"
#include "core/op.hpp"

namespace lattn::cpu {

std::optional<std::string> cpu_dtype_unsupported(const Case& c) {
  if (c.dtype != "float32") return "the CPU backend runs float32 only, not " + c.dtype;
  return std::nullopt;
}

std::size_t host_tensor_bytes(const Case& c) { return (case_input_elems(c) + case_output_elems(c)) * sizeof(float); }

HostCase::HostCase(const Case& kase, const TensorSet& inputs, RawMemory scratch) : allocator_(scratch) {
  for (const Tensor& t : inputs) buffers_.push_back({t.name, false, {t.data.begin(), t.data.end()}});
  for (const Tensor& t : make_case_outputs(kase)) buffers_.push_back({t.name, true, {t.data.begin(), t.data.end()}});
}

float* HostCase::data(const std::string& name) {
  for (Buffer& b : buffers_)
    if (b.name == name) return b.values.data();
  throw RuntimeFailure("CPU case: no tensor '" + name + "'");
}

void HostCase::run() {
  const std::size_t live_before = allocator_.live_bytes();
  allocator_.reset_peak();
  call_(allocator_);
  temp_peak_ = std::max(temp_peak_, allocator_.peak_bytes() - live_before);
}

double HostCase::time_ms(int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) run();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

MemoryUsage HostCase::memory() const {
  MemoryUsage m;
  for (const Buffer& b : buffers_) (b.output ? m.out_bytes : m.arg_bytes) += b.values.size() * sizeof(float);
  m.temp_bytes = temp_peak_;
  m.temp_uncounted = temp_uncounted_;
  return m;
}

void HostCase::read_outputs(TensorSet& outputs) {
  for (const Buffer& b : buffers_)
    if (b.output) {
      Tensor& t = outputs.at(b.name);
      t.data.assign(b.values.begin(), b.values.end());
    }
}

}  // namespace lattn::cpu

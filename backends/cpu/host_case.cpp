#include "backends/cpu/host_case.hpp"

#include <algorithm>
#include <chrono>

#include "core/error.hpp"
#include "core/op.hpp"
#include "core/random.hpp"

namespace lattn::cpu {

namespace {

// Whether a case holds `name` as bf16: a bf16 case's tensors that the op stores in the case dtype.
bool held_as_bf16(const Case& c, const std::string& name) {
  if (c.dtype != "bf16") return false;
  for (const TensorSpec& spec : c.op->tensors)
    if (spec.name == name) return spec.in_case_dtype;
  return false;
}

}  // namespace

std::optional<std::string> cpu_dtype_unsupported(const Case& c) {
  if (c.dtype != "float32")
    return "the CPU " + c.op->name + " runs float32 only, not " + c.dtype +
           " (bf16 runs on the linear_attention scan and chunked rows)";
  return std::nullopt;
}

std::size_t host_tensor_bytes(const Case& c) {
  std::size_t bytes = 0;
  for (const TensorSpec& spec : c.op->tensors)
    if (spec.in(c)) {
      std::size_t elems = 1;
      for (std::size_t extent : spec.shape(c)) elems *= extent;
      bytes += elems * (held_as_bf16(c, spec.name) ? sizeof(std::uint16_t) : sizeof(float));
    }
  return bytes;
}

HostCase::HostCase(const Case& kase, const TensorSet& inputs, RawMemory scratch) : allocator_(scratch) {
  for (const Tensor& t : inputs) {
    if (!held_as_bf16(kase, t.name)) {
      buffers_.push_back({t.name, false, {t.data.begin(), t.data.end()}});
      continue;
    }
    // make_case_inputs rounded these to bf16 already: the conversion keeps their values.
    Buffer b{t.name, false, {}};
    b.is_bf16 = true;
    b.bf16.resize(t.data.size());
    std::transform(t.data.begin(), t.data.end(), b.bf16.begin(), float_to_bf16_bits);
    buffers_.push_back(std::move(b));
  }
  for (const Tensor& t : make_case_outputs(kase)) buffers_.push_back({t.name, true, {t.data.begin(), t.data.end()}});
}

float* HostCase::data(const std::string& name) {
  for (Buffer& b : buffers_)
    if (b.name == name) {
      if (b.is_bf16) throw RuntimeFailure("CPU case: tensor '" + name + "' is bf16");
      return b.values.data();
    }
  throw RuntimeFailure("CPU case: no tensor '" + name + "'");
}

void* HostCase::raw_data(const std::string& name) {
  for (Buffer& b : buffers_)
    if (b.name == name) return b.is_bf16 ? static_cast<void*>(b.bf16.data()) : static_cast<void*>(b.values.data());
  throw RuntimeFailure("CPU case: no tensor '" + name + "'");
}

std::uint16_t* HostCase::bf16_data(const std::string& name) {
  for (Buffer& b : buffers_)
    if (b.name == name) {
      if (!b.is_bf16) throw RuntimeFailure("CPU case: tensor '" + name + "' is not bf16");
      return b.bf16.data();
    }
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

void HostCase::watch_scratch() {
  if (watch_) seen_ = watch_([this] { run(); });
}

MemoryUsage HostCase::memory() const {
  MemoryUsage m;
  for (const Buffer& b : buffers_)
    (b.output ? m.out_bytes : m.arg_bytes) += b.values.size() * sizeof(float) + b.bf16.size() * sizeof(std::uint16_t);
  m.temp_bytes = temp_peak_;
  m.temp_uncounted = temp_uncounted_;
  if (seen_ && seen_->bytes) {  // the impl's own allocator counted it
    m.temp_bytes = std::max(temp_peak_, *seen_->bytes);
    m.temp_uncounted.clear();
    m.temp_source = seen_->source;
  } else if (seen_ && !seen_->source.empty()) {
    m.temp_uncounted += " (" + seen_->source + ")";
  }
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

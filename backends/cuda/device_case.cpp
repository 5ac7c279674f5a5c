#include "backends/cuda/device_case.hpp"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/device_allocator.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "kernels/cuda/check.hpp"

namespace lattn::cuda {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) LATTN_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

std::size_t flush_bytes(int device, const Case& kase) {
  if (!cache_cold(kase)) return 0;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::max<std::size_t>(2 * std::size_t(l2), 1 << 20);
}

namespace {

bool in_case_dtype(const Case& kase, const std::string& name) {
  for (const TensorSpec& spec : kase.op->tensors)
    if (spec.name == name) return spec.in_case_dtype;
  return false;
}

}  // namespace

DeviceCase::DeviceCase(const Case& kase, const TensorSet& inputs, int device,
                       const std::vector<std::string>& bf16_outputs)
    : device_(device), allocator_(device_memory()) {
  LATTN_CUDA_CHECK(cudaSetDevice(device_));
  LATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LATTN_CUDA_CHECK(cudaEventCreate(&start_));
  LATTN_CUDA_CHECK(cudaEventCreate(&stop_));
  if (const std::size_t bytes = flush_bytes(device_, kase)) flush_ = DeviceBuffer(bytes);
  const bool bf16 = kase.dtype == "bf16";
  for (const Tensor& t : inputs) {
    Named n{t.name, false, {}};
    if (bf16 && in_case_dtype(kase, t.name)) {
      std::vector<std::uint16_t> bits(t.data.size());
      std::transform(t.data.begin(), t.data.end(), bits.begin(), float_to_bf16_bits);
      n.buffer = DeviceBuffer(bits.size() * sizeof(std::uint16_t));
      if (!bits.empty())
        LATTN_CUDA_CHECK(cudaMemcpyAsync(n.buffer.get(), bits.data(), n.buffer.bytes(), cudaMemcpyHostToDevice, stream_));
      LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `bits` dies here
    } else {
      n.buffer = DeviceBuffer(t.bytes());
      if (!t.data.empty())
        LATTN_CUDA_CHECK(cudaMemcpyAsync(n.buffer.get(), t.data.data(), t.bytes(), cudaMemcpyHostToDevice, stream_));
    }
    buffers_.push_back(std::move(n));
  }
  for (const Tensor& t : make_case_outputs(kase)) {
    const bool half = bf16 && std::find(bf16_outputs.begin(), bf16_outputs.end(), t.name) != bf16_outputs.end();
    buffers_.push_back({t.name, true, DeviceBuffer(half ? t.elems() * sizeof(std::uint16_t) : t.bytes()), half});
  }
  LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

DeviceCase::~DeviceCase() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  context_.reset();  // what the call held (a cuBLAS handle bound to the stream) goes first
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cudaStreamDestroy(stream_);
}

void* DeviceCase::data(const std::string& name) {
  for (Named& n : buffers_)
    if (n.name == name) return n.buffer.get();
  throw RuntimeFailure("CUDA case: no tensor '" + name + "'");
}

void DeviceCase::bind(Enqueue enqueue, std::string bwd_states, std::shared_ptr<void> context,
                      std::function<std::size_t()> scratch_peak) {
  enqueue_ = std::move(enqueue);
  bwd_states_ = std::move(bwd_states);
  context_ = std::move(context);
  scratch_peak_ = std::move(scratch_peak);
}

void DeviceCase::enqueue_counted() {
  const std::size_t live_before = allocator_.live_bytes();
  allocator_.reset_peak();
  enqueue_();
  temp_peak_ = std::max(temp_peak_, allocator_.peak_bytes() - live_before);
}

void DeviceCase::run() {
  LATTN_CUDA_CHECK(cudaSetDevice(device_));
  enqueue_counted();
  LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceCase::watch_scratch() {
  if (watch_) seen_ = watch_([this] { run(); });
}

double DeviceCase::elapsed_ms() {
  LATTN_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  LATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return double(ms);
}

double DeviceCase::time_ms(int calls) {
  LATTN_CUDA_CHECK(cudaSetDevice(device_));
  if (!flush_.get()) {
    LATTN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < calls; ++i) enqueue_counted();
    LATTN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    return elapsed_ms();
  }
  double total = 0;
  for (int i = 0; i < calls; ++i) {
    LATTN_CUDA_CHECK(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.bytes(), stream_));
    LATTN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    enqueue_counted();
    LATTN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    total += elapsed_ms();
  }
  return total;
}

MemoryUsage DeviceCase::memory() const {
  MemoryUsage m;
  for (const Named& n : buffers_) (n.output ? m.out_bytes : m.arg_bytes) += n.buffer.bytes();
  m.temp_bytes = scratch_peak_ ? scratch_peak_() : temp_peak_;
  m.temp_uncounted = temp_uncounted_;
  if (seen_ && seen_->bytes) {  // the impl's own allocator counted it
    m.temp_bytes = std::max(m.temp_bytes, *seen_->bytes);
    m.temp_uncounted.clear();
    m.temp_source = seen_->source;
  } else if (seen_ && !seen_->source.empty()) {
    m.temp_uncounted += " (" + seen_->source + ")";
  }
  return m;
}

void DeviceCase::read_outputs(TensorSet& outputs) {
  LATTN_CUDA_CHECK(cudaSetDevice(device_));
  for (const Named& n : buffers_) {
    if (!n.output) continue;
    Tensor& t = outputs.at(n.name);
    if (n.bf16) {
      std::vector<std::uint16_t> bits(n.buffer.bytes() / sizeof(std::uint16_t));
      if (!bits.empty())
        LATTN_CUDA_CHECK(cudaMemcpyAsync(bits.data(), n.buffer.get(), n.buffer.bytes(), cudaMemcpyDeviceToHost, stream_));
      LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `bits` is read here
      t.data.resize(bits.size());
      std::transform(bits.begin(), bits.end(), t.data.begin(), bf16_bits_to_float);
      continue;
    }
    t.data.assign(n.buffer.bytes() / sizeof(float), 0.0f);
    if (!t.data.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(t.data.data(), n.buffer.get(), n.buffer.bytes(), cudaMemcpyDeviceToHost, stream_));
  }
  LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace lattn::cuda

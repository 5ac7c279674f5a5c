// Device memory for the emulation tests: a buffer freed at scope exit, uploads of float32 or bf16
// token tensors (bf16 as the kernels read it: 16-bit patterns), downloads, and an Allocator over
// cudaMalloc that counts what the kernels take (held to their *_workspace_bytes closed forms).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/random.hpp"
#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"

namespace lattn::emulation_test {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  float* f() const { return static_cast<float*>(ptr_); }
  std::vector<float> floats() const {
    std::vector<float> out(bytes_ / sizeof(float));
    if (bytes_) check(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

inline DeviceBuffer upload(const std::vector<float>& x) {
  DeviceBuffer b(x.size() * sizeof(float));
  if (!x.empty()) check(cudaMemcpy(b.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return b;
}

// float32, or bf16 bits by the runner's own conversion (core/random.cpp).
inline DeviceBuffer upload_tokens(const std::vector<float>& x, cuda::Dtype dtype) {
  if (dtype == cuda::Dtype::f32) return upload(x);
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16_bits(x[i]);
  DeviceBuffer b(bits.size() * 2);
  if (!bits.empty()) check(cudaMemcpy(b.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "upload");
  return b;
}

// An output buffer of n floats, NaN until a kernel writes it, so an element never written shows.
inline DeviceBuffer output(std::size_t n) {
  DeviceBuffer b(n * sizeof(float));
  if (n) check(cudaMemset(b.get(), 0xFF, n * sizeof(float)), "cudaMemset");
  return b;
}

class CountingDeviceAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc (scratch)");
    check(cudaMemset(p, 0xFF, bytes), "cudaMemset (scratch)");  // scratch starts as NaN too
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    cudaFree(p);
    live_ -= bytes;
  }
  std::size_t peak() const { return peak_; }

 private:
  std::size_t live_ = 0, peak_ = 0;
};

}  // namespace lattn::emulation_test

// The CUDA backend behind lattn::Backend. Host code only (built by the host compiler); the kernels
// are in scan.cu and chunked.cu.
//
// What a call is: the kernels of one fwd or fwd_bwd step enqueued on the case's stream. run()
// enqueues one call and waits for it; time_ms(n) records a CUDA event, enqueues n calls back to
// back, records another and waits for it (one synchronisation per sample), and returns the events'
// elapsed time. With `cold`, every call is preceded by a write over a buffer twice the L2 size,
// outside its own pair of events, and the sample is the sum of the n calls' event times.
// Host-device copies happen in prepare() and read_outputs(), never inside a timed region.
#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "build_info.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_allocator.hpp"
#include "cuda/kernels.hpp"
#include "inputs.hpp"

namespace lattn::cuda {
namespace {

// Device memory of one tensor (inputs and outputs: not scratch, so not counted as temp).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) LATTN_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  float* f() const { return static_cast<float*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

Dtype dtype_of(const std::string& name) { return name == "bf16" ? Dtype::bf16 : Dtype::f32; }

class CudaCase final : public PreparedCase {
 public:
  CudaCase(const Case& kase, const KernelTensors& in, int device, bool cold)
      : kase_(kase), dtype_(dtype_of(kase.dtype)), device_(device) {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    LATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LATTN_CUDA_CHECK(cudaEventCreate(&start_));
    LATTN_CUDA_CHECK(cudaEventCreate(&stop_));
    const Problem& p = kase.problem;
    const bool bwd = kase.mode == Mode::fwd_bwd;
    q_ = upload_tokens(in.q);
    k_ = upload_tokens(in.k);
    v_ = upload_tokens(in.v);
    h0_ = upload_floats(in.h0);
    if (bwd) {
      dO_ = upload_tokens(in.dO);
      dhT_ = upload_floats(in.dhT);
    }
    o_ = DeviceBuffer(p.token_elems() * sizeof(float));
    hT_ = DeviceBuffer(p.state_elems() * sizeof(float));
    if (bwd) {
      dq_ = DeviceBuffer(p.token_elems() * sizeof(float));
      dk_ = DeviceBuffer(p.token_elems() * sizeof(float));
      dv_ = DeviceBuffer(p.token_elems() * sizeof(float));
      dh0_ = DeviceBuffer(p.state_elems() * sizeof(float));
    }
    if (cold) {
      int l2 = 0;
      LATTN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
      flush_ = DeviceBuffer(std::max<std::size_t>(2 * std::size_t(l2), 1 << 20));
    }
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ~CudaCase() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  void run() override {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    enqueue();
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  double time_ms(int calls) override {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    if (!flush_.get()) {
      LATTN_CUDA_CHECK(cudaEventRecord(start_, stream_));
      for (int i = 0; i < calls; ++i) enqueue();
      LATTN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      return elapsed_ms();
    }
    double total = 0;
    for (int i = 0; i < calls; ++i) {
      LATTN_CUDA_CHECK(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.bytes(), stream_));
      LATTN_CUDA_CHECK(cudaEventRecord(start_, stream_));
      enqueue();
      LATTN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      total += elapsed_ms();
    }
    return total;
  }

  MemoryUsage memory() const override {
    MemoryUsage m;
    m.arg_bytes = q_.bytes() + k_.bytes() + v_.bytes() + h0_.bytes() + dO_.bytes() + dhT_.bytes();
    m.out_bytes = o_.bytes() + hT_.bytes() + dq_.bytes() + dk_.bytes() + dv_.bytes() + dh0_.bytes();
    m.temp_bytes = temp_peak_;
    return m;
  }

  void read_outputs(KernelTensors& out) override {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    download(o_, out.o);
    download(hT_, out.hT);
    download(dq_, out.dq);
    download(dk_, out.dk);
    download(dv_, out.dv);
    download(dh0_, out.dh0);
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  DeviceBuffer upload_floats(const std::vector<float>& host) {
    DeviceBuffer buffer(host.size() * sizeof(float));
    if (!host.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), host.data(), buffer.bytes(), cudaMemcpyHostToDevice, stream_));
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return buffer;
  }

  // q, k, v, dO: float32, or bf16 bit patterns (round to nearest even) for dtype bf16.
  DeviceBuffer upload_tokens(const std::vector<float>& host) {
    if (dtype_ == Dtype::f32) return upload_floats(host);
    std::vector<std::uint16_t> bits(host.size());
    std::transform(host.begin(), host.end(), bits.begin(), float_to_bf16_bits);
    DeviceBuffer buffer(bits.size() * sizeof(std::uint16_t));
    if (!bits.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), bits.data(), buffer.bytes(), cudaMemcpyHostToDevice, stream_));
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `bits` dies here
    return buffer;
  }

  void download(const DeviceBuffer& buffer, std::vector<float>& host) {
    host.assign(buffer.bytes() / sizeof(float), 0.0f);
    if (!host.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffer.get(), buffer.bytes(), cudaMemcpyDeviceToHost, stream_));
  }

  double elapsed_ms() {
    LATTN_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    LATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

  // One call's kernels, enqueued; the scratch they take is counted (none, for today's kernels).
  void enqueue() {
    const std::size_t live_before = allocator_.live_bytes();
    allocator_.reset_peak();
    const Problem& p = kase_.problem;
    const DeviceForward fwd{q_.get(), k_.get(), v_.get(), h0_.f(), o_.f(), hT_.f()};
    if (kase_.impl == Impl::scan)
      scan_forward(p, dtype_, fwd, allocator_, stream_);
    else
      chunked_forward(p, dtype_, fwd, allocator_, stream_);
    if (kase_.mode == Mode::fwd_bwd) {
      const DeviceBackward bwd{q_.get(),  k_.get(),   v_.get(),  h0_.f(),  dO_.get(),
                               dhT_.f(),  dq_.f(),    dk_.f(),   dv_.f(),  dh0_.f()};
      if (kase_.impl == Impl::scan)
        scan_backward(p, dtype_, bwd, allocator_, stream_);
      else
        chunked_backward(p, dtype_, bwd, allocator_, stream_);
    }
    temp_peak_ = std::max(temp_peak_, allocator_.peak_bytes() - live_before);
  }

  Case kase_;
  Dtype dtype_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer q_, k_, v_, h0_, dO_, dhT_, o_, hT_, dq_, dk_, dv_, dh0_, flush_;
  CountingAllocator allocator_{device_memory()};
  std::size_t temp_peak_ = 0;
};

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options)
      : threads_(options.threads), device_(options.device), cold_(options.cold) {}

  std::string name() const override { return "cuda"; }

  Availability availability() const override {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it
      int driver = 0;
      const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
      return {false, std::string("no CUDA device: ") + (no_driver ? "no NVIDIA driver is loaded here (" : "") +
                         cudaGetErrorString(status) + (no_driver ? ")" : "")};
    }
    if (count == 0) return {false, "no CUDA device: no device"};
    if (device_ >= count)
      return {false, "no CUDA device: --device " + std::to_string(device_) + " asked for, but this machine has " +
                         std::to_string(count) + " (0.." + std::to_string(count - 1) + ")"};
    return {true, ""};
  }

  std::optional<std::string> unsupported_reason(const Case& kase) const override {
    if (kase.dtype != "float32" && kase.dtype != "bf16")
      return "the CUDA backend runs float32 and bf16, not " + kase.dtype;
    const Problem& p = kase.problem;
    if (kase.impl == Impl::scan) return scan_unsupported(p);
    int shared = 0;
    if (cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_) != cudaSuccess) {
      cudaGetLastError();
      return std::string("no CUDA device: cannot read device ") + std::to_string(device_) + "'s shared memory size";
    }
    return chunked_unsupported(p, dtype_of(kase.dtype), std::size_t(shared));
  }

  nlohmann::json device_info() const override {
    nlohmann::json info = host_info(threads_);
    info["backend"] = "cuda";
    info["cuda_targets"] = LATTN_CUDA_TARGETS;
    info["nvcc"] = LATTN_NVCC_VERSION;
    info["cold_l2_flush"] = cold_;
    int runtime = 0, driver = 0;
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info["cuda_runtime"] = version_string(runtime);
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) info["driver_cuda_version"] = version_string(driver);
    const std::string release = first_line("/proc/driver/nvidia/version");
    if (!release.empty()) info["driver"] = release;
    const Availability a = availability();
    if (!a.available) {
      info["gpu"] = nullptr;
      info["unavailable"] = a.reason;
      return info;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) {
      cudaGetLastError();
      return info;
    }
    info["device_index"] = device_;
    info["gpu"] = prop.name;
    info["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    info["sm_count"] = prop.multiProcessorCount;
    info["gpu_memory_gb"] = double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    info["l2_cache_mb"] = double(prop.l2CacheSize) / (1024.0 * 1024.0);
    info["shared_memory_per_block_optin_kb"] = double(prop.sharedMemPerBlockOptin) / 1024.0;
    info["memory_bus_width_bits"] = prop.memoryBusWidth;
    auto attribute_mhz = [&](cudaDeviceAttr attr, const char* key) {
      int khz = 0;
      if (cudaDeviceGetAttribute(&khz, attr, device_) == cudaSuccess && khz > 0)
        info[key] = double(khz) / 1000.0;
      else
        cudaGetLastError();
    };
    attribute_mhz(cudaDevAttrClockRate, "sm_clock_mhz");
    attribute_mhz(cudaDevAttrMemoryClockRate, "memory_clock_mhz");
    return info;
  }

  std::unique_ptr<PreparedCase> prepare(const Case& kase, const KernelTensors& inputs) override {
    return std::make_unique<CudaCase>(kase, inputs, device_, cold_);
  }

  // Every tensor counted at 4 bytes (bf16 inputs take 2: the estimate errs high), plus the L2
  // flush buffer of --cold; the kernels' scratch is 0 (kernels.hpp).
  std::size_t memory_estimate(const Case& kase) const override {
    const Problem& p = kase.problem;
    const bool bwd = kase.mode == Mode::fwd_bwd;
    const std::size_t elems = (bwd ? 8 : 4) * p.token_elems() + (bwd ? 4 : 2) * p.state_elems();
    std::size_t flush = 0;
    int l2 = 0;
    if (cold_ && cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_) == cudaSuccess)
      flush = std::max<std::size_t>(2 * std::size_t(l2), 1 << 20);
    cudaGetLastError();
    return elems * sizeof(float) + flush;
  }

  std::size_t memory_available() const override {
    std::size_t free = 0, total = 0;
    if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return std::size_t(-1);  // cannot tell: let the allocation itself decide
    }
    return free;
  }

 private:
  int threads_;
  int device_;
  bool cold_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

}  // namespace lattn::cuda

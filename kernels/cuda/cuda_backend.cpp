// The CUDA backend behind lattn::Backend. Host code only (built by the host compiler); the kernels
// are in scan.cu, chunked.cu, sliding_window.cu and layer.cu, the layer's products on cuBLAS.
//
// What a call is: the kernels of one fwd or fwd_bwd step enqueued on the case's stream. run()
// enqueues one call and waits for it; time_ms(n) records a CUDA event, enqueues n calls back to
// back, records another and waits for it (one synchronisation per sample), and returns the events'
// elapsed time. With `cold`, every call is preceded by a write over a buffer twice the L2 size,
// outside its own pair of events, and the sample is the sum of the n calls' event times.
// Host-device copies happen in prepare() and read_outputs(), never inside a timed region.
#include "cuda/cuda_backend.hpp"

#include <cublas_v2.h>  // types and enums only: the library is opened with dlopen (cublas())
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "build_info.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_allocator.hpp"
#include "cuda/kernels.hpp"
#include "cuda/row_major_gemm.hpp"
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

// What every CUDA case shares: its device and stream, the two events of a sample, the --cold
// flush buffer, the host-device copies, and run() / time_ms() around the case's own enqueue().
class StreamCase : public PreparedCase {
 public:
  StreamCase(int device, bool cold) : device_(device) {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    LATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LATTN_CUDA_CHECK(cudaEventCreate(&start_));
    LATTN_CUDA_CHECK(cudaEventCreate(&stop_));
    if (cold) {
      int l2 = 0;
      LATTN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
      flush_ = DeviceBuffer(std::max<std::size_t>(2 * std::size_t(l2), 1 << 20));
    }
  }
  StreamCase(const StreamCase&) = delete;
  StreamCase& operator=(const StreamCase&) = delete;

  ~StreamCase() override {
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

 protected:
  // One call's work, enqueued on stream_ (asynchronous).
  virtual void enqueue() = 0;

  DeviceBuffer upload_floats(const std::vector<float>& host) {
    DeviceBuffer buffer(host.size() * sizeof(float));
    if (!host.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), host.data(), buffer.bytes(), cudaMemcpyHostToDevice, stream_));
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return buffer;
  }

  // Enqueued: the caller synchronises once after its last download.
  void download(const DeviceBuffer& buffer, std::vector<float>& host) {
    host.assign(buffer.bytes() / sizeof(float), 0.0f);
    if (!host.empty())
      LATTN_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffer.get(), buffer.bytes(), cudaMemcpyDeviceToHost, stream_));
  }

  int device_;
  cudaStream_t stream_ = nullptr;

 private:
  double elapsed_ms() {
    LATTN_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    LATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer flush_;
};

class CudaCase final : public StreamCase {
 public:
  CudaCase(const Case& kase, const KernelTensors& in, int device, bool cold)
      : StreamCase(device, cold), kase_(kase), dtype_(dtype_of(kase.dtype)) {
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
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  MemoryUsage memory() const override {
    MemoryUsage m;
    m.arg_bytes = q_.bytes() + k_.bytes() + v_.bytes() + h0_.bytes() + dO_.bytes() + dhT_.bytes();
    m.out_bytes = o_.bytes() + hT_.bytes() + dq_.bytes() + dk_.bytes() + dv_.bytes() + dh0_.bytes();
    m.temp_bytes = temp_peak_;
    return m;
  }

  // The chunked backward recomputes the chunk states per column slice (docs/cuda.md).
  std::string bwd_states() const override {
    return kase_.impl == Impl::chunked && kase_.mode == Mode::fwd_bwd ? "recomputed" : "";
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

  // One call's kernels, enqueued; the scratch they take is counted (none, for today's kernels).
  void enqueue() override {
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
  DeviceBuffer q_, k_, v_, h0_, dO_, dhT_, o_, hT_, dq_, dk_, dv_, dh0_;
  CountingAllocator allocator_{device_memory()};
  std::size_t temp_peak_ = 0;
};

// ---- The layer (SPEC section 2) ----

// cuBLAS is opened on first use, not linked: libcublasLt alone is ~540 MiB, and mapping it made
// every lattnbench start (CPU runs, --help, the tests' hundreds of runs) ~150 ms slower.
struct Cublas {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                          const float*, int, const float*, int, const float*, float*, int);
};

const Cublas& cublas() {
  static const Cublas api = [] {
    void* lib = nullptr;
    for (const char* name : {LATTN_CUBLAS_SONAME, LATTN_CUBLAS_PATH})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib)
      throw RuntimeFailure(std::string("the CUDA layer needs cuBLAS: cannot open " LATTN_CUBLAS_SONAME ": ") + dlerror());
    auto symbol = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f) throw RuntimeFailure(std::string("cuBLAS has no ") + name);
      return f;
    };
    Cublas c;
    c.create = reinterpret_cast<decltype(c.create)>(symbol("cublasCreate_v2"));
    c.destroy = reinterpret_cast<decltype(c.destroy)>(symbol("cublasDestroy_v2"));
    c.set_stream = reinterpret_cast<decltype(c.set_stream)>(symbol("cublasSetStream_v2"));
    c.set_math_mode = reinterpret_cast<decltype(c.set_math_mode)>(symbol("cublasSetMathMode"));
    c.sgemm = reinterpret_cast<decltype(c.sgemm)>(symbol("cublasSgemm_v2"));
    return c;
  }();
  return api;
}

void check_cublas(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string(__FILE__) + ":" + std::to_string(line) + ": " + call + ": cuBLAS status " +
                         std::to_string(int(status)));
}
#define LATTN_CUBLAS_CHECK(call) check_cublas((call), #call, __LINE__)

// C = op(A) op(B) + beta C for row-major m x n C, as cblas_sgemm takes it (row_major_gemm.hpp).
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  const float one = 1.0f;
  const ColumnMajorGemm g = column_major_call(trans_a, trans_b, m, n, k, A, lda, B, ldb, ldc);
  LATTN_CUBLAS_CHECK(cublas().sgemm(handle, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    g.m, g.n, g.k, &one, g.a, g.lda, g.b, g.ldb, &beta, C, g.ldc));
}

// The layer's scratch, in the order one call takes it (bytes; each slice rounded to 256 by the arena):
// forward q k v Lin Swa Y and a projection tile (rows x M each), h0 (zeros, also the backward's
// dhT) and hT, the window's log-sum-exp and, for fwd_bwd, the norm's 1/RMS per row; the backward
// then dY dLin dSwa, the two branches' dq dk dv, dg's row terms, the gate sums, dh0, and the window
// backward's own scratch.
std::vector<std::size_t> layer_scratch_slices(const LayerProblem& p, bool backward) {
  const std::size_t N = p.token_elems() * 4, S = p.linear.state_elems() * 4, R = p.linear.heads_total() * p.linear.seq * 4;
  std::vector<std::size_t> slices = {N, N, N, N, N, N, N, S, S, R};
  if (!backward) return slices;
  slices.push_back(R);  // rinv
  for (int i = 0; i < 10; ++i) slices.push_back(N);
  slices.push_back(R);  // gate
  slices.push_back(S);  // dh0
  const SwaProblem w{p.linear.batch, p.linear.heads, p.linear.seq, p.linear.dim, p.window};
  slices.push_back(swa_backward_workspace_bytes(w));
  return slices;
}

std::size_t round_up_256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

std::size_t layer_scratch_bytes(const LayerProblem& p, bool backward) {
  std::size_t total = 0;
  for (std::size_t bytes : layer_scratch_slices(p, backward)) total += round_up_256(bytes);
  return total;
}

// Scratch handed out from one device block allocated when the case is prepared: a call then never
// calls cudaMalloc or cudaFree (cudaFree waits for the whole device) inside a timed region. Blocks
// come back last-in first-out, as Workspace scopes return them.
class Arena final : public Allocator {
 public:
  explicit Arena(std::size_t capacity) : capacity_(capacity) {
    if (capacity_) LATTN_CUDA_CHECK(cudaMalloc(&base_, capacity_));
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() override {
    if (base_) cudaFree(base_);
  }
  void* allocate(std::size_t bytes) override {
    const std::size_t need = round_up_256(bytes);
    if (top_ + need > capacity_)
      throw RuntimeFailure("CUDA layer scratch: a call asked for more than the " + std::to_string(capacity_) +
                           " bytes of its closed form (layer_scratch_slices is out of step with the call)");
    starts_.push_back(top_);
    void* ptr = static_cast<char*>(base_) + top_;
    top_ += need;
    peak_ = std::max(peak_, top_);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (!starts_.empty() && ptr == static_cast<char*>(base_) + starts_.back()) {
      top_ = starts_.back();
      starts_.pop_back();
    }
  }
  std::size_t capacity() const { return capacity_; }
  std::size_t peak() const { return peak_; }

 private:
  void* base_ = nullptr;
  std::size_t capacity_ = 0, top_ = 0, peak_ = 0;
  std::vector<std::size_t> starts_;
};

class CudaLayerCase final : public StreamCase {
 public:
  CudaLayerCase(const Case& kase, const LayerTensors& in, int device, bool cold)
      : StreamCase(device, cold),
        problem_{kase.problem, kase.window, kase.impl == Impl::chunked},
        backward_(kase.mode == Mode::fwd_bwd),
        arena_(layer_scratch_bytes(problem_, backward_)) {
    LATTN_CUBLAS_CHECK(cublas().create(&blas_));
    LATTN_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
    // float32 products in float32: no TF32 tensor-core rounding of the operands.
    LATTN_CUBLAS_CHECK(cublas().set_math_mode(blas_, CUBLAS_DEFAULT_MATH));
    for (auto [buffer, host] : {std::pair{&x_, &in.x}, {&wq_, &in.wq}, {&wk_, &in.wk}, {&wv_, &in.wv},
                                {&wo_, &in.wo}, {&g_, &in.g}, {&beta_, &in.beta}, {&dOut_, &in.dOut}})
      *buffer = upload_floats(*host);
    const std::size_t N = problem_.token_elems(), W = problem_.weight_elems(), M = problem_.model_dim();
    out_ = DeviceBuffer(N * sizeof(float));
    if (backward_) {
      dx_ = DeviceBuffer(N * sizeof(float));
      for (auto* w : {&dwq_, &dwk_, &dwv_, &dwo_}) *w = DeviceBuffer(W * sizeof(float));
      dg_ = DeviceBuffer(M * sizeof(float));
      dbeta_ = DeviceBuffer(std::size_t(problem_.linear.heads) * sizeof(float));
    }
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ~CudaLayerCase() override {
    // The handle goes before the stream it was bound to (the base's destructor).
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    if (blas_) cublas().destroy(blas_);
  }

  MemoryUsage memory() const override {
    MemoryUsage m;
    for (const DeviceBuffer* b : {&x_, &wq_, &wk_, &wv_, &wo_, &g_, &beta_, &dOut_}) m.arg_bytes += b->bytes();
    for (const DeviceBuffer* b : {&out_, &dx_, &dwq_, &dwk_, &dwv_, &dwo_, &dg_, &dbeta_}) m.out_bytes += b->bytes();
    m.temp_bytes = arena_.peak();
    return m;
  }

  std::string bwd_states() const override { return problem_.chunked && backward_ ? "recomputed" : ""; }

  void read_outputs(KernelTensors&) override { throw RuntimeFailure("read_outputs on a layer case"); }

  void read_layer_outputs(LayerTensors& out) override {
    LATTN_CUDA_CHECK(cudaSetDevice(device_));
    for (auto [buffer, host] : {std::pair{&out_, &out.out}, {&dx_, &out.dx}, {&dwq_, &out.dwq}, {&dwk_, &out.dwk},
                                {&dwv_, &out.dwv}, {&dwo_, &out.dwo}, {&dg_, &out.dg}, {&dbeta_, &out.dbeta}})
      download(*buffer, *host);
    LATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // One call, enqueued: the same steps as the CPU layer (kernels/cpu/layer.cpp), the projections
  // on cuBLAS, the branches on the kernels of kernels.hpp, every scratch block from the arena in
  // the order of layer_scratch_slices.
  void enqueue() override {
    const LayerProblem& p = problem_;
    const Problem& lp = p.linear;
    const std::size_t N = p.token_elems(), S = lp.state_elems(), R = lp.heads_total() * lp.seq;
    const int M = int(p.model_dim()), rows = int(p.rows());
    Workspace<float> q(arena_, N), k(arena_, N), v(arena_, N), lin(arena_, N), swa(arena_, N), y(arena_, N),
        tile(arena_, N), h0(arena_, S), hT(arena_, S), lse(arena_, R);
    Workspace<float> rinv(arena_, backward_ ? R : 0);
    LATTN_CUDA_CHECK(cudaMemsetAsync(h0.data(), 0, S * sizeof(float), stream_));

    const float* w[3] = {wq_.f(), wk_.f(), wv_.f()};
    float* qkv[3] = {q.data(), k.data(), v.data()};
    for (int i = 0; i < 3; ++i) {
      gemm(blas_, false, false, rows, M, M, x_.f(), M, w[i], M, 0.0f, tile.data(), M);
      layer_rows_to_heads(p, tile.data(), M, qkv[i], stream_);
    }
    const DeviceForward linear{q.data(), k.data(), v.data(), h0.data(), lin.data(), hT.data()};
    if (p.chunked)
      chunked_forward(lp, Dtype::f32, linear, arena_, stream_);
    else
      scan_forward(lp, Dtype::f32, linear, arena_, stream_);
    const SwaProblem wp{lp.batch, lp.heads, lp.seq, lp.dim, p.window};
    swa_forward(wp, Dtype::f32, {q.data(), k.data(), v.data(), swa.data(), lse.data()}, arena_, stream_);
    layer_norm_gate_forward(p, g_.f(), beta_.f(), lin.data(), swa.data(), y.data(), rinv.data(), stream_);
    gemm(blas_, false, false, rows, M, M, y.data(), M, wo_.f(), M, 0.0f, out_.f(), M);
    if (!backward_) return;

    Workspace<float> dy(arena_, N), dlin(arena_, N), dswa(arena_, N), dq(arena_, N), dk(arena_, N), dv(arena_, N),
        dq2(arena_, N), dk2(arena_, N), dv2(arena_, N), dg_terms(arena_, N), gate(arena_, R), dh0(arena_, S);
    gemm(blas_, true, false, M, M, rows, y.data(), M, dOut_.f(), M, 0.0f, dwo_.f(), M);
    gemm(blas_, false, true, rows, M, M, dOut_.f(), M, wo_.f(), M, 0.0f, dy.data(), M);
    layer_norm_gate_backward(p,
                             {g_.f(), beta_.f(), lin.data(), swa.data(), rinv.data(), dy.data(), dlin.data(),
                              dswa.data(), dg_terms.data(), gate.data(), dg_.f(), dbeta_.f()},
                             stream_);
    // h0 = 0 is dhT = 0 too: nothing reads the final state.
    const DeviceBackward lb{q.data(), k.data(), v.data(), h0.data(), dlin.data(),
                            h0.data(), dq.data(), dk.data(), dv.data(), dh0.data()};
    if (p.chunked)
      chunked_backward(lp, Dtype::f32, lb, arena_, stream_);
    else
      scan_backward(lp, Dtype::f32, lb, arena_, stream_);
    swa_backward(wp, Dtype::f32,
                 {q.data(), k.data(), v.data(), dswa.data(), swa.data(), lse.data(), dq2.data(), dk2.data(), dv2.data()},
                 arena_, stream_);
    // Both branches' gradients, summed on the way back to the rows layout, into buffers the
    // backward no longer reads; then dx and the input projections' gradients.
    float* grads[3] = {tile.data(), y.data(), dg_terms.data()};
    layer_heads_to_rows(p, dq.data(), dq2.data(), grads[0], stream_);
    layer_heads_to_rows(p, dk.data(), dk2.data(), grads[1], stream_);
    layer_heads_to_rows(p, dv.data(), dv2.data(), grads[2], stream_);
    float* dw[3] = {dwq_.f(), dwk_.f(), dwv_.f()};
    for (int i = 0; i < 3; ++i) {
      gemm(blas_, false, true, rows, M, M, grads[i], M, w[i], M, i == 0 ? 0.0f : 1.0f, dx_.f(), M);
      gemm(blas_, true, false, M, M, rows, x_.f(), M, grads[i], M, 0.0f, dw[i], M);
    }
  }

  LayerProblem problem_;
  bool backward_;
  Arena arena_;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer x_, wq_, wk_, wv_, wo_, g_, beta_, dOut_, out_, dx_, dwq_, dwk_, dwv_, dwo_, dg_, dbeta_;
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
    if (kase.is_layer() && kase.dtype != "float32") return "the CUDA layer runs float32 only";
    const Problem& p = kase.problem;
    int shared = 0;
    if (cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_) != cudaSuccess) {
      cudaGetLastError();
      return std::string("no CUDA device: cannot read device ") + std::to_string(device_) + "'s shared memory size";
    }
    const Dtype dtype = dtype_of(kase.dtype);
    if (kase.is_layer())
      if (auto why = swa_unsupported({p.batch, p.heads, p.seq, p.dim, kase.window}, dtype, std::size_t(shared)))
        return why;
    if (kase.impl == Impl::scan) return scan_unsupported(p);
    return chunked_unsupported(p, dtype, std::size_t(shared));
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

  bool runs_layer_suite() const override { return true; }

  std::unique_ptr<PreparedCase> prepare_layer(const Case& kase, const LayerTensors& inputs) override {
    return std::make_unique<CudaLayerCase>(kase, inputs, device_, cold_);
  }

  // Every tensor counted at 4 bytes (bf16 inputs take 2: the estimate errs high), plus the L2
  // flush buffer of --cold; a kernel case takes no scratch (kernels.hpp), a layer case its arena.
  std::size_t memory_estimate(const Case& kase) const override {
    const Problem& p = kase.problem;
    const bool bwd = kase.mode == Mode::fwd_bwd;
    std::size_t flush = 0;  // a layer case flushes the L2 the same way (StreamCase)
    int l2 = 0;
    if (cold_ && cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_) == cudaSuccess)
      flush = std::max<std::size_t>(2 * std::size_t(l2), 1 << 20);
    cudaGetLastError();
    if (kase.is_layer()) {
      const LayerProblem layer{p, kase.window, kase.impl == Impl::chunked};
      const std::size_t tensors = (bwd ? 4 : 2) * layer.token_elems() + (bwd ? 8 : 4) * layer.weight_elems();
      return tensors * sizeof(float) + layer_scratch_bytes(layer, bwd) + flush;
    }
    const std::size_t elems = (bwd ? 8 : 4) * p.token_elems() + (bwd ? 4 : 2) * p.state_elems();
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

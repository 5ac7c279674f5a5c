// The CUDA sliding-window attention kernels (kernels/sliding_window/cuda.cu) against a naive
// float64 masked softmax on the host: O and the saved log-sum-exp L, and the gradients of <O, dO>
// (dQ, dK, dV) against their float64 analytic form; float32 and bf16 (bf16-rounded inputs for the
// reference too); window 1, window >= T, ragged T, Dh = 1..256; and the scratch against its closed
// form. Runs only with a GPU (test_cuda_main.cpp skips otherwise).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "kernels/sliding_window/cuda.hpp"
#include "core/random.hpp"

using namespace lattn;
using cuda::SwaProblem;

namespace {

std::string describe(const SwaProblem& p) {
  return "B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" +
         std::to_string(p.dim) + " W" + std::to_string(p.window);
}

// Deterministic standard-normal-ish inputs (splitmix64 + Box-Muller), bf16-rounded when asked.
std::vector<float> random_values(std::size_t n, std::uint64_t seed, bool bf16) {
  std::vector<float> out(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  for (auto& x : out) x = float(std::sqrt(-2.0 * std::log(next() + 1e-300)) * std::cos(6.283185307179586 * next()));
  if (bf16) round_to_bf16(out);
  return out;
}

struct Inputs {
  std::vector<float> q, k, v, dO;
};

struct SwaReference {
  std::vector<double> o, lse, dq, dk, dv;
};

// The naive masked softmax, O(T W) per head, and its analytic backward, all in float64.
SwaReference reference(const SwaProblem& p, const Inputs& in) {
  const int T = p.seq, D = p.dim;
  const double s = 1.0 / std::sqrt(double(D));
  SwaReference r;
  r.o.assign(p.token_elems(), 0.0);
  r.dq.assign(p.token_elems(), 0.0);
  r.dk.assign(p.token_elems(), 0.0);
  r.dv.assign(p.token_elems(), 0.0);
  r.lse.assign(p.row_elems(), 0.0);
  std::vector<double> P, dP;
  for (std::size_t bh = 0; bh < p.heads_total(); ++bh) {
    const std::size_t base = bh * std::size_t(T) * D;
    auto at = [&](const std::vector<float>& x, int t, int d) { return double(x[base + std::size_t(t) * D + d]); };
    for (int t = 0; t < T; ++t) {
      const int lo = int(std::max<long long>(0, (long long)t - p.window + 1)), n = t - lo + 1;
      P.assign(n, 0.0);
      dP.assign(n, 0.0);
      double m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += at(in.q, t, d) * at(in.k, lo + j, d);
        P[j] = s * dot;
        m = std::max(m, P[j]);
      }
      double l = 0;
      for (double& x : P) l += (x = std::exp(x - m));
      for (double& x : P) x /= l;
      r.lse[bh * T + t] = m + std::log(l);
      double Dt = 0;
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < n; ++j) o += P[j] * at(in.v, lo + j, d);
        r.o[base + std::size_t(t) * D + d] = o;
        Dt += o * at(in.dO, t, d);
      }
      for (int j = 0; j < n; ++j) {
        double g = 0;
        for (int d = 0; d < D; ++d) g += at(in.dO, t, d) * at(in.v, lo + j, d);
        const double dS = P[j] * (g - Dt);
        for (int d = 0; d < D; ++d) {
          r.dq[base + std::size_t(t) * D + d] += s * dS * at(in.k, lo + j, d);
          r.dk[base + std::size_t(lo + j) * D + d] += s * dS * at(in.q, t, d);
          r.dv[base + std::size_t(lo + j) * D + d] += P[j] * at(in.dO, t, d);
        }
      }
    }
  }
  return r;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) LATTN_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : bytes_(other.bytes_), ptr_(other.ptr_) { other.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  float* f() const { return static_cast<float*>(ptr_); }
  std::vector<float> read(std::size_t n) const {
    std::vector<float> out(n);
    if (n) LATTN_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  std::size_t bytes_;
  void* ptr_ = nullptr;
};

// A token tensor on the device as float32 or as bf16 bits. Outputs start as NaN bytes (0xFF) so a
// row the kernels never write shows.
DeviceBuffer upload(const std::vector<float>& x, cuda::Dtype dtype) {
  if (dtype == cuda::Dtype::f32) {
    DeviceBuffer b(x.size() * 4);
    LATTN_CUDA_CHECK(cudaMemcpy(b.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    return b;
  }
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16_bits(x[i]);
  DeviceBuffer b(x.size() * 2);
  LATTN_CUDA_CHECK(cudaMemcpy(b.get(), bits.data(), x.size() * 2, cudaMemcpyHostToDevice));
  return b;
}

DeviceBuffer output(std::size_t n) {
  DeviceBuffer b(n * 4);
  if (n) LATTN_CUDA_CHECK(cudaMemset(b.get(), 0xFF, n * 4));
  return b;
}

// max |got - want| / max |want| (absolute where want is all zero); NaN anywhere gives infinity.
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

struct Errors {
  double o, lse, dq, dk, dv;
  std::size_t fwd_peak, bwd_peak, live;
};

Errors run_case(const SwaProblem& p, cuda::Dtype dtype, std::uint64_t seed = 7) {
  const bool bf16 = dtype == cuda::Dtype::bf16;
  Inputs in{random_values(p.token_elems(), seed, bf16), random_values(p.token_elems(), seed + 1, bf16),
            random_values(p.token_elems(), seed + 2, bf16), random_values(p.token_elems(), seed + 3, bf16)};
  const SwaReference ref = reference(p, in);
  DeviceBuffer q = upload(in.q, dtype), k = upload(in.k, dtype), v = upload(in.v, dtype), dO = upload(in.dO, dtype);
  DeviceBuffer o = output(p.token_elems()), lse = output(p.row_elems());
  DeviceBuffer dq = output(p.token_elems()), dk = output(p.token_elems()), dv = output(p.token_elems());
  cudaStream_t stream = nullptr;
  LATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CountingAllocator allocator(cuda::device_memory());
  Errors e{};
  cuda::swa_forward(p, dtype, {q.get(), k.get(), v.get(), o.f(), lse.f()}, allocator, stream);
  e.fwd_peak = allocator.peak_bytes();
  cuda::swa_backward(p, dtype, {q.get(), k.get(), v.get(), dO.get(), o.f(), lse.f(), dq.f(), dk.f(), dv.f()}, allocator,
                     stream);
  e.bwd_peak = allocator.peak_bytes();
  e.live = allocator.live_bytes();
  LATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  LATTN_CUDA_CHECK(cudaStreamDestroy(stream));
  e.o = rel_err(o.read(p.token_elems()), ref.o);
  e.lse = rel_err(lse.read(p.row_elems()), ref.lse);
  e.dq = rel_err(dq.read(p.token_elems()), ref.dq);
  e.dk = rel_err(dk.read(p.token_elems()), ref.dk);
  e.dv = rel_err(dv.read(p.token_elems()), ref.dv);
  allocator.release_cache();
  return e;
}

std::size_t device_shared_limit() {
  int device = 0, bytes = 0;
  LATTN_CUDA_CHECK(cudaGetDevice(&device));
  LATTN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return std::size_t(bytes);
}

// float32 is the exact path (float32 arithmetic against float64: ~1e-6); bf16 rounds P and dS to
// bf16 before the tensor cores (docs/cuda.md's 3e-2). A wrong index or mask gives errors of order 1.
double tolerance(cuda::Dtype dtype) { return dtype == cuda::Dtype::f32 ? 1e-4 : 3e-2; }

void check_case(const SwaProblem& p, cuda::Dtype dtype) {
  INFO((dtype == cuda::Dtype::f32 ? "float32 " : "bf16 ") << describe(p));
  if (auto why = cuda::swa_unsupported(p, dtype, device_shared_limit())) {
    WARN("skipped: " << *why);
    return;
  }
  const Errors e = run_case(p, dtype);
  INFO("o " << e.o << " lse " << e.lse << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
  const double tol = tolerance(dtype);
  CHECK(e.o < tol);
  CHECK(e.lse < tol);
  CHECK(e.dq < tol);
  CHECK(e.dk < tol);
  CHECK(e.dv < tol);
}

const std::vector<SwaProblem>& shapes() {
  static const std::vector<SwaProblem> s = {
      {1, 2, 37, 64, 1},      // window 1: o = v, L = s q.k, dq = dk = 0
      {1, 1, 50, 32, 1000},   // window >= T: full causal attention
      {1, 1, 64, 16, 64},     // window = T = one block
      {2, 2, 100, 64, 17},    // T and W not multiples of the block
      {1, 1, 70, 1, 8},       // Dh = 1
      {1, 2, 130, 128, 40},   // Dh = 128, ragged T
      {1, 1, 300, 20, 100},   // W > Bt: several key blocks per query block, Dh not a multiple of 16
      {1, 3, 257, 48, 64},    // W = Bt, one row beyond a block
      {1, 1, 1000, 64, 129},  // long T, W = 2 Bt + 1
      {1, 1, 200, 8, 66},     // W = Bt + 2: a query block's first key block holds only its first key
      {1, 1, 150, 8, 34},     // the same for Bt 16 and 32
      {1, 1, 90, 256, 33},    // Dh = 256 (skipped where the tiles do not fit)
  };
  return s;
}

}  // namespace

TEST_CASE("CUDA sliding-window attention matches the float64 masked softmax (float32)", "[cuda][swa]") {
  for (const SwaProblem& p : shapes()) check_case(p, cuda::Dtype::f32);
}

TEST_CASE("CUDA sliding-window attention matches the float64 masked softmax (bf16)", "[cuda][swa]") {
  for (const SwaProblem& p : shapes()) check_case(p, cuda::Dtype::bf16);
}

TEST_CASE("CUDA sliding-window attention for every dim 1..128", "[cuda][swa]") {
  for (int D = 1; D <= 128; ++D)
    for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) check_case(SwaProblem{1, 1, 45, D, 1 + D % 23}, dtype);
}

TEST_CASE("CUDA sliding-window scratch matches its closed form", "[cuda][swa][memory]") {
  const SwaProblem p{2, 3, 77, 32, 20};
  CHECK(cuda::swa_forward_workspace_bytes(p) == 0);
  CHECK(cuda::swa_backward_workspace_bytes(p) == std::size_t(2) * 3 * 77 * sizeof(float));  // D, one float a row
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16}) {
    const Errors e = run_case(p, dtype);
    CHECK(e.fwd_peak == cuda::swa_forward_workspace_bytes(p));
    CHECK(e.bwd_peak == cuda::swa_backward_workspace_bytes(p));
    CHECK(e.live == 0);
  }
}

TEST_CASE("CUDA sliding-window kernels say what they cannot run", "[cuda][swa]") {
  const std::size_t limit = device_shared_limit();
  CHECK(cuda::swa_unsupported(SwaProblem{1, 1, 8, cuda::kSwaMaxDim + 1, 4}, cuda::Dtype::f32, limit).has_value());
  CHECK(cuda::swa_unsupported(SwaProblem{1, 1, 8, 64, 0}, cuda::Dtype::f32, limit).has_value());
  CHECK(cuda::swa_unsupported(SwaProblem{1, 1, 8, 64, 4}, cuda::Dtype::f32, 1024).has_value());
  CHECK_FALSE(cuda::swa_unsupported(SwaProblem{4, 64, 4096, 128, 512}, cuda::Dtype::bf16, limit).has_value());
  CHECK_FALSE(cuda::swa_unsupported(SwaProblem{4, 64, 4096, 128, 512}, cuda::Dtype::f32, limit).has_value());
  // Shared memory is O(Bt * Dh), independent of T and W.
  CHECK(cuda::swa_shared_bytes(SwaProblem{1, 1, 100, 64, 8}, cuda::Dtype::f32, true, 64) ==
        cuda::swa_shared_bytes(SwaProblem{1, 1, 100000, 64, 5000}, cuda::Dtype::f32, true, 64));
}

// Small shapes for compute-sanitizer (scripts/device_check.sh runs the [sanitize] tag).
TEST_CASE("sliding-window sanitizer shapes", "[.][sanitize]") {
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const SwaProblem& p : {SwaProblem{1, 2, 45, 20, 16}, SwaProblem{1, 1, 150, 128, 70}, SwaProblem{1, 1, 33, 13, 1}})
      check_case(p, dtype);
}

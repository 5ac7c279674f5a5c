// The emulation's own rules, each shown to hold and each check shown to fire: the block barrier,
// warp barriers and shuffles with masks, WMMA against a plain product, bf16 rounding (ties to
// even), NaN-filled shared memory, and the launch and argument checks. Written as CUDA and
// rewritten by the same build step as the project's kernels, so the rewrite is tested here too.
#include <catch2/catch.hpp>

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime_api.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/random.hpp"
#include "lattn_emu/control.hpp"

using Catch::Matchers::Contains;

namespace {

// Device memory of n T's, freed at scope exit; read back with host().
template <class T>
struct DeviceArray {
  explicit DeviceArray(std::size_t n, const T& fill = T{}) : n(n) {
    REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
    std::vector<T> init(n, fill);
    REQUIRE(cudaMemcpy(p, init.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) {
    REQUIRE(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> host() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
  T* p = nullptr;
  std::size_t n;
};

// ---- barrier
__global__ void rotate_kernel(int* out, int rounds) {
  extern __shared__ int ring[];
  const int n = int(blockDim.x), t = int(threadIdx.x);
  int value = t + 1000 * int(blockIdx.x);
  for (int r = 0; r < rounds; ++r) {
    ring[t] = value;
    __syncthreads();
    value = ring[(t + 1) % n];
    __syncthreads();
  }
  out[blockIdx.x * n + t] = value;
}

__global__ void early_return_kernel(int* out) {
  __shared__ int x[64];
  if (threadIdx.x == 3) return;
  x[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = x[(threadIdx.x + 1) % 64];
}

__global__ void warp_deadlock_kernel() {
  // Warp 0 waits at __syncwarp for lane 0, which waits at __syncthreads for warp 0.
  if (threadIdx.x == 0)
    __syncthreads();
  else if (threadIdx.x < 32)
    __syncwarp();
  else
    __syncthreads();
}

// ---- warps
__global__ void shuffle_kernel(float* sums, int* down, int* up, int* bcast, float* halves) {
  const int lane = int(threadIdx.x) & 31;
  float x = float(lane);
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  sums[threadIdx.x] = x;
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 2);
  bcast[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 5, 16);
  // The two half-warps reduce separately, each with its own mask.
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  float h = float(lane);
  for (int o = 8; o > 0; o >>= 1) h += __shfl_xor_sync(mask, h, o);
  __syncwarp(mask);
  halves[threadIdx.x] = h;
}

__global__ void bad_mask_kernel() { __syncwarp(threadIdx.x == 0 ? 0x2u : 0xffffffffu); }
__global__ void outside_mask_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, int(threadIdx.x), 20);
}
__global__ void mixed_ops_kernel(int* out) {
  if (threadIdx.x == 0)
    __syncwarp();
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}
__global__ void partial_warp_kernel() { __syncwarp(0x7fu); }
__global__ void full_mask_kernel() { __syncwarp(0xffffffffu); }
__global__ void lane_returns_kernel() {
  if (threadIdx.x == 7) return;
  __syncwarp();
}

// ---- shared memory
__global__ void read_before_write_kernel(float* dyn_out, double* static_out) {
  extern __shared__ float dyn[];
  __shared__ double stat[32];
  dyn_out[blockIdx.x * 32 + threadIdx.x] = dyn[threadIdx.x];
  static_out[blockIdx.x * 32 + threadIdx.x] = stat[threadIdx.x];
  __syncthreads();
  dyn[threadIdx.x] = 1.0f;  // the next block must not see these
  stat[threadIdx.x] = 2.0;
}

// ---- WMMA: C = A B (+ C0) on one 16 x 16 x 16 tile, A and B in shared memory in either layout.
template <bool ACol, bool BCol>
__global__ void wmma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c0, float* c, int c_col) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 As[16 * 24];
  __shared__ __align__(32) __nv_bfloat16 Bs[16 * 24];
  for (int e = int(threadIdx.x); e < 256; e += 32) {
    const int r = e / 16, k = e % 16;
    As[ACol ? k * 24 + r : r * 24 + k] = a[e];  // a, b: row-major 16 x 16 on the host
    Bs[BCol ? k * 24 + r : r * 24 + k] = b[e];
  }
  __syncwarp();
  using LA = std::conditional_t<ACol, wmma::col_major, wmma::row_major>;
  using LB = std::conditional_t<BCol, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, c0, 16, c_col ? wmma::mem_col_major : wmma::mem_row_major);
  wmma::load_matrix_sync(fa, As, 24);
  wmma::load_matrix_sync(fb, Bs, 24);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, c_col ? wmma::mem_col_major : wmma::mem_row_major);
}

// Lane `odd` makes one WMMA call more than the others: an mma_sync (no rendezvous: the lanes'
// records disagree where they next meet), or a load (which waits for lanes that never come to it).
__global__ void wmma_divergent_kernel(const __nv_bfloat16* tile, int odd, int load) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major> a;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major> b;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::fill_fragment(acc, 0.0f);
  nvcuda::wmma::load_matrix_sync(a, tile, 16);
  nvcuda::wmma::load_matrix_sync(b, tile, 16);
  nvcuda::wmma::mma_sync(acc, a, b, acc);
  if (int(threadIdx.x & 31) == odd) {
    if (load)
      nvcuda::wmma::load_matrix_sync(a, tile, 16);
    else
      nvcuda::wmma::mma_sync(acc, a, b, acc);
  }
  __syncwarp();
}

__global__ void wmma_misaligned_kernel(const float* src, int offset, unsigned ldm) {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::load_matrix_sync(acc, src + offset, ldm, nvcuda::wmma::mem_row_major);
}

// ---- launch checks
// Touches the last byte of its dynamic shared memory, so the launch really has that much.
__global__ void tiny_kernel(int* out, std::size_t shared) {
  extern __shared__ unsigned char bytes[];
  if (shared && threadIdx.x == 0 && blockIdx.x == 0) out[0] = bytes[shared - 1];
}
__global__ void __launch_bounds__(256) bounded_kernel(int* out) { out[threadIdx.x] = 1; }
__global__ void __launch_bounds__(128, 2) two_blocks_kernel(int* out) { out[threadIdx.x] = 1; }

// ---- cp.async: each thread copies 4 floats to shared memory; what it reads, and when, by `mode`.
enum AsyncMode { kCopy, kReadBeforeWait, kNoWait, kMisaligned, kZeroFill, kTwoGroups };
__global__ void async_copy_kernel(const float* src, float* out, int mode) {
  extern __shared__ float buf[];
  const int t = int(threadIdx.x), n = int(blockDim.x);
  if (mode == kMisaligned) {
    __pipeline_memcpy_async(buf + 1, src + 1, 16);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    return;
  }
  __pipeline_memcpy_async(buf + 4 * t, src + 4 * t, 16, mode == kZeroFill ? 8 : 0);
  __pipeline_commit();
  if (mode == kNoWait) return;
  if (mode == kReadBeforeWait) {
    out[t] = buf[4 * t];
    __pipeline_wait_prior(0);
    return;
  }
  if (mode == kTwoGroups) {  // a second group into the second half; wait for the first only
    __pipeline_memcpy_async(buf + 4 * (n + t), src + 4 * (n + t), 16);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    out[t] = buf[4 * (n + t)];
    __pipeline_wait_prior(0);
    return;
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  for (int u = 0; u < 4; ++u) out[4 * t + u] = buf[4 * ((t + 1) % n) + u];  // a neighbour's copy
}

float bf16_value(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("emulation: __syncthreads is a barrier over the block's threads", "[emulation][shim]") {
  DeviceArray<int> out(3 * 96);
  rotate_kernel<<<3, 96, 96 * sizeof(int)>>>(out.p, 40);
  const auto v = out.host();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 96; ++t) REQUIRE(v[b * 96 + t] == (t + 40) % 96 + 1000 * b);
}

TEST_CASE("emulation: a barrier that not every thread reaches fails the launch", "[emulation][shim]") {
  DeviceArray<int> out(64);
  CHECK_THROWS_WITH((early_return_kernel<<<1, 64>>>(out.p)), Contains("__syncthreads"));
  CHECK_THROWS_WITH((warp_deadlock_kernel<<<1, 64>>>()), Contains("deadlock"));
}

TEST_CASE("emulation: shuffles and warp barriers honour the mask and the width", "[emulation][shim]") {
  DeviceArray<float> sums(64), halves(64);
  DeviceArray<int> down(64), up(64), bcast(64);
  shuffle_kernel<<<1, 64>>>(sums.p, down.p, up.p, bcast.p, halves.p);
  const auto s = sums.host(), h = halves.host();
  const auto d = down.host(), u = up.host(), b = bcast.host();
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    CHECK(s[t] == 496.0f);  // 0 + 1 + ... + 31
    CHECK(d[t] == (lane % 8 + 3 < 8 ? lane + 3 : lane));  // width 8: past the group's end, its own
    CHECK(u[t] == (lane >= 2 ? lane - 2 : lane));
    CHECK(b[t] == (lane / 16 * 16 + 5) * 10);  // width 16: lane 5 of each half
    CHECK(h[t] == (lane < 16 ? 120.0f : 376.0f));
  }
}

TEST_CASE("emulation: warp calls outside CUDA's rules fail the launch", "[emulation][shim]") {
  DeviceArray<int> out(32);
  CHECK_THROWS_WITH((bad_mask_kernel<<<1, 32>>>()), Contains("does not contain the calling lane"));
  CHECK_THROWS_WITH((outside_mask_kernel<<<1, 32>>>(out.p)), Contains("not in the mask"));
  CHECK_THROWS_WITH((mixed_ops_kernel<<<1, 32>>>(out.p)), Contains("different calls"));
  CHECK_THROWS_WITH((lane_returns_kernel<<<1, 32>>>()), Contains("returned from the kernel"));
  partial_warp_kernel<<<1, 7>>>();  // a partial warp with a mask of its 7 lanes: fine
  CHECK_THROWS_WITH((full_mask_kernel<<<1, 16>>>()), Contains("does not have"));
}

TEST_CASE("emulation: shared memory starts every block as NaN", "[emulation][shim]") {
  DeviceArray<float> dyn(64, 0.0f);
  DeviceArray<double> stat(64, 0.0);
  read_before_write_kernel<<<2, 32, 32 * sizeof(float)>>>(dyn.p, stat.p);
  for (float x : dyn.host()) CHECK(std::isnan(x));
  for (double x : stat.host()) CHECK(std::isnan(x));
}

TEST_CASE("emulation: WMMA matches a plain product in every layout", "[emulation][shim]") {
  std::vector<float> af(256), bf(256), c0(256);
  lattn::fill_normal(af, 11, 1);
  lattn::fill_normal(bf, 11, 2);
  lattn::fill_normal(c0, 11, 3);
  std::vector<__nv_bfloat16> a(256), b(256);
  for (int e = 0; e < 256; ++e) a[e] = __float2bfloat16_rn(af[e]), b[e] = __float2bfloat16_rn(bf[e]);
  DeviceArray<__nv_bfloat16> da(a), db(b);
  for (int c_col = 0; c_col < 2; ++c_col) {
    std::vector<float> c0_stored(256);  // c0 is the logical row-major tile; store it as the kernel reads it
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) c0_stored[c_col ? c * 16 + r : r * 16 + c] = c0[r * 16 + c];
    DeviceArray<float> dc0(c0_stored), dc(256, NAN);
    for (int layout = 0; layout < 4; ++layout) {
      INFO("A col-major " << (layout & 1) << ", B col-major " << (layout >> 1) << ", C col-major " << c_col);
      switch (layout) {
        case 0: wmma_kernel<false, false><<<1, 32>>>(da.p, db.p, dc0.p, dc.p, c_col); break;
        case 1: wmma_kernel<true, false><<<1, 32>>>(da.p, db.p, dc0.p, dc.p, c_col); break;
        case 2: wmma_kernel<false, true><<<1, 32>>>(da.p, db.p, dc0.p, dc.p, c_col); break;
        default: wmma_kernel<true, true><<<1, 32>>>(da.p, db.p, dc0.p, dc.p, c_col); break;
      }
      const auto got = dc.host();
      double worst = 0;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          double want = c0[r * 16 + c];
          for (int k = 0; k < 16; ++k)
            want += double(__bfloat162float(a[r * 16 + k])) * double(__bfloat162float(b[k * 16 + c]));
          worst = std::max(worst, std::abs(got[c_col ? c * 16 + r : r * 16 + c] - want));
        }
      CHECK(worst < 1e-5);  // float32 accumulation of 16 exact products
    }
  }
}

TEST_CASE("emulation: WMMA pointers and leading dimensions are checked", "[emulation][shim]") {
  DeviceArray<float> src(16 * 40, 0.0f);
  wmma_misaligned_kernel<<<1, 32>>>(src.p, 0, 16);  // aligned, 64 bytes per row: fine
  wmma_misaligned_kernel<<<1, 32>>>(src.p, 8, 20);  // 32 bytes in, 80-byte rows: fine
  CHECK_THROWS_WITH((wmma_misaligned_kernel<<<1, 32>>>(src.p, 4, 16)), Contains("32-byte"));
  CHECK_THROWS_WITH((wmma_misaligned_kernel<<<1, 32>>>(src.p, 0, 18)), Contains("multiple of 16 bytes"));
  CHECK_THROWS_WITH((wmma_misaligned_kernel<<<1, 16>>>(src.p, 0, 16)), Contains("does not have"));
  // Every lane must make each WMMA call: one more mma_sync fails the launch where the lanes next
  // meet (here a __syncwarp), one more load at the load.
  DeviceArray<__nv_bfloat16> tile(256, __float2bfloat16_rn(1.0f));
  wmma_divergent_kernel<<<1, 64>>>(tile.p, -1, 0);
  CHECK_THROWS_WITH((wmma_divergent_kernel<<<1, 64>>>(tile.p, 5, 0)), Contains("different WMMA calls"));
  CHECK_THROWS_WITH((wmma_divergent_kernel<<<1, 64>>>(tile.p, 5, 1)), Contains("meet at different calls"));
}

TEST_CASE("emulation: bf16 conversion rounds to nearest, ties to even", "[emulation][shim]") {
  CHECK(bf16_value(from_bits32(0x3f808000u)) == 1.0f);                     // 1 + 2^-8: tie, down to even
  CHECK(bf16_value(from_bits32(0x3f818000u)) == from_bits32(0x3f820000u));  // 1 + 3 2^-8: tie, up to even
  CHECK(bf16_value(from_bits32(0x3f808001u)) == from_bits32(0x3f810000u));  // just above the tie: up
  CHECK(bf16_value(from_bits32(0x3f807fffu)) == 1.0f);                     // just below: down
  CHECK(bf16_value(from_bits32(0xbf818000u)) == from_bits32(0xbf820000u));  // the sign does not matter
  CHECK(std::isinf(bf16_value(from_bits32(0x7f7fffffu))));                 // FLT_MAX rounds to infinity
  CHECK(std::isinf(bf16_value(INFINITY)));
  CHECK(std::isnan(bf16_value(NAN)));
  CHECK(std::isnan(bf16_value(from_bits32(0x7f800001u))));  // a NaN whose payload is in the dropped bits
  CHECK(bf16_value(from_bits32(0x00008000u)) == 0.0f);      // subnormal tie, down to even (zero)
  // Against the runner's own conversion (core/random.cpp), written independently.
  std::vector<float> x(4096);
  lattn::fill_normal(x, 3, 7, 100.0);
  for (float v : x) REQUIRE(__float2bfloat16_rn(v).__x == lattn::float_to_bf16_bits(v));
}

TEST_CASE("emulation: launch configurations are checked against the device limits", "[emulation][shim]") {
  const std::size_t limit = lattn_emu::shared_optin_limit();
  int reported = 0;
  REQUIRE(cudaDeviceGetAttribute(&reported, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  CHECK(std::size_t(reported) == limit);
  DeviceArray<int> out(1024);

  tiny_kernel<<<1, 1, 48 * 1024>>>(out.p, 48 * 1024);  // 48 KiB needs no attribute
  CHECK_THROWS_WITH((tiny_kernel<<<1, 1, 48 * 1024 + 16>>>(out.p, 48 * 1024 + 16)), Contains("without cudaFuncSetAttribute"));
  REQUIRE(cudaFuncSetAttribute(tiny_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
  tiny_kernel<<<1, 1, 64 * 1024>>>(out.p, 64 * 1024);
  CHECK_THROWS_WITH((tiny_kernel<<<1, 1, 64 * 1024 + 16>>>(out.p, 64 * 1024 + 16)), Contains("allows this kernel"));
  REQUIRE(cudaFuncSetAttribute(tiny_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit)) == cudaSuccess);
  tiny_kernel<<<1, 1, limit>>>(out.p, limit);
  CHECK(cudaFuncSetAttribute(tiny_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit) + 16) ==
        cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_THROWS_WITH((tiny_kernel<<<1, 1, limit + 16>>>(out.p, limit + 16)), Contains("opt-in limit"));

  tiny_kernel<<<dim3(1, 65535, 1), 1>>>(out.p, 0);
  CHECK_THROWS_WITH((tiny_kernel<<<dim3(1, 65536, 1), 1>>>(out.p, 0)), Contains("65535"));
  CHECK_THROWS_WITH((tiny_kernel<<<dim3(1, 1, 65536), 1>>>(out.p, 0)), Contains("65535"));
  CHECK_THROWS_WITH((tiny_kernel<<<1, 1025>>>(out.p, 0)), Contains("(1024,1024,64)"));
  CHECK_THROWS_WITH((tiny_kernel<<<1, dim3(32, 32, 2)>>>(out.p, 0)), Contains("over 1024"));
  bounded_kernel<<<1, 256>>>(out.p);
  CHECK_THROWS_WITH((bounded_kernel<<<1, 257>>>(out.p)), Contains("launch bounds of 256"));
  const cudaStream_t not_a_stream = reinterpret_cast<cudaStream_t>(out.p);
  CHECK_THROWS_WITH((tiny_kernel<<<1, 1, 0, not_a_stream>>>(out.p, 0)), Contains("stream"));
}

TEST_CASE("emulation: the runtime's memory, copies, streams and events", "[emulation][shim]") {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  std::vector<char> host(1000, 7);
  CHECK(cudaMemcpy(p, host.data(), 1000, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(host.data(), p, 1000, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // the wrong way round
  CHECK(cudaMemcpy(p, host.data(), 1001, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the end
  cudaGetLastError();
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e0) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e1) == cudaSuccess);
  CHECK(cudaEventRecord(e0, s) == cudaSuccess);
  CHECK(cudaMemsetAsync(p, 0, 1000, s) == cudaSuccess);
  CHECK(cudaEventRecord(e1, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
  CHECK(ms >= 0);
  CHECK(cudaMemcpy(host.data(), p, 1000, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(host[999] == 0);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaFree(p) == cudaErrorInvalidDevicePointer);
  cudaGetLastError();
  int count = 0, device = -1;
  CHECK((cudaGetDeviceCount(&count) == cudaSuccess && count == 1));
  CHECK((cudaGetDevice(&device) == cudaSuccess && device == 0));
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  cudaGetLastError();
}

TEST_CASE("emulation: cp.async copies land at the wait, aligned, all waited for", "[emulation][shim]") {
  const int n = 64;
  std::vector<float> values(8 * n);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  DeviceArray<float> src(values), out(4 * n);
  async_copy_kernel<<<1, n, 8 * n * sizeof(float)>>>(src.p, out.p, kCopy);
  auto v = out.host();
  for (int t = 0; t < n; ++t)
    for (int u = 0; u < 4; ++u) REQUIRE(v[4 * t + u] == float(4 * ((t + 1) % n) + u));
  async_copy_kernel<<<1, n, 8 * n * sizeof(float)>>>(src.p, out.p, kZeroFill);
  v = out.host();
  for (int t = 0; t < n; ++t) {
    const int from = (t + 1) % n;
    REQUIRE((v[4 * t] == float(4 * from) && v[4 * t + 1] == float(4 * from + 1) && v[4 * t + 2] == 0 && v[4 * t + 3] == 0));
  }
  // Before its wait a thread reads what was there (NaN), also for a group younger than the one waited for.
  for (int mode : {kReadBeforeWait, kTwoGroups}) {
    async_copy_kernel<<<1, n, 8 * n * sizeof(float)>>>(src.p, out.p, mode);
    v = out.host();
    for (int t = 0; t < n; ++t) REQUIRE(std::isnan(v[t]));
  }
  CHECK_THROWS_WITH((async_copy_kernel<<<1, n, 8 * n * sizeof(float)>>>(src.p, out.p, kNoWait)), Contains("never waited"));
  CHECK_THROWS_WITH((async_copy_kernel<<<1, n, 8 * n * sizeof(float)>>>(src.p, out.p, kMisaligned)), Contains("aligned"));
}

TEST_CASE("emulation: a launch must fit the blocks per multiprocessor its launch bounds promise", "[emulation][shim]") {
  const std::size_t limit = lattn_emu::shared_optin_limit(), per_sm = limit + 1024;
  const std::size_t fits = per_sm / 2 - 1024;  // two blocks of this, each with the runtime's 1 KiB
  DeviceArray<int> out(128);
  REQUIRE(cudaFuncSetAttribute(two_blocks_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit)) == cudaSuccess);
  two_blocks_kernel<<<1, 128, fits>>>(out.p);
  CHECK_THROWS_WITH((two_blocks_kernel<<<1, 128, fits + 16>>>(out.p)), Contains("promises 2 blocks"));
  int blocks = 0;
  REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, two_blocks_kernel, 128, fits) == cudaSuccess);
  CHECK(blocks == 2);
  REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, two_blocks_kernel, 128, fits + 16) == cudaSuccess);
  CHECK(blocks == 1);
  REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, two_blocks_kernel, 128, 0) == cudaSuccess);
  CHECK(blocks == 16);  // 2048 threads
}

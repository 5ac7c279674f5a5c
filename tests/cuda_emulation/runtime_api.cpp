// The host side of the CUDA runtime API on the host: "device" memory is host memory (256-byte
// aligned like cudaMalloc's, exactly as long as asked, so AddressSanitizer sees an access past its
// end), copies are memcpy, streams run their work when it is enqueued (a launch returns when its
// grid has run), events read the host clock, and the one device reports the opt-in shared-memory
// limit the tests chose (lattn_emu/control.hpp). Errors are returned as the toolkit returns them,
// and kept as the sticky last error where the toolkit keeps them.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>

#include "device_state.hpp"
#include "lattn_emu/control.hpp"

namespace lattn_emu {
namespace detail {

DeviceState& device() {
  static DeviceState d;
  return d;
}

}  // namespace detail

namespace {

using detail::device;

constexpr std::size_t kMallocAlign = 256;
constexpr std::size_t kDeviceMemory = std::size_t(80) << 30;  // reported only (cudaMemGetInfo)

struct Allocations {
  std::mutex mutex;
  std::map<const void*, std::size_t> live;
};
Allocations& allocations() {
  static Allocations a;
  return a;
}

cudaError_t fail(cudaError_t error) {
  std::lock_guard lock(device().mutex);
  device().last_error = error;
  return error;
}

// The range [ptr, ptr + bytes) lies inside one live cudaMalloc block.
bool device_range(const void* ptr, std::size_t bytes) {
  Allocations& a = allocations();
  std::lock_guard lock(a.mutex);
  auto it = a.live.upper_bound(ptr);
  if (it == a.live.begin()) return false;
  --it;
  const char* base = static_cast<const char*>(it->first);
  const char* p = static_cast<const char*>(ptr);
  return p >= base && p + bytes <= base + it->second;
}

bool stream_ok(cudaStream_t s) {
  std::lock_guard lock(device().mutex);
  return !s || device().streams.count(s);
}

struct Event {
  std::chrono::steady_clock::time_point when{};
  bool recorded = false;
};

}  // namespace

std::size_t shared_optin_limit() {
  auto& d = device();
  std::lock_guard lock(d.mutex);
  if (d.optin == 0) {
    const char* env = std::getenv("LATTN_EMU_SHARED_OPTIN");
    d.optin = env && *env ? std::size_t(std::strtoull(env, nullptr, 10)) : kH100SharedOptin;
    if (d.optin < kDefaultSharedPerBlock) d.optin = kDefaultSharedPerBlock;
  }
  return d.optin;
}

void set_shared_optin_limit(std::size_t bytes) {
  std::lock_guard lock(device().mutex);
  device().optin = bytes;
}

std::vector<LaunchRecord> launch_log() {
  std::lock_guard lock(device().mutex);
  return device().log;
}

void clear_launch_log() {
  std::lock_guard lock(device().mutex);
  device().log.clear();
}

bool is_device_memory(const void* ptr, std::size_t bytes) { return device_range(ptr, bytes); }

}  // namespace lattn_emu

using lattn_emu::device;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

namespace {
thread_local int t_device = 0;
}

cudaError_t cudaGetDevice(int* d) {
  *d = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d != 0) return lattn_emu::fail(cudaErrorInvalidDevice);
  t_device = d;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
  if (d != 0) return lattn_emu::fail(cudaErrorInvalidDevice);
  const int optin = int(lattn_emu::shared_optin_limit());
  const bool a100 = optin <= int(lattn_emu::kA100SharedOptin);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(lattn_emu::kDefaultSharedPerBlock); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrClockRate: *value = a100 ? 1410000 : 1980000; break;
    case cudaDevAttrMultiProcessorCount: *value = a100 ? 108 : 132; break;
    case cudaDevAttrMemoryClockRate: *value = a100 ? 1593000 : 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
    case cudaDevAttrL2CacheSize: *value = a100 ? 40 << 20 : 50 << 20; break;
    case cudaDevAttrComputeCapabilityMajor: *value = a100 ? 8 : 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = optin + int(lattn_emu::kReservedSharedPerBlock); break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = int(lattn_emu::kMaxThreadsPerMultiprocessor); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = optin; break;
    default: return lattn_emu::fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int d) {
  if (d != 0) return lattn_emu::fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "lattn CPU emulation");
  int v = 0;
  cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0);
  prop->major = v;
  prop->minor = 0;
  prop->totalGlobalMem = lattn_emu::kDeviceMemory;
  prop->sharedMemPerBlock = lattn_emu::kDefaultSharedPerBlock;
  prop->sharedMemPerBlockOptin = lattn_emu::shared_optin_limit();
  cudaDeviceGetAttribute(&prop->multiProcessorCount, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&prop->l2CacheSize, cudaDevAttrL2CacheSize, 0);
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  prop->memoryBusWidth = 5120;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// CUDA 12.4, as a version number the toolkit would report; the emulation follows no one release.
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 12040;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 12040;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::size_t used = 0;
  {
    auto& a = lattn_emu::allocations();
    std::lock_guard lock(a.mutex);
    for (const auto& [p, bytes] : a.live) used += bytes;
  }
  *total_bytes = lattn_emu::kDeviceMemory;
  *free_bytes = used < lattn_emu::kDeviceMemory ? lattn_emu::kDeviceMemory - used : 0;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  std::lock_guard lock(device().mutex);
  const cudaError_t e = device().last_error;
  device().last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  std::lock_guard lock(device().mutex);
  return device().last_error;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* p = ::operator new(bytes, std::align_val_t(lattn_emu::kMallocAlign), std::nothrow);
  if (!p) return lattn_emu::fail(cudaErrorMemoryAllocation);
  auto& a = lattn_emu::allocations();
  std::lock_guard lock(a.mutex);
  a.live[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto& a = lattn_emu::allocations();
  {
    std::lock_guard lock(a.mutex);
    if (!a.live.erase(ptr)) return lattn_emu::fail(cudaErrorInvalidDevicePointer);
  }
  ::operator delete(ptr, std::align_val_t(lattn_emu::kMallocAlign));
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!lattn_emu::stream_ok(s)) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  // The direction must match where the pointers live: a host pointer passed as a device one is
  // an error a GPU reports, and one the emulation could otherwise not see.
  const bool dst_device = lattn_emu::device_range(dst, bytes), src_device = lattn_emu::device_range(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_device; break;
    case cudaMemcpyDeviceToHost: ok = src_device; break;
    case cudaMemcpyDeviceToDevice: ok = dst_device && src_device; break;
    case cudaMemcpyHostToHost: case cudaMemcpyDefault: break;
    default: return lattn_emu::fail(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) return lattn_emu::fail(cudaErrorInvalidValue);
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, std::size_t bytes, cudaStream_t s) {
  if (!lattn_emu::stream_ok(s)) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!lattn_emu::device_range(ptr, bytes)) return lattn_emu::fail(cudaErrorInvalidValue);
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes) { return cudaMemsetAsync(ptr, value, bytes, nullptr); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  // A stream is a handle only: work runs when it is enqueued.
  *stream = reinterpret_cast<cudaStream_t>(new char);
  std::lock_guard lock(device().mutex);
  device().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {
    std::lock_guard lock(device().mutex);
    if (!device().streams.erase(stream)) {
      device().last_error = cudaErrorInvalidResourceHandle;
      return cudaErrorInvalidResourceHandle;
    }
  }
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return lattn_emu::stream_ok(s) ? cudaSuccess : lattn_emu::fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new lattn_emu::Event);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<lattn_emu::Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t s) {
  if (!event) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  if (!lattn_emu::stream_ok(s)) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  auto* e = reinterpret_cast<lattn_emu::Event*>(event);
  e->when = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event ? cudaSuccess : lattn_emu::fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto* a = reinterpret_cast<lattn_emu::Event*>(start);
  auto* b = reinterpret_cast<lattn_emu::Event*>(end);
  if (!a || !b) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return lattn_emu::fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return lattn_emu::fail(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || std::size_t(value) > lattn_emu::shared_optin_limit()) return lattn_emu::fail(cudaErrorInvalidValue);
    std::lock_guard lock(device().mutex);
    device().max_dynamic_shared[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
    return value >= -1 && value <= 100 ? cudaSuccess : lattn_emu::fail(cudaErrorInvalidValue);
  return lattn_emu::fail(cudaErrorInvalidValue);
}

// Resident blocks per multiprocessor by the two resources the emulation knows, the threads and
// the shared memory (the launch's dynamic bytes plus the runtime's 1 KiB per block), and the
// 32-block cap of sm_80 and sm_90. Registers are not known here (the kernel is host code), so
// where they bind, a GPU reports fewer.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func, int block_size,
                                                          std::size_t dynamic_shared) {
  if (!blocks || !func || block_size <= 0 || block_size > 1024) return lattn_emu::fail(cudaErrorInvalidValue);
  const std::size_t per_sm = lattn_emu::shared_optin_limit() + lattn_emu::kReservedSharedPerBlock;
  const std::size_t by_shared = per_sm / (dynamic_shared + lattn_emu::kReservedSharedPerBlock);
  const std::size_t by_threads = lattn_emu::kMaxThreadsPerMultiprocessor / std::size_t((block_size + 31) / 32 * 32);
  *blocks = int(std::min<std::size_t>({by_shared, by_threads, 32}));
  return cudaSuccess;
}

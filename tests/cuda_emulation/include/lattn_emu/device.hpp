// What emulated device code sees of the thread running it: the built-in index variables, the
// block barrier, warp barriers and shuffles, and the block's shared memory. Every CUDA thread is a
// host thread or a fiber (tests/cuda_emulation/block_runner.cpp); these are the calls by which the threads of
// one block meet, each checked against the rules CUDA states for it, a broken rule failing the
// launch with lattn_emu::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

// Thread-local, as each CUDA thread's own registers; set by the block runner before a kernel runs.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
constexpr int warpSize = 32;

namespace lattn_emu {

// A CUDA rule broken by the code under test (or a wrong use of the emulation itself).
class Error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws Error(message) from emulated device code; the launch then fails naming the kernel,
// the block and the thread.
[[noreturn]] void device_fail(const std::string& message);

void sync_block();
// Meets the lanes of `mask` in the calling thread's warp at the warp-synchronous operation `what`
// (every lane of the mask must call the same operation with the same mask): deposits `value` and
// returns the value lane `source` deposited (source < 0: none is read).
std::uint64_t warp_exchange(const char* what, unsigned mask, std::uint64_t value, int source);
// A WMMA call (load_matrix_sync, mma_sync, store_matrix_sync): CUDA requires every lane of the
// warp to make it, together. The lane records it in a running count and hash of its WMMA calls,
// and the lanes of a warp must agree on them whenever they next meet (a warp call, a block
// barrier, leaving the kernel): a lane that skipped, added or swapped one fails the launch there.
// That is how mma_sync, which touches no memory, is checked without a host-thread rendezvous per
// tile product; the loads and stores also meet the other lanes (mma.h).
void note_wmma_call(const char* what);
// The lanes present in the calling thread's warp (all 32 unless the block size is not a multiple of 32).
unsigned warp_lanes();
unsigned lane_id();

// The __align__(n) of a shared declaration as the build step wrote it: "<n>", or "" (0) when none.
constexpr std::size_t parse_align(const char* text) {
  std::size_t n = 0;
  for (; *text; ++text)
    if (*text >= '0' && *text <= '9') n = n * 10 + std::size_t(*text - '0');
  return n;
}

// The block's dynamic shared memory (null when the launch asked for none). It is 128-byte aligned
// and no more, so code that assumes more than it declared (align) fails; align over 128 is refused.
void* dynamic_shared_memory(std::size_t align);
// Shared storage of one __shared__ declaration (`site` identifies it) in the running block: NaN
// bytes (0xFF) when the block first reaches it, aligned to `align` and deliberately not to twice
// that, so that code relying on alignment it did not declare fails here too.
void* static_shared_site(const void* site, std::size_t bytes, std::size_t align);

// `Site` is a lambda type made at the declaration, so every declaration (and every instantiation
// of a template holding one) has storage of its own.
template <class T, std::size_t Align, class Site>
T& static_shared(Site) {
  static const char site = 0;
  return *static_cast<T*>(static_shared_site(&site, sizeof(T), Align ? Align : alignof(T)));
}

template <class T>
std::uint64_t to_bits(T value) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <class T>
T from_bits(std::uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// The lane a shuffle reads (CUDA's rules for width: groups of `width` lanes; a source past the
// group's end, or before its start, gives the caller's own value), or -1 for its own value.
int shuffle_source(const char* what, int lane, int target, int width);

}  // namespace lattn_emu

inline void __syncthreads() { lattn_emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { lattn_emu::warp_exchange("__syncwarp", mask, 0, -1); }

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int lane = int(lattn_emu::lane_id());
  const int group = lane / width * width;
  const int src = lattn_emu::shuffle_source("__shfl_sync", lane, group + ((src_lane % width + width) % width), width);
  return lattn_emu::from_bits<T>(lattn_emu::warp_exchange("__shfl_sync", mask, lattn_emu::to_bits(var), src < 0 ? lane : src));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = int(lattn_emu::lane_id());
  const int src = lattn_emu::shuffle_source("__shfl_xor_sync", lane, lane ^ lane_mask, width);
  return lattn_emu::from_bits<T>(
      lattn_emu::warp_exchange("__shfl_xor_sync", mask, lattn_emu::to_bits(var), src < 0 ? lane : src));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = int(lattn_emu::lane_id());
  const int src = lattn_emu::shuffle_source("__shfl_down_sync", lane, lane + int(delta), width);
  return lattn_emu::from_bits<T>(
      lattn_emu::warp_exchange("__shfl_down_sync", mask, lattn_emu::to_bits(var), src < 0 ? lane : src));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = int(lattn_emu::lane_id());
  const int src = lattn_emu::shuffle_source("__shfl_up_sync", lane, lane - int(delta), width);
  return lattn_emu::from_bits<T>(
      lattn_emu::warp_exchange("__shfl_up_sync", mask, lattn_emu::to_bits(var), src < 0 ? lane : src));
}

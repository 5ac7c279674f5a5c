// What the tests set and read of the emulated device: its opt-in shared-memory limit per block
// (the one figure in which the GPUs the project targets differ for its launch code), and the log
// of the launches so far (which kernel, with which configuration), from which a test reads, say,
// the tile height a launcher chose.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace lattn_emu {

// cudaDevAttrMaxSharedMemoryPerBlockOptin of the GPUs the kernels are built for.
inline constexpr std::size_t kH100SharedOptin = 232448;  // sm_90 (H100, H200): 227 KiB
inline constexpr std::size_t kA100SharedOptin = 166912;  // sm_80 (A100): 163 KiB
inline constexpr std::size_t kDefaultSharedPerBlock = 49152;  // without cudaFuncSetAttribute: 48 KiB
// Per multiprocessor, on both: the opt-in limit plus this much shared memory (the runtime keeps
// 1 KiB of each block's), and 2048 resident threads.
inline constexpr std::size_t kReservedSharedPerBlock = 1024;
inline constexpr std::size_t kMaxThreadsPerMultiprocessor = 2048;

// The emulated device's opt-in limit: LATTN_EMU_SHARED_OPTIN (bytes) from the environment when
// set, else kH100SharedOptin. The project's launch helpers read it once per process, so a test
// run takes one limit; CTest runs the suite once per limit.
std::size_t shared_optin_limit();
void set_shared_optin_limit(std::size_t bytes);

struct LaunchRecord {
  std::string kernel;  // the kernel's name in its .cu (template arguments not included)
  dim3 grid, block;
  std::size_t shared;  // dynamic shared memory, bytes
};
std::vector<LaunchRecord> launch_log();
void clear_launch_log();

// Whether [ptr, ptr + bytes) lies inside one live cudaMalloc block: what a stand-in for a device
// library (the emulated cuBLAS) checks of the pointers it is handed.
bool is_device_memory(const void* ptr, std::size_t bytes);

}  // namespace lattn_emu

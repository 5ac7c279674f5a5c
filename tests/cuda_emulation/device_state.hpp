// The emulated device's state that the runtime API and the launcher share: the opt-in shared
// memory limit, the kernels' attributes (cudaFuncSetAttribute), the live streams, the sticky
// last error and the launch log. Internal to the emulation's runtime (tests/cuda_emulation/*.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "lattn_emu/control.hpp"
#include "lattn_emu/launch.hpp"

namespace lattn_emu::detail {

struct DeviceState {
  std::mutex mutex;
  std::size_t optin = 0;  // 0: not read yet (shared_optin_limit() reads the environment)
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel
  std::set<cudaStream_t> streams;
  cudaError_t last_error = cudaSuccess;
  std::vector<LaunchRecord> log;
};

DeviceState& device();

}  // namespace lattn_emu::detail

namespace lattn_emu::detail {
// Throws Error when `config` breaks a launch rule (launch_checks.cpp); records it in the log when not.
void check_launch(const LaunchConfig& config);
}  // namespace lattn_emu::detail

// Helpers shared by the tests: problem tensors, the float64 reference on float32 inputs, and
// running the real executable.
#pragma once

#include <sys/wait.h>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>

#include "backend.hpp"
#include "check.hpp"
#include "cpu/scan_pass.hpp"
#include "inputs.hpp"

namespace lattn::test {

// Forces the CPU kernels' vector width for a scope (it must be available here).
struct VecOverride {
  explicit VecOverride(cpu::Vec vec) { cpu::set_vec_override(vec); }
  ~VecOverride() { cpu::set_vec_override(std::nullopt); }
  VecOverride(const VecOverride&) = delete;
  VecOverride& operator=(const VecOverride&) = delete;
};

inline std::string describe(const Problem& p) {
  return "B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" +
         std::to_string(p.dim) + " C" + std::to_string(p.chunk) + (p.decay == Decay::retnet ? " retnet" : " none");
}

struct ProcessResult {
  int exit_status = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell, stderr merged into stdout.
inline ProcessResult run_process(const std::string& command) {
  ProcessResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string binary() { return LATTN_BINARY; }

// An empty folder of this test process's own under the system's temporary folder.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("lattn-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Whether this build has the CUDA backend and this machine a GPU it can use.
inline bool cuda_usable() {
  try {
    return make_backend("cuda", BackendOptions{})->availability().available;
  } catch (const std::exception&) {
    return false;
  }
}
inline std::string source_dir() { return LATTN_SOURCE_DIR; }

}  // namespace lattn::test

namespace lattn::test {

// Runs one case on the CPU backend once and checks it against the float64 reference.
inline CheckResult run_cpu_case(const Problem& p, Impl impl, Mode mode, int threads = 0, std::uint64_t seed = 3) {
  auto backend = make_backend("cpu", BackendOptions{threads});
  Case kase{"kernel", impl, mode, p, "cpu", "float32", 0};
  const KernelTensors inputs = make_kernel_inputs(p, mode, seed);
  auto prepared = backend->prepare(kase, inputs);
  prepared->run();
  KernelTensors outputs;
  prepared->read_outputs(outputs);
  const KernelReference reference = compute_kernel_reference(p, inputs, mode == Mode::fwd_bwd);
  return check_kernel_outputs(outputs, reference, mode, tolerance_for("float32"));
}

// Shapes every layer test covers (scan by default; tests set `chunked`). Small, but not
// degenerate: at T = 1, Lin = s (q.k) v points along v whatever q and k are, so RMSNorm(Lin) does
// not depend on them, their true gradients are of order eps = 1e-6 and float32 returns its
// rounding noise (the same for head_dim 1 at any T: RMSNorm is then sign(Lin) g). Two to three
// tokens of head_dim 2 are still ill-conditioned for some seeds.
inline std::vector<LayerProblem> layer_test_shapes() {
  return {
      {{1, 1, 8, 4, 4, Decay::none}, 1, false},
      {{1, 2, 9, 4, 4, Decay::retnet}, 1, false},       // window 1
      {{2, 3, 100, 16, 32, Decay::none}, 32, false},    // ragged chunks and query blocks
      {{1, 2, 150, 8, 64, Decay::retnet}, 200, false},  // window > T
      {{1, 4, 300, 64, 128, Decay::none}, 128, false},  // the suite's head dim and window
  };
}

// Shapes every kernel test covers: D = 1 and D = 128, T < C, T not a multiple of C, T = 1, C = 1.
inline std::vector<Problem> kernel_test_shapes() {
  std::vector<Problem> shapes;
  for (Decay decay : {Decay::none, Decay::retnet}) {
    shapes.push_back({1, 1, 1, 1, 4, decay});
    shapes.push_back({1, 2, 9, 1, 4, decay});
    shapes.push_back({2, 3, 20, 8, 64, decay});     // T < C
    shapes.push_back({1, 4, 100, 16, 32, decay});   // ragged last chunk
    shapes.push_back({2, 1, 64, 5, 16, decay});     // T a multiple of C, odd D
    shapes.push_back({1, 2, 37, 12, 1, decay});     // C = 1
    shapes.push_back({1, 2, 300, 128, 128, decay}); // D = 128, ragged
  }
  return shapes;
}

}  // namespace lattn::test

// Helpers shared by the tests: cases of each op, one case run on a backend and checked against
// the float64 reference, and running the real executable.
#pragma once

#include <sys/wait.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/op.hpp"
#include "core/random.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/layer/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/op.hpp"
#include "src/backend.hpp"
#include "src/check.hpp"

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
         std::to_string(p.dim) + " C" + std::to_string(p.chunk) + " " + to_string(p.decay);
}

inline std::string describe(const Case& c) {
  return c.op->name + " " + c.impl + " " + to_string(c.mode) + " " + c.dtype + " B" + std::to_string(c.batch) + " H" +
         std::to_string(c.heads) + " T" + std::to_string(c.seq) + " D" + std::to_string(c.dim) + " C" +
         std::to_string(c.chunk) + " W" + std::to_string(c.window) + " " + c.decay +
         (c.options.count("gate_norm") ? " gate_norm " + c.option("gate_norm") : "");
}

// A linear-attention case of `p`.
inline Case kernel_case(const Problem& p, const std::string& impl, Mode mode, const std::string& backend = "cpu",
                        const std::string& dtype = "float32") {
  Case c;
  c.op = &linear_attention_op();
  c.impl = impl;
  c.mode = mode;
  c.backend = backend;
  c.dtype = dtype;
  c.batch = p.batch;
  c.heads = p.heads;
  c.seq = p.seq;
  c.dim = p.dim;
  c.chunk = p.chunk;
  c.decay = to_string(p.decay);
  if (gated(p.decay)) c.options["gate_norm"] = "16";
  return c;
}

// The same with gates of this strength (gate_norm: 16 is the default, 1 strong).
inline Case gated_case(const Problem& p, const std::string& gate_norm, const std::string& impl, Mode mode,
                       const std::string& backend = "cpu") {
  Case c = kernel_case(p, impl, mode, backend);
  c.options["gate_norm"] = gate_norm;
  return c;
}

// A layer case of `p` (its form from p.chunked).
inline Case layer_case(const LayerProblem& p, Mode mode, const std::string& backend = "cpu") {
  Case c = kernel_case(p.linear, p.chunked ? "chunked" : "scan", mode, backend);
  c.op = &layer_op();
  c.window = p.window;
  c.options.clear();
  return c;
}

// A sliding-window case: batch, heads, seq and dim of `p`, and `window`.
inline Case window_case(const Problem& p, int window, Mode mode, const std::string& backend = "cpu",
                        const std::string& dtype = "float32") {
  Case c = kernel_case(p, "blocked", mode, backend, dtype);
  c.op = &sliding_window_op();
  c.chunk = 0;
  c.decay = "none";
  c.options.clear();
  c.window = window;
  return c;
}

struct Outcome {
  CheckResult check;
  MemoryUsage memory;
  std::string bwd_states;
};

// One call of `kase` on `backend` (which must support it), checked against the float64
// reference; bf16 cases see (and the reference uses) the bf16-rounded inputs, as in the runner.
inline Outcome run_on(Backend& backend, const Case& kase, std::uint64_t seed = 3) {
  if (auto why = backend.unsupported(kase)) throw std::runtime_error("unsupported: " + *why);
  const TensorSet all = make_case_inputs(kase, seed);
  const Reference reference = kase.op->reference(kase, all, kase.backward());
  auto prepared = backend.find(kase.op->name, kase.impl)->prepare(kase, all.inputs_for(kase.mode));
  prepared->run();
  TensorSet outputs = make_case_outputs(kase);
  prepared->read_outputs(outputs);
  return {check_outputs(kase, outputs, reference), prepared->memory(), prepared->bwd_states()};
}

// The same on a fresh CPU backend with `threads` (0: every core).
inline CheckResult run_cpu_case(const Case& kase, int threads = 0, std::uint64_t seed = 3) {
  auto backend = make_backend("cpu", BackendOptions{threads});
  return run_on(*backend, kase, seed).check;
}

inline CheckResult run_cpu_case(const Problem& p, const std::string& impl, Mode mode, int threads = 0,
                                std::uint64_t seed = 3) {
  return run_cpu_case(kernel_case(p, impl, mode), threads, seed);
}

// Per-output errors, for INFO.
inline std::string errors(const CheckResult& c) {
  std::string out;
  for (const auto& [name, e] : c.per_output) out += name + "=" + std::to_string(e) + " ";
  return out;
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

// Shapes every kernel test covers: D = 1 and D = 128, T < C, T not a multiple of C, T = 1, C = 1,
// D not a multiple of the vector width; every decay, gated ones included (the test table adds
// strong gates, gate_norm 1, to each gated shape).
inline std::vector<Problem> kernel_test_shapes() {
  std::vector<Problem> shapes;
  for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
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

// Shapes every sliding-window test covers: T = 1, window 1, window = T, window > T, T not a
// multiple of the query block, odd D.
struct WindowShape {
  Problem p;
  int window;
};
inline std::vector<WindowShape> window_test_shapes() {
  return {
      {{1, 1, 1, 1, 1, Decay::none}, 1},        // T = 1
      {{1, 2, 37, 8, 1, Decay::none}, 1},       // window 1: each query sees itself only
      {{2, 1, 100, 16, 1, Decay::none}, 7},     // T not a multiple of the query block
      {{1, 2, 150, 8, 1, Decay::none}, 32},     // window = query block (32), ragged last block
      {{1, 1, 130, 5, 1, Decay::none}, 33},     // odd D, window just over a block
      {{1, 1, 100, 4, 1, Decay::none}, 64},     // window two blocks
      {{1, 2, 90, 16, 1, Decay::none}, 90},     // window = T
      {{1, 1, 70, 8, 1, Decay::none}, 1000},    // window > T: plain causal softmax
      {{1, 1, 200, 64, 1, Decay::none}, 128},   // the layer's head dim and window
      {{1, 1, 600, 16, 1, Decay::none}, 100},   // three groups of 8 query blocks, the last ragged
      {{2, 1, 530, 32, 1, Decay::none}, 128},   // two groups, V read in place
  };
}

}  // namespace lattn::test

// Helpers shared by the tests: one case run on a backend and checked against the float64
// reference, and running the real executable (the cases and shapes themselves: cases.hpp).
#pragma once

#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "cases.hpp"
#include "core/random.hpp"
#include "kernels/cpu/vec.hpp"
#include "src/run/backend.hpp"
#include "src/run/check.hpp"
#include "src/config/config.hpp"
#include "core/error.hpp"

namespace lattn::test {

// Forces the CPU kernels' vector width for a scope (it must be available here).
struct VecOverride {
  explicit VecOverride(cpu::Vec vec) { cpu::set_vec_override(vec); }
  ~VecOverride() { cpu::set_vec_override(std::nullopt); }
  VecOverride(const VecOverride&) = delete;
  VecOverride& operator=(const VecOverride&) = delete;
};

struct Outcome {
  CheckResult check;
  MemoryUsage memory;
  std::string bwd_states;
};

// Everything make_case_inputs and an op's reference read of a case, and the seed: equal texts,
// equal inputs and reference. Not the impl or the backend: the inputs and the float64 reference
// are the op's, whichever form and backend run it.
inline std::string case_key(const Case& c, std::uint64_t seed) {
  std::string key = c.op->name + '|' + to_string(c.mode) + '|' + c.dtype + '|' + c.decay;
  for (const long n : {long(c.batch), long(c.heads), long(c.seq), long(c.dim), long(c.chunk), long(c.window)})
    key += '|' + std::to_string(n);
  for (const auto& [name, value] : c.options) key += '|' + name + '=' + value;
  return key + '|' + std::to_string(seed);
}

// The inputs and the float64 reference of a case, made once for the last few cases asked: the
// tests that run one case at every vector width and thread count draw its inputs (half their time
// is the normal draws) and run its reference once, not once per width and count.
struct CaseData {
  TensorSet inputs;
  Reference reference;
};

inline std::shared_ptr<const CaseData> case_data(const Case& kase, std::uint64_t seed) {
  constexpr std::size_t kKept = 4;
  static std::vector<std::pair<std::string, std::shared_ptr<const CaseData>>> kept;
  const std::string key = case_key(kase, seed);
  for (std::size_t i = 0; i < kept.size(); ++i)
    if (kept[i].first == key) {
      std::rotate(kept.begin(), kept.begin() + std::ptrdiff_t(i), kept.begin() + std::ptrdiff_t(i) + 1);
      return kept.front().second;
    }
  auto data = std::make_shared<CaseData>();
  data->inputs = make_case_inputs(kase, seed);
  data->reference = kase.op->reference(kase, data->inputs, kase.backward());
  if (kept.size() == kKept) kept.pop_back();
  kept.insert(kept.begin(), {key, data});
  return data;
}

// One call of `kase` on `backend` (which must support it), checked against the float64
// reference; bf16 cases see (and the reference uses) the bf16-rounded inputs, as in the runner.
inline Outcome run_on(Backend& backend, const Case& kase, std::uint64_t seed = 3) {
  if (auto why = backend.unsupported(kase)) throw std::runtime_error("unsupported: " + *why);
  const std::shared_ptr<const CaseData> data = case_data(kase, seed);
  const TensorSet& all = data->inputs;
  const Reference& reference = data->reference;
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

// A test case that starts a process carries the tag [spawns]: its CTest label, which the
// sanitizers' run in scripts/test.sh leaves to the main suite (tests/CMakeLists.txt). Checked where
// the tests start processes, so that a new one cannot slip into the sanitizers' run untagged.
inline void require_spawns_tag() {
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  for (const auto& test : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    if (test.name != name) continue;
    if (std::find(test.lcaseTags.begin(), test.lcaseTags.end(), "spawns") == test.lcaseTags.end())
      FAIL("the test case \"" << name << "\" starts a process: tag it [spawns] (tests/CMakeLists.txt)");
    return;
  }
}

// Runs `command` through the shell, stderr merged into stdout.
inline ProcessResult run_process(const std::string& command) {
  require_spawns_tag();
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

// The lattnbench these tests run: the one built beside them, or LATTN_BINARY's where the tests
// were built elsewhere (scripts/device_check.sh with prebuilt binaries).
inline std::string binary() {
  require_spawns_tag();
  const char* elsewhere = std::getenv("LATTN_BINARY");
  return elsewhere && *elsewhere ? elsewhere : LATTN_BINARY;
}

// An empty folder of this test process's own under the system's temporary folder.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("lattn-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The message of the UsageError that parsing `text` as the config `name` throws ("" when none).
inline std::string config_error(const std::string& text, const std::string& name = "suite.yaml") {
  try {
    parse_config(text, name);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The message of the UsageError that the command-line override key=value throws on the defaults
// ("" when none).
inline std::string override_error(const std::string& key, const std::string& value) {
  Config c;
  Overrides o;
  o.values[key] = value;
  try {
    apply_overrides(c, o);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
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

// The largest error of `grad` against central differences of `objective` over each element of
// `x` (relative where the derivative exceeds 1, absolute below): the float64 references'
// gradient tests.
template <class Objective>
double worst_fd_error(std::vector<double>& x, const std::vector<double>& grad, Objective objective) {
  const double eps = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = objective();
    x[i] = saved - eps;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * eps);
    worst = std::max(worst, std::abs(numeric - grad[i]) / std::max(1.0, std::abs(numeric)));
  }
  return worst;
}

}  // namespace lattn::test

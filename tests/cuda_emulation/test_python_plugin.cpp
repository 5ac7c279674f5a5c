// A Python impl on the emulated CUDA backend (docs/plugins.md, "Python kernels"): the bridge hands it
// the case's device buffers as DLPack capsules of CUDA's device type and the case's stream, the
// backend's plugin row times and checks it as any row (python_cuda_scan.py reads the capsules as
// a consumer would and computes the scan at their pointers, which in the emulation are host
// memory), an exception fails the case with its last line, and a CPU impl is no row here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_backend.hpp"
#include "src/plugins/python_plugin.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::unique_ptr<Backend> backend_with_python_plugin() {
  BackendOptions options;
  options.plugins = {load_python_plugin(std::string(LATTN_SOURCE_DIR) + "/tests/cuda_emulation/python_cuda_scan.py", 1)};
  return cuda::make_cuda_backend(options);
}

}  // namespace

TEST_CASE("emulation: a Python impl on the CUDA backend takes DLPack device tensors and matches the reference",
          "[python]") {
  const auto backend = backend_with_python_plugin();
  std::vector<std::string> impls;
  for (const ImplRow& row : backend->impls) impls.push_back(row.impl);
  CHECK(std::count(impls.begin(), impls.end(), "emu:scan") == 1);
  CHECK(std::count(impls.begin(), impls.end(), "emu:fails") == 1);
  CHECK(std::count(impls.begin(), impls.end(), "emu:host") == 0);  // device="cpu": the CPU backend's

  for (const Problem& p : {Problem{1, 1, 5, 3, 4, Decay::none}, Problem{2, 3, 12, 8, 4, Decay::none}}) {
    const Case c = test::kernel_case(p, "emu:scan", Mode::fwd, "cuda");
    INFO(test::describe(c));
    REQUIRE_FALSE(backend->unsupported(c));
    const test::Outcome r = test::run_on(*backend, c, 5);
    INFO(test::errors(r.check));
    CHECK(r.check.passed);
    CHECK(r.check.rel_err < 1e-5);
  }
  // What the decorator leaves out is declined with its reason, as on the CPU backend.
  Case declined = test::kernel_case({1, 1, 5, 3, 4, Decay::retnet}, "emu:scan", Mode::fwd, "cuda");
  REQUIRE(backend->unsupported(declined));
  CHECK_THAT(*backend->unsupported(declined), Catch::Matchers::Contains("decay"));
  declined = test::kernel_case({1, 1, 5, 3, 4, Decay::none}, "emu:scan", Mode::fwd_bwd, "cuda");
  CHECK(backend->unsupported(declined));
}

TEST_CASE("emulation: a Python impl that raises on the CUDA backend fails the case with the exception's last line",
          "[python]") {
  const auto backend = backend_with_python_plugin();
  const Case c = test::kernel_case({1, 1, 5, 3, 4, Decay::none}, "emu:fails", Mode::fwd, "cuda");
  REQUIRE_FALSE(backend->unsupported(c));
  CHECK_THROWS_WITH(test::run_on(*backend, c, 5), Catch::Matchers::Contains("RuntimeError: raised on the CUDA backend"));
}

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

TEST_CASE("emulation: a Python impl in the BTHD layout on the CUDA backend, float32 and bf16, matches the reference",
          "[python]") {
  const auto backend = backend_with_python_plugin();
  for (const std::string dtype : {"float32", "bf16"}) {
    const Case c = test::kernel_case({2, 3, 7, 4, 4, Decay::none}, "emu:scan_bthd", Mode::fwd, "cuda", dtype);
    INFO(test::describe(c));
    REQUIRE_FALSE(backend->unsupported(c));
    const test::Outcome r = test::run_on(*backend, c, 5);
    INFO(test::errors(r.check));
    CHECK(r.check.passed);
    // float32 all through; bf16 inputs with o written in bf16 (its rounding, 2^-9, and no more)
    CHECK(r.check.rel_err < (dtype == "bf16" ? 8e-3 : 1e-5));
    CHECK(r.memory.layout == "BTHD");
    // q k v o per token: 2 x 3 x 7 tokens of 4, at 2 bytes in bf16, 4 in float32
    CHECK(r.memory.layout_copy_bytes == std::size_t(2 * 3 * 7 * 4 * 4 * (dtype == "bf16" ? 2 : 4)));
  }
  // The impl that takes lattnbench's layout declines bf16 by its decorator, not the row.
  const Case bf16 = test::kernel_case({1, 1, 5, 3, 4, Decay::none}, "emu:scan", Mode::fwd, "cuda", "bf16");
  REQUIRE(backend->unsupported(bf16));
  CHECK_THAT(*backend->unsupported(bf16), Catch::Matchers::Contains("emu:scan: takes dtype float32, not bfloat16"));
}

TEST_CASE("emulation: a Python impl that raises on the CUDA backend fails the case with the exception's last line",
          "[python]") {
  const auto backend = backend_with_python_plugin();
  const Case c = test::kernel_case({1, 1, 5, 3, 4, Decay::none}, "emu:fails", Mode::fwd, "cuda");
  REQUIRE_FALSE(backend->unsupported(c));
  CHECK_THROWS_WITH(test::run_on(*backend, c, 5), Catch::Matchers::Contains("RuntimeError: raised on the CUDA backend"));
}

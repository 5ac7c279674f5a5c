// The CPU chunked kernel, forward and backward, against the float64 reference (and so against scan).
#include <catch2/catch.hpp>

#include "test_util.hpp"

using namespace lattn;

TEST_CASE("chunked matches the float64 reference, forward and backward", "[chunked]") {
  for (const Problem& p : test::kernel_test_shapes()) {
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      INFO(test::describe(p) << " " << to_string(mode));
      const CheckResult check = test::run_cpu_case(p, Impl::chunked, mode);
      for (const auto& [name, err] : check.per_output) INFO(name << " rel_err " << err);
      CHECK(check.passed);
      CHECK(check.rel_err < 1e-5);
    }
  }
}

TEST_CASE("chunked gives the same answer for every chunk size", "[chunked]") {
  for (int chunk : {1, 3, 16, 33, 128, 1000}) {
    const Problem p{1, 2, 70, 8, chunk, Decay::retnet};
    INFO(test::describe(p));
    CHECK(test::run_cpu_case(p, Impl::chunked, Mode::fwd_bwd).rel_err < 1e-5);
  }
}

TEST_CASE("a non-finite input fails the check and names the first bad output element", "[chunked][check]") {
  const Problem p{1, 1, 8, 4, 4, Decay::none};
  auto backend = make_backend("cpu", BackendOptions{1});
  Case kase{"kernel", Impl::chunked, Mode::fwd, p, "cpu", "float32", 0};
  KernelTensors inputs = make_kernel_inputs(p, Mode::fwd, 1);
  const KernelReference reference = compute_kernel_reference(p, inputs, false);
  inputs.v[4 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();  // token 5 poisons o from row 5 on
  auto prepared = backend->prepare(kase, inputs);
  prepared->run();
  KernelTensors outputs;
  prepared->read_outputs(outputs);
  const CheckResult check = check_kernel_outputs(outputs, reference, Mode::fwd, tolerance_for("float32"));
  CHECK_FALSE(check.passed);
  CHECK(check.non_finite.rfind("o[", 0) == 0);
}

// The CPU scan kernel, forward and backward, against the float64 reference.
#include <catch2/catch.hpp>

#include "test_util.hpp"

using namespace lattn;

TEST_CASE("scan matches the float64 reference, forward and backward", "[scan]") {
  for (const Problem& p : test::kernel_test_shapes()) {
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      INFO(test::describe(p) << " " << to_string(mode));
      const CheckResult check = test::run_cpu_case(p, Impl::scan, mode);
      for (const auto& [name, err] : check.per_output) INFO(name << " rel_err " << err);
      CHECK(check.passed);
      CHECK(check.rel_err < 1e-5);
    }
  }
}

TEST_CASE("scan gives the same answer on one thread and on several", "[scan][threads]") {
  const Problem p{1, 3, 50, 16, 16, Decay::retnet};
  for (int threads : {1, 2, 3}) {
    INFO("threads " << threads);
    CHECK(test::run_cpu_case(p, Impl::scan, Mode::fwd_bwd, threads).rel_err < 1e-5);
  }
}

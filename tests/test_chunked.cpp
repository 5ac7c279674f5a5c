// The CPU chunked kernel, forward and backward, against the float64 reference (and so against scan).
#include <catch2/catch.hpp>

#include <omp.h>

#include "counting_allocator.hpp"
#include "cpu/kernels.hpp"
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

TEST_CASE("the chunked backward recomputing its chunk states matches the one given the forward's kept states",
          "[chunked][paths]") {
  // fwd_bwd cases take the kept states (the tests above); a backward called on its own recomputes
  // them. Both against the reference, over threads splitting heads (B*H >= threads) and chunks.
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (const Problem& p : {Problem{2, 2, 150, 40, 32, Decay::retnet}, Problem{1, 1, 200, 33, 64, Decay::none},
                             Problem{1, 1, 131, 48, 128, Decay::retnet}}) {
      INFO("threads " << threads << " " << test::describe(p));
      const KernelTensors in = make_kernel_inputs(p, Mode::fwd_bwd, 5);
      const KernelReference reference = compute_kernel_reference(p, in, true);
      CountingAllocator allocator;
      std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / sizeof(float));
      float* keep = kept.empty() ? nullptr : kept.data();
      KernelTensors with_kept, recomputed;
      for (KernelTensors* out : {&with_kept, &recomputed}) {
        out->o.resize(p.token_elems());
        out->hT.resize(p.state_elems());
        for (auto* g : {&out->dq, &out->dk, &out->dv}) g->resize(p.token_elems());
        out->dh0.resize(p.state_elems());
        const bool keeps = out == &with_kept;
        cpu::chunked_forward(p, {in.q.data(), in.k.data(), in.v.data(), in.h0.data(), out->o.data(), out->hT.data()},
                             allocator, keeps ? keep : nullptr);
        cpu::chunked_backward(p,
                              {in.q.data(), in.k.data(), in.v.data(), in.h0.data(), in.dO.data(), in.dhT.data(),
                               out->dq.data(), out->dk.data(), out->dv.data(), out->dh0.data()},
                              allocator, keeps ? keep : nullptr);
        const CheckResult check = check_kernel_outputs(*out, reference, Mode::fwd_bwd, tolerance_for("float32"));
        INFO((keeps ? "kept" : "recomputed") << " worst " << check.worst_output);
        CHECK(check.rel_err < 1e-5);
      }
      CHECK(allocator.live_bytes() == 0);
      // Same products in the same order: the two backwards agree to rounding.
      for (std::size_t i = 0; i < p.token_elems(); ++i) {
        REQUIRE(with_kept.dq[i] == Approx(recomputed.dq[i]).margin(1e-6));
        REQUIRE(with_kept.dk[i] == Approx(recomputed.dk[i]).margin(1e-6));
        REQUIRE(with_kept.dv[i] == Approx(recomputed.dv[i]).margin(1e-6));
      }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

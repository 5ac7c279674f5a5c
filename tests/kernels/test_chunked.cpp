// Code paths of the CPU chunked form the test table (test_ops.cpp) does not single out: every chunk
// size against one reference, the backward given the forward's kept chunk states against the one
// that recomputes them, and a non-finite input failing the check.
#include <catch2/catch.hpp>

#include <omp.h>

#include <limits>

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"

using namespace lattn;

TEST_CASE("chunked gives the same answer for every chunk size", "[chunked]") {
  for (int chunk : {1, 3, 16, 33, 128, 1000}) {
    const Problem p{1, 2, 70, 8, chunk, Decay::retnet};
    INFO(test::describe(p));
    CHECK(test::run_cpu_case(p, "chunked", Mode::fwd_bwd).rel_err < 1e-5);
  }
}

TEST_CASE("a non-finite input fails the check and names the first bad output element", "[chunked][check]") {
  const Problem p{1, 1, 8, 4, 4, Decay::none};
  auto backend = make_backend("cpu", BackendOptions{1});
  const Case kase = test::kernel_case(p, "chunked", Mode::fwd);
  TensorSet inputs = make_case_inputs(kase, 1);
  const Reference reference = kase.op->reference(kase, inputs, false);
  inputs.at("v").data[4 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();  // token 5 poisons o from row 5 on
  auto prepared = backend->find(kase.op->name, kase.impl)->prepare(kase, inputs.inputs_for(kase.mode));
  prepared->run();
  TensorSet outputs = make_case_outputs(kase);
  prepared->read_outputs(outputs);
  const CheckResult check = check_outputs(kase, outputs, reference);
  CHECK_FALSE(check.passed);
  CHECK(check.non_finite.rfind("o[", 0) == 0);
  CHECK(check.failure().rfind("non-finite output at o[", 0) == 0);
}

TEST_CASE("the chunked backward recomputing its chunk states matches the one given the forward's kept states",
          "[chunked][paths]") {
  // fwd_bwd cases take the kept states (the test table); a backward called on its own recomputes
  // them. Both against the reference, over threads splitting heads (B*H >= threads) and chunks.
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (const Problem& p : {Problem{2, 2, 150, 40, 32, Decay::retnet}, Problem{1, 1, 200, 33, 64, Decay::none},
                             Problem{1, 1, 131, 48, 128, Decay::retnet}}) {
      INFO("threads " << threads << " " << test::describe(p));
      const Case kase = test::kernel_case(p, "chunked", Mode::fwd_bwd);
      const TensorSet in = make_case_inputs(kase, 5);
      const Reference reference = kase.op->reference(kase, in, true);
      CountingAllocator allocator;
      std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / sizeof(float));
      float* keep = kept.empty() ? nullptr : kept.data();
      TensorSet with_kept = make_case_outputs(kase), recomputed = make_case_outputs(kase);
      for (TensorSet* out : {&with_kept, &recomputed}) {
        const bool keeps = out == &with_kept;
        cpu::chunked_forward(p, {in.data("q"), in.data("k"), in.data("v"), in.data("h0"), out->data("o"), out->data("hT")},
                             allocator, keeps ? keep : nullptr);
        cpu::chunked_backward(p,
                              {in.data("q"), in.data("k"), in.data("v"), in.data("h0"), in.data("dO"), in.data("dhT"),
                               out->data("dq"), out->data("dk"), out->data("dv"), out->data("dh0")},
                              allocator, keeps ? keep : nullptr);
        const CheckResult check = check_outputs(kase, *out, reference);
        INFO((keeps ? "kept" : "recomputed") << " worst " << check.worst_output);
        CHECK(check.rel_err < 1e-5);
      }
      CHECK(allocator.live_bytes() == 0);
      // Same products in the same order: the two backwards agree to rounding.
      for (const char* name : {"dq", "dk", "dv"})
        for (std::size_t i = 0; i < p.token_elems(); ++i)
          REQUIRE(with_kept.at(name).data[i] == Approx(recomputed.at(name).data[i]).margin(1e-6));
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

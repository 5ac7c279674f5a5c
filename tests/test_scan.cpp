// The CPU scan kernel, forward and backward, against the float64 reference.
#include <catch2/catch.hpp>

#include <omp.h>

#include "counting_allocator.hpp"
#include "cpu/kernels.hpp"
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

TEST_CASE("the fused scan forward-backward gives bit for bit the forward then the backward", "[scan][paths]") {
  // fwd_bwd cases run the fused kernel (the tests above hold it to the reference); here it is held
  // to the two kernels it replaces, over every vector width and threads splitting heads (B*H >=
  // threads) and one head's columns (B*H < threads), with decay and a ragged last token group.
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      for (const Problem& p : {Problem{2, 2, 53, 40, 16, Decay::retnet}, Problem{1, 1, 77, 100, 16, Decay::none},
                               Problem{1, 2, 50, 32, 16, Decay::retnet}}) {
        INFO(cpu::to_string(vec) << " threads " << threads << " " << test::describe(p));
        const KernelTensors in = make_kernel_inputs(p, Mode::fwd_bwd, 7);
        KernelTensors fused, separate;
        CountingAllocator allocator;
        for (KernelTensors* out : {&fused, &separate}) {
          out->o.assign(p.token_elems(), -1.0f);
          out->hT.assign(p.state_elems(), -1.0f);
          for (auto* g : {&out->dq, &out->dk, &out->dv}) g->assign(p.token_elems(), -1.0f);
          out->dh0.assign(p.state_elems(), -1.0f);
          const ForwardArgs<float> fwd{in.q.data(), in.k.data(), in.v.data(), in.h0.data(), out->o.data(), out->hT.data()};
          const BackwardArgs<float> bwd{in.q.data(),  in.k.data(),     in.v.data(),     in.h0.data(),
                                        in.dO.data(), in.dhT.data(),   out->dq.data(), out->dk.data(),
                                        out->dv.data(), out->dh0.data()};
          if (out == &fused) {
            cpu::scan_forward_backward(p, fwd, bwd, allocator);
            CHECK(allocator.peak_bytes() == cpu::scan_forward_backward_workspace_bytes(p));
          } else {
            cpu::scan_forward(p, fwd, allocator);
            cpu::scan_backward(p, bwd, allocator);
          }
          CHECK(allocator.live_bytes() == 0);
        }
        CHECK(fused.o == separate.o);
        CHECK(fused.hT == separate.hT);
        CHECK(fused.dq == separate.dq);
        CHECK(fused.dk == separate.dk);
        CHECK(fused.dv == separate.dv);
        CHECK(fused.dh0 == separate.dh0);
      }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

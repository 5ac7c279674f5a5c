// temp_mb is counted, not guessed: the counting allocator's own arithmetic, and each CPU kernel's
// measured scratch against its closed form.
#include <catch2/catch.hpp>

#include <omp.h>

#include "counting_allocator.hpp"
#include "cpu/kernels.hpp"
#include "test_util.hpp"

using namespace lattn;

TEST_CASE("the counting allocator tracks live and peak bytes and reuses freed blocks", "[memory]") {
  CountingAllocator allocator;
  void* a = allocator.allocate(1000);
  void* b = allocator.allocate(24);
  CHECK(allocator.live_bytes() == 1024);
  allocator.deallocate(b, 24);
  CHECK(allocator.live_bytes() == 1000);
  CHECK(allocator.peak_bytes() == 1024);
  allocator.reset_peak();
  CHECK(allocator.peak_bytes() == 1000);
  void* c = allocator.allocate(24);
  CHECK(c == b);  // the cached block comes back: no new page faults in timed calls
  allocator.deallocate(c, 24);
  allocator.deallocate(a, 1000);
  CHECK(allocator.live_bytes() == 0);
}

TEST_CASE("each CPU kernel's scratch equals its closed form", "[memory]") {
  omp_set_num_threads(2);
  for (const Problem& p : {Problem{2, 4, 300, 32, 128, Decay::none}, Problem{1, 1, 50, 8, 64, Decay::retnet}}) {
    INFO(test::describe(p));
    const std::size_t threads = std::min<std::size_t>(2, p.heads_total());
    REQUIRE(std::size_t(cpu::head_parallel_threads(p)) == threads);
    const std::size_t C = std::min(p.chunk, p.seq), D = p.dim, chunks = (p.seq + p.chunk - 1) / p.chunk;

    // The formulas written out here, independently of the kernels' own *_workspace_bytes.
    CHECK(cpu::scan_forward_workspace_bytes(p) == 0);
    CHECK(cpu::scan_backward_workspace_bytes(p) == threads * D * D * 4);
    CHECK(cpu::chunked_forward_workspace_bytes(p) == threads * (C * C + C * D) * 4);
    CHECK(cpu::chunked_backward_workspace_bytes(p) == threads * (chunks * D * D + 2 * C * C + C * D) * 4);

    KernelTensors t = make_kernel_inputs(p, Mode::fwd_bwd, 0);
    std::vector<float> o(p.token_elems()), hT(p.state_elems()), dq(p.token_elems()), dk(p.token_elems()),
        dv(p.token_elems()), dh0(p.state_elems());
    const ForwardArgs<float> fwd{t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data()};
    const BackwardArgs<float> bwd{t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(),
                                  t.dhT.data(), dq.data(), dk.data(), dv.data(), dh0.data()};
    auto peak_of = [](auto&& call) {
      CountingAllocator allocator;
      call(allocator);
      CHECK(allocator.live_bytes() == 0);
      return allocator.peak_bytes();
    };
    CHECK(peak_of([&](Allocator& a) { cpu::scan_forward(p, fwd, a); }) == cpu::scan_forward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::scan_backward(p, bwd, a); }) == cpu::scan_backward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fwd, a); }) == cpu::chunked_forward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, bwd, a); }) == cpu::chunked_backward_workspace_bytes(p));
  }
}

TEST_CASE("the backend reports the kernel's scratch as temp and the tensors as arg and out", "[memory]") {
  const Problem p{2, 2, 200, 16, 64, Decay::none};
  auto backend = make_backend("cpu", BackendOptions{2});
  Case kase{"kernel", Impl::chunked, Mode::fwd_bwd, p, "cpu", "float32", 0};
  auto prepared = backend->prepare(kase, make_kernel_inputs(p, Mode::fwd_bwd, 0));
  prepared->run();
  const MemoryUsage m = prepared->memory();
  CHECK(m.temp_bytes == std::max(cpu::chunked_forward_workspace_bytes(p), cpu::chunked_backward_workspace_bytes(p)));
  CHECK(m.arg_bytes == (4 * p.token_elems() + 2 * p.state_elems()) * 4);  // q k v dO, h0 dhT
  CHECK(m.out_bytes == (4 * p.token_elems() + 2 * p.state_elems()) * 4);  // o dq dk dv, hT dh0
}

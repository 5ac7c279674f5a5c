// The emulation sees a missing barrier: cuda/scan.cu compiled with the __syncthreads() between staging
// a group of tokens and reading it taken out (by the build step, from the real file, so the test
// follows the kernel as it changes; tests/cuda_emulation/CMakeLists.txt names the spot). Threads
// then read staged tokens other threads have not written yet: NaN (shared memory starts as NaN),
// which the recurrence carries into the outputs. The same case passes with the real cuda/scan.cu in
// lattn_cuda_emulation_tests. Under ThreadSanitizer the race itself is reported too (CTest checks
// for the report there).
#include <catch2/catch.hpp>

#include "src/run/check.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/op.hpp"
#include "cases.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "core/random.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

TEST_CASE("emulation: scan without its staging barrier gives a wrong result", "[emulation][barrier]") {
  const Problem p{1, 2, 40, 32, 16, Decay::retnet};
  const Case kase = test::kernel_case(p, "scan", Mode::fwd, "cuda");
  const TensorSet in = make_case_inputs(kase, 3);
  const DeviceBuffer q = upload(in.at("q").data), k = upload(in.at("k").data), v = upload(in.at("v").data),
                     h0 = upload(in.at("h0").data);
  const DeviceBuffer o = output(p.token_elems()), hT = output(p.state_elems());
  CountingDeviceAllocator allocator;
  cuda::scan_additive_forward(p, cuda::Dtype::f32, {q.get(), k.get(), v.get(), h0.f(), o.f(), hT.f()}, allocator, nullptr);
  TensorSet out = make_case_outputs(kase);
  out.at("o").data = o.floats();
  out.at("hT").data = hT.floats();
  const CheckResult r = check_outputs(kase, out, kase.op->reference(kase, in, false));
  INFO("rel_err " << r.rel_err << (r.non_finite.empty() ? "" : ", non-finite at " + r.non_finite));
  CHECK_FALSE(r.passed);
}

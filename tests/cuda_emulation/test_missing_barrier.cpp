// The emulation sees a missing barrier: scan.cu compiled with the __syncthreads() between staging
// a group of tokens and reading it taken out (by the build step, from the real file, so the test
// follows the kernel as it changes; tests/cuda_emulation/CMakeLists.txt names the spot). Threads
// then read staged tokens other threads have not written yet: NaN (shared memory starts as NaN),
// which the recurrence carries into the outputs. The same case passes with the real scan.cu in
// lattn_cuda_emulation_tests. Under ThreadSanitizer the race itself is reported too (CTest checks
// for the report there).
#include <catch2/catch.hpp>

#include "check.hpp"
#include "cuda/kernels.hpp"
#include "device_buffers.hpp"
#include "inputs.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

TEST_CASE("emulation: scan without its staging barrier gives a wrong result", "[emulation][barrier]") {
  const Problem p{1, 2, 40, 32, 16, Decay::retnet};
  const KernelTensors in = make_kernel_inputs(p, Mode::fwd, 3);
  const DeviceBuffer q = upload(in.q), k = upload(in.k), v = upload(in.v), h0 = upload(in.h0);
  const DeviceBuffer o = output(p.token_elems()), hT = output(p.state_elems());
  CountingDeviceAllocator allocator;
  cuda::scan_forward(p, cuda::Dtype::f32, {q.get(), k.get(), v.get(), h0.f(), o.f(), hT.f()}, allocator, nullptr);
  KernelTensors out;
  out.o = o.floats();
  out.hT = hT.floats();
  const CheckResult r = check_kernel_outputs(out, compute_kernel_reference(p, in, false), Mode::fwd, tolerance_for("float32"));
  INFO("rel_err " << r.rel_err << (r.non_finite.empty() ? "" : ", non-finite at " + r.non_finite));
  CHECK_FALSE(r.passed);
}

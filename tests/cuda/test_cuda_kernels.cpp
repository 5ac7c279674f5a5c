// The CUDA linear-attention kernels' particular paths (D = 1..128, every chunk size the tiles allow,
// float32 exactness), the device allocator's count against closed forms, timing and the skips;
// the test table (test_cuda_ops.cpp) covers the shapes every backend shares. Runs only with a GPU
// (test_cuda_main.cpp skips otherwise).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include "src/run/counting_allocator.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "cuda_backend_checks.hpp"

using namespace lattn;

namespace {

// One call of `impl`/`mode` on the CUDA backend, checked against the float64 reference.
test::Outcome run_cuda_case(const Problem& p, const std::string& impl, Mode mode, const std::string& dtype,
                            bool cold = false, std::uint64_t seed = 5) {
  auto backend = make_backend("cuda", BackendOptions{});
  Case kase = test::kernel_case(p, impl, mode, "cuda", dtype);
  kase.options["cache"] = cold ? "cold" : "warm";
  return test::run_on(*backend, kase, seed);
}

}  // namespace

TEST_CASE("CUDA kernels match the reference for every dim 1..128", "[cuda]") {
  for (int D = 1; D <= 128; ++D)
    for (const std::string dtype : {"float32", "bf16"})
      for (const std::string impl : {"scan", "chunked"}) {
        const Problem p{1, 2, 45, D, 16, D % 2 ? Decay::retnet : Decay::none};  // 3 chunks, the last ragged
        INFO(dtype << " " << impl << " " << test::describe(p));
        const test::Outcome r = run_cuda_case(p, impl, Mode::fwd_bwd, dtype);
        INFO(test::errors(r.check));
        CHECK(r.check.passed);
      }
}

TEST_CASE("CUDA chunked kernels handle every chunk size the tiles allow", "[cuda]") {
  // chunk > seq, chunk not a multiple of 16, chunk 128 at D 128 (several staged row blocks), many
  // heads (retnet gamma close to 1), and a long sequence.
  const std::vector<Problem> shapes = {
      {1, 1, 50, 32, 200, Decay::retnet}, {2, 2, 250, 24, 100, Decay::retnet}, {1, 2, 257, 128, 128, Decay::none},
      {1, 64, 70, 16, 32, Decay::retnet}, {1, 1, 4100, 64, 64, Decay::retnet}, {1, 1, 300, 128, 48, Decay::retnet}};
  for (const std::string dtype : {"float32", "bf16"})
    for (const Problem& p : shapes)
      for (const std::string impl : {"chunked", "scan"}) {
        INFO(dtype << " " << impl << " " << test::describe(p));
        const test::Outcome r = run_cuda_case(p, impl, Mode::fwd_bwd, dtype);
        INFO(test::errors(r.check));
        CHECK(r.check.passed);
      }
}

TEST_CASE("float32 CUDA kernels are as exact as the CPU ones", "[cuda]") {
  // The CPU kernels reach 2e-7 (chunked) to 2e-6 (scan); a wrong index or mask gives errors of order 1.
  const Problem p{2, 3, 333, 64, 64, Decay::retnet};
  for (const std::string impl : {"scan", "chunked"}) {
    const test::Outcome r = run_cuda_case(p, impl, Mode::fwd_bwd, "float32");
    INFO(impl << " " << test::errors(r.check));
    CHECK(r.check.rel_err < 2e-5);
  }
}

TEST_CASE("the device allocator tracks live and peak bytes and reuses freed blocks", "[cuda][memory]") {
  CountingAllocator allocator(cuda::device_memory());
  void* a = allocator.allocate(1000);
  void* b = allocator.allocate(24);
  CHECK(allocator.live_bytes() == 1024);
  allocator.deallocate(b, 24);
  CHECK(allocator.live_bytes() == 1000);
  CHECK(allocator.peak_bytes() == 1024);
  allocator.reset_peak();
  CHECK(allocator.peak_bytes() == 1000);
  void* c = allocator.allocate(24);
  CHECK(c == b);
  allocator.deallocate(c, 24);
  allocator.deallocate(a, 1000);
  CHECK(allocator.live_bytes() == 0);
}

TEST_CASE("the CUDA backend reports temp, arg and out bytes in closed form", "[cuda][memory]") {
  test::check_linear_memory([](const BackendOptions& o) { return make_backend("cuda", o); });
}

TEST_CASE("CUDA timing: events give positive times, warm and cold", "[cuda]") {
  const Problem p{1, 4, 512, 64, 64, Decay::retnet};
  for (bool cold : {false, true}) {
    auto backend = make_backend("cuda", BackendOptions{});
    Case kase = test::kernel_case(p, "chunked", Mode::fwd_bwd, "cuda", "bf16");
    kase.options["cache"] = cold ? "cold" : "warm";
    auto prepared = backend->find(kase.op->name, kase.impl)->prepare(kase, make_case_inputs(kase, 0).inputs_for(kase.mode));
    prepared->run();
    const double ms = prepared->time_ms(3);
    CHECK(ms > 0);
    CHECK(ms < 10000);
  }
  const DeviceInfo info = make_backend("cuda", BackendOptions{})->describe();
  CHECK(info.backend == "cuda");
  REQUIRE(info.cuda);
  REQUIRE(info.cuda->gpu);
  CHECK(info.cuda->gpu->sm_count > 0);
  CHECK_FALSE(info.cuda->gpu->compute_capability.empty());
  CHECK(info.cuda->cuda_runtime);
}

TEST_CASE("the CUDA backend skips what it cannot run, with a reason", "[cuda]") {
  auto backend = make_backend("cuda", BackendOptions{});
  const Case wide = test::kernel_case({1, 1, 8, cuda::kScanMaxDim + 1, 4, Decay::none}, "scan", Mode::fwd, "cuda");
  CHECK(backend->unsupported(wide).has_value());
  const Case big_chunk = test::kernel_case({1, 1, 8192, 1024, 8192, Decay::none}, "chunked", Mode::fwd, "cuda");
  CHECK(backend->unsupported(big_chunk).has_value());
  const Case fine = test::kernel_case({4, 64, 4096, 128, 64, Decay::none}, "chunked", Mode::fwd_bwd, "cuda", "bf16");
  CHECK_FALSE(backend->unsupported(fine).has_value());
}

// The chunked kernels' launch figures and occupancy on this GPU (scripts/device_check.sh prints them).
TEST_CASE("chunked kernels' occupancy", "[.][occupancy]") {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  test::report_gated_chunked_kernels(prop.name);
  test::report_chunked_delta_kernels(prop.name);
}

// Small shapes for compute-sanitizer (memcheck, racecheck, synccheck): every kernel and pass (the
// gated and delta chunked ones too), both dtypes, the vector and the element-wise staging, one and several staged row blocks. Hidden from
// the normal run; scripts/device_check.sh runs it under the sanitizer.
TEST_CASE("sanitizer shapes", "[.][sanitize]") {
  const std::vector<Problem> shapes = {{1, 2, 45, 20, 16, Decay::retnet}, {1, 1, 150, 128, 128, Decay::none},
                                       {1, 1, 33, 13, 64, Decay::retnet}};
  for (const std::string dtype : {"float32", "bf16"})
    for (const Problem& p : shapes)
      for (const std::string impl : {"scan", "chunked"}) {
        INFO(dtype << " " << impl << " " << test::describe(p));
        CHECK(run_cuda_case(p, impl, Mode::fwd_bwd, dtype).check.passed);
      }
  // The gated chunked kernels (the chunked_gated row): both gates, one and several row blocks
  // (chunk 150: 64 + 64 + 22, walked blocks), a ragged last chunk, dims off multiples of 16.
  const std::vector<Problem> gated = {{1, 2, 45, 20, 16, Decay::scalar}, {1, 1, 170, 40, 150, Decay::vector},
                                      {1, 1, 33, 13, 64, Decay::vector}, {1, 1, 100, 128, 64, Decay::scalar}};
  // The delta rule's chunked kernels (cuda/chunked_delta*.cu): every kind of gate, a ragged chunk of
  // 16 and one of 64 at dim 128.
  const std::vector<Problem> delta = {Problem{1, 2, 45, 20, 16, Decay::retnet, Rule::delta},
                                      Problem{1, 2, 45, 20, 16, Decay::scalar, Rule::delta},
                                      Problem{1, 1, 100, 128, 64, Decay::vector, Rule::delta}};
  for (const std::vector<Problem>* family : {&gated, &delta})
    for (const std::string dtype : {"float32", "bf16"})
      for (const Problem& p : *family) {
        INFO(dtype << " chunked " << test::describe(p));
        CHECK(run_cuda_case(p, "chunked", Mode::fwd_bwd, dtype).check.passed);
      }
}

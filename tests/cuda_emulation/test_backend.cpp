// The CUDA backend itself (backends/cuda: its impl rows, DeviceCase, the counting device allocator,
// the layer's composition in kernels/layer/cuda_layer.cpp) built against the emulation, with
// cuBLAS stood in by OpenBLAS (cublas_emulated.cpp): the correctness table (tests/op_table.hpp),
// every op x impl row x shape x mode x dtype against the float64 reference, the chunk states kept
// and recomputed, exactly as tests/cuda/test_cuda_ops.cpp runs it on a GPU. CTest runs it once per
// device limit, which changes the tiles the launchers choose and what the rows decline.
#include <catch2/catch.hpp>

#include "backends/cuda/cuda_backend.hpp"
#include "lattn_emu/control.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

std::unique_ptr<Backend> emulated_cuda(const BackendOptions& options) { return cuda::make_cuda_backend(options); }

}  // namespace

TEST_CASE("emulation: every CUDA impl row matches the float64 reference on the test table", "[emulation][backend]") {
  const test::TableRun run = test::run_op_table("cuda", emulated_cuda);
  for (const auto& [reason, cases] : run.not_supported) WARN("not supported: " << reason << " (" << cases << " cases)");
  for (const auto& row : test::op_test_table()) {
    INFO(row.shapes.front().op->name);
    CHECK(run.checked_by_op.count(row.shapes.front().op->name) == 1);
  }
  // Under both device limits the rows decline nothing of the table but the float32-only layer's bf16 cases.
  for (const auto& [reason, cases] : run.not_supported) {
    INFO(reason);
    CHECK(reason.find("layer") == 0);
    CHECK(reason.find("float32 only") != std::string::npos);
  }
}

TEST_CASE("emulation: the CUDA backend's availability and device block", "[emulation][backend]") {
  const auto backend = emulated_cuda(BackendOptions{});
  CHECK(backend->availability().available);
  const DeviceInfo info = backend->describe();
  REQUIRE(info.cuda);
  REQUIRE(info.cuda->gpu);
  CHECK(info.cuda->gpu->name == "lattn CPU emulation");
  CHECK(info.cuda->gpu->shared_memory_per_block_optin_kb * 1024 == double(lattn_emu::shared_optin_limit()));
  CHECK(info.cuda->gpu->sm_count > 0);
  CHECK(info.cuda->driver_cuda_version);
  REQUIRE(backend->memory_available);
  CHECK(backend->memory_available() > 0);
  CHECK(emulated_cuda(BackendOptions{0, 1, false})->availability().reason.find("--device 1") != std::string::npos);
}

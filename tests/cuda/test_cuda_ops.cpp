// The correctness table (op_table.hpp) on the CUDA backend: every op, impl, shape, decay, mode and
// dtype against the float64 reference; what the GPU declines is printed with its reason.
#include <catch2/catch.hpp>

#include "op_table.hpp"

using namespace lattn;

TEST_CASE("every CUDA impl of every op matches the float64 reference on the test table", "[cuda][ops]") {
  const test::TableRun run = test::run_op_table("cuda");
  for (const auto& [reason, cases] : run.not_supported) WARN("not supported: " << reason << " (" << cases << " cases)");
  for (const auto& row : test::op_test_table()) {
    INFO(row.shapes.front().op->name);
    CHECK(run.checked_by_op.count(row.shapes.front().op->name) == 1);
  }
}

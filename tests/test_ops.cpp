// The correctness table (op_table.hpp) on the CPU backend: every op, impl, shape, decay and mode
// against the float64 reference; what the CPU declines (bf16) is printed with its reason.
#include <catch2/catch.hpp>

#include "op_table.hpp"

using namespace lattn;

TEST_CASE("every CPU impl of every op matches the float64 reference on the test table", "[ops]") {
  const test::TableRun run = test::run_op_table("cpu");
  for (const auto& [reason, cases] : run.not_supported) WARN("not supported: " << reason << " (" << cases << " cases)");
  // The CPU runs every op of the table: each was checked, not only declined.
  for (const auto& row : test::op_test_table()) {
    INFO(row.shapes.front().op->name);
    CHECK(run.checked_by_op.count(row.shapes.front().op->name) == 1);
  }
}

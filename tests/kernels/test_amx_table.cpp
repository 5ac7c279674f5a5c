// The correctness table (tests/op_table.hpp) through the CPU's AMX rows: every case of the table
// whose bf16 variant is an AMX row (chunked_amx, chunked_amx_gated, chunked_amx_delta, the layer's
// "products amx") against the op's float64 reference. Linked into lattn_amx_tests, whose main sets
// the tile path: amx_emulated runs these on the emulated tiles on every CPU, amx_hardware on the
// CPU's own tiles. So what fails on the silicon (the emulation being exact to it) fails on every
// CPU in CI, not only on an AMX host's lattn_tests.
#include <catch2/catch.hpp>

#include <string>

#include "amx_tests.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

bool on_amx_tiles(const std::string& variant) {
  return variant.rfind("chunked_amx", 0) == 0 || variant.rfind("products amx", 0) == 0;
}

}  // namespace

TEST_CASE("the op table's bf16 cases on AMX rows match the float64 reference", "[amx][table]") {
  const std::unique_ptr<Backend> chooser = make_backend("cpu", BackendOptions{0, 0, true});
  std::map<std::string, int> on_tiles;  // op -> cases run on the AMX rows
  const test::TableRun run = test::run_op_table(
      "cpu", [](const BackendOptions& options) { return make_backend("cpu", options); },
      [&](const Case& c) {
        if (c.dtype != "bf16" || !on_amx_tiles(chooser->variant(c))) return false;
        ++on_tiles[c.op->name];
        return true;
      });
  INFO((amx_tests::hardware_run ? "on the hardware's tiles" : "on the emulated tiles"));
  // Both ops with AMX rows reach them, and every case included was checked.
  CHECK(on_tiles["linear_attention"] > 0);
  CHECK(on_tiles["layer"] > 0);
  int included = 0;
  for (const auto& [op, cases] : on_tiles) included += cases;
  CHECK(run.checked == included);
  for (const auto& [op, cases] : on_tiles) WARN(op << ": " << cases << " cases on AMX tiles");
}

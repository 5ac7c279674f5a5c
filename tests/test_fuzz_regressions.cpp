// Every input in fuzz/regressions/ (the fuzzer's finds, and its seeds) must load or be refused
// with a UsageError, as YAML and as JSON: never another exception.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/config.hpp"
#include "src/plan.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace lattn;

TEST_CASE("the fuzzer's regression inputs load or are refused cleanly", "[config][fuzz]") {
  std::size_t inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() + "/fuzz/regressions")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    for (const char* name : {"fuzz.yaml", "fuzz.json"}) {
      INFO(entry.path().filename().string() << " as " << name);
      try {
        (void)expand_plan(parse_config(text.str(), name));
      } catch (const UsageError&) {
      }
    }
    ++inputs;
  }
  CHECK(inputs >= 3);
}

TEST_CASE("a JSON number too large for a double is a config error with its line", "[config][fuzz]") {
  try {
    parse_config("{\n \"reps\": 1e999\n}", "big.json");
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("big.json:2") && Catch::Matchers::Contains("out of range"));
  }
}

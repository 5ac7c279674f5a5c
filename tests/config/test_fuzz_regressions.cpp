// Every input in fuzz/regressions/<target>/ (the fuzzers' finds, and their seeds) must be accepted
// or refused with a UsageError by what that fuzzer drives: never another exception. config/: the
// config loader, as YAML and as JSON; cli/: the command-line parser (arguments split at NUL);
// journal/: the journal reader and its records against the default plan.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "src/cli/cli.hpp"
#include "src/config/config.hpp"
#include "src/results/journal.hpp"
#include "src/config/plan.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

// The inputs of one fuzzer's folder, by file name.
std::vector<std::pair<std::string, std::string>> regression_inputs(const std::string& target) {
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() + "/fuzz/regressions/" + target)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    inputs.emplace_back(entry.path().filename().string(), text.str());
  }
  return inputs;
}

}  // namespace

TEST_CASE("the config fuzzer's regression inputs load or are refused cleanly", "[config][fuzz]") {
  const auto inputs = regression_inputs("config");
  for (const auto& [name, text] : inputs)
    for (const char* as : {"fuzz.yaml", "fuzz.json"}) {
      INFO(name << " as " << as);
      try {
        (void)expand_plan(parse_config(text, as));
      } catch (const UsageError&) {
      }
    }
  CHECK(inputs.size() >= 3);
}

TEST_CASE("the command-line fuzzer's regression inputs parse or are refused cleanly", "[cli][fuzz]") {
  const auto inputs = regression_inputs("cli");
  for (const auto& [name, bytes] : inputs) {
    INFO(name);
    std::vector<std::string> argv = {"lattnbench"};
    std::stringstream args(bytes);
    for (std::string arg; std::getline(args, arg, '\0');) argv.push_back(arg);
    try {
      (void)parse_command_line(argv);
    } catch (const UsageError&) {
    }
  }
  CHECK(inputs.size() >= 3);
}

TEST_CASE("the journal fuzzer's regression inputs are read or refused cleanly", "[journal][fuzz]") {
  const std::vector<Case> plan = expand_plan(embedded_default_config());
  const auto inputs = regression_inputs("journal");
  for (const auto& [name, text] : inputs) {
    INFO(name);
    try {
      const JournalContents contents = parse_journal(text, name);
      (void)resumed_records(contents, contents.header, plan, plan, name);
    } catch (const UsageError&) {
    }
  }
  CHECK(inputs.size() >= 2);
}

TEST_CASE("a JSON number too large for a double is a config error with its line", "[config][fuzz]") {
  try {
    parse_config("{\n \"reps\": 1e999\n}", "big.json");
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("big.json:2") && Catch::Matchers::Contains("out of range"));
  }
}

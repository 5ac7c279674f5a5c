// libFuzzer target: the config loader and validator on arbitrary bytes, as YAML and as JSON.
// Every input must either load to a plan or be refused with a UsageError; anything else (a crash,
// another exception, a hang, an unbounded allocation) is a bug. Built with -DLATTN_FUZZ=ON and
// clang; scripts/fuzz.sh runs it, and tests/config/test_fuzz_regressions.cpp replays what it found.
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/config/config.hpp"
#include "src/config/plan.hpp"
#include "core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* name : {"fuzz.yaml", "fuzz.json"}) {
    try {
      const lattn::Config config = lattn::parse_config(text, name);
      (void)lattn::expand_plan(config);
    } catch (const lattn::UsageError&) {
    }
  }
  return 0;
}

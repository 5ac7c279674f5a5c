// libFuzzer target: the journal reader on arbitrary bytes. The text is read as a journal
// (src/results/journal.cpp), and each of its records checked against the embedded default config's plan
// and read back into a record (record_from_json), with the journal's own header standing for this
// run's so that the records, not only the header, are reached. Every input must be accepted or be
// refused with a UsageError; anything else is a bug. Built with -DLATTN_FUZZ=ON and clang;
// scripts/fuzz.sh runs it, and tests/config/test_fuzz_regressions.cpp replays what it found
// (fuzz/regressions/journal/).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "src/config/config.hpp"
#include "src/results/journal.hpp"
#include "src/config/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<lattn::Case> plan = lattn::expand_plan(lattn::embedded_default_config());
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const lattn::JournalContents contents = lattn::parse_journal(text, "fuzz.jsonl");
    (void)lattn::resumed_records(contents, contents.header, plan, plan, "fuzz.jsonl");
  } catch (const lattn::UsageError&) {
  }
  return 0;
}

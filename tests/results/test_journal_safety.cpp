// A run's journal is never lost or corrupted: a plain rerun does not overwrite an unfinished
// run's journal, two runs never write one journal at once, a line cut short is cut off before
// --resume appends, a full disk is its own exit status with the finished cases kept, and a
// journal whose lines are not this run's records is refused in one line.
#include <catch2/catch.hpp>

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "src/results/journal.hpp"
#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("a plain rerun refuses an unfinished run's journal, and --force starts over", "[journal][rerun][spawns]") {
  const fs::path dir = fresh_dir("rerun");
  const fs::path out = dir / "r.json";
  REQUIRE(killed_after(out, 3, dir / "log1"));
  const std::string before = read_text(journal_of(out));

  const ProcessResult again = run_args(with(slow_run_args(out), {"--dump", (dir / "new-dump").string()}), dir / "log2");
  INFO(again.output);
  CHECK(again.exit_status == 2);
  CHECK_FALSE(fs::exists(dir / "new-dump"));  // refused: no folder made for it either
  const auto errors = error_lines(again.output);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Contains("--resume " + journal_of(out)) && Contains("--force"));
  CHECK(read_text(journal_of(out)) == before);  // untouched
  CHECK_FALSE(fs::exists(out));

  const ProcessResult forced = run_args(with(slow_run_args(out), {"--force"}), dir / "log3");
  INFO(forced.output);
  CHECK(forced.exit_status == 0);
  CHECK(read_json(out)["results"].size() == 12);
  CHECK_FALSE(fs::exists(journal_of(out)));
  fs::remove_all(dir);
}

TEST_CASE("a second run on the same --out exits 2 naming the first one's pid", "[journal][lock][spawns]") {
  const fs::path dir = fresh_dir("lock");
  const fs::path out = dir / "r.json";
  const pid_t first = spawn(slow_run_args(out), dir / "log1");
  wait_for_journal(journal_of(out), 1);
  const ProcessResult second = run_args(slow_run_args(out), dir / "log2");
  INFO(second.output);
  CHECK(second.exit_status == 2);
  const auto errors = error_lines(second.output);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Contains("pid " + std::to_string(first)));
  // The same through --resume of the journal the first run is writing.
  const ProcessResult resumer = run_args(with(slow_run_args(out), {"--resume", journal_of(out)}), dir / "log3");
  INFO(resumer.output);
  CHECK(resumer.exit_status == 2);
  CHECK_THAT(resumer.output, Contains("pid " + std::to_string(first)));
  CHECK(wait_exit(first) == 0);
  const nlohmann::json doc = read_json(out);
  CHECK(doc["results"].size() == 12);
  for (std::size_t i = 0; i < doc["results"].size(); ++i) CHECK(doc["results"][i]["plan_index"] == i);
  fs::remove_all(dir);
}

TEST_CASE("a partial last journal line is cut off, said on stderr, before --resume appends", "[journal][resume][spawns]") {
  const fs::path dir = fresh_dir("partial");
  const fs::path out = dir / "r.json";
  const std::string journal = journal_of(out);
  REQUIRE(killed_after(out, 2, dir / "log1"));
  const std::size_t whole = read_journal(journal).records.size();
  {
    std::ofstream append(journal, std::ios::app | std::ios::binary);
    append << R"({"plan_index": 5, "suite": "kernel", "impl": "sc)";  // a write a full disk cut short
  }
  // Resume, and stop that run too once it has added a case: the journal must still be readable.
  const pid_t resumed = spawn(with(slow_run_args(out), {"--resume", journal}), dir / "log2");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (true) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    try {
      if (read_journal(journal).records.size() > whole) break;
    } catch (const std::exception&) {  // the damaged line, until the resumed run cuts it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(kill(resumed, SIGKILL) == 0);
  wait_exit(resumed);
  CHECK_THAT(read_text(dir / "log2"), Contains("partial last line"));
  const ProcessResult last = run_args(with(slow_run_args(out), {"--resume", journal}), dir / "log3");
  INFO(last.output);
  CHECK(last.exit_status == 0);
  CHECK(read_json(out)["results"].size() == 12);
  fs::remove_all(dir);
}

TEST_CASE("a full disk exits 4 in one line, keeps the finished cases in the journal, and --resume finishes",
          "[journal][disk][spawns]") {
  // What this simulates: RLIMIT_FSIZE with SIGXFSZ ignored makes a write past the limit fail with
  // EFBIG, the way a write on a full disk fails with ENOSPC (no root or tmpfs needed). The journal's
  // header and a few records fit under the limit; the result file does not.
  const fs::path dir = fresh_dir("diskfull");
  const fs::path out = dir / "r.json";
  const ProcessResult full = run_args(slow_run_args(out), dir / "log1", 8 * 1024);
  INFO(full.output);
  CHECK(full.exit_status == 4);
  const auto errors = error_lines(full.output);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Contains("File too large") && Contains("--resume " + journal_of(out)));
  const JournalContents kept = read_journal(journal_of(out));
  CHECK(kept.records.size() >= 2);
  CHECK(kept.records.size() < 12);

  const ProcessResult resumed = run_args(with(slow_run_args(out), {"--resume", journal_of(out)}), dir / "log2");
  INFO(resumed.output);
  CHECK(resumed.exit_status == 0);
  const nlohmann::json doc = read_json(out);
  REQUIRE(doc["results"].size() == 12);
  for (const auto& line : kept.records) CHECK(doc["results"][line.record["plan_index"].get<std::size_t>()] == line.record);
  fs::remove_all(dir);
}

TEST_CASE("a journal whose lines are not this run's records is refused in one line", "[journal][resume][spawns]") {
  const fs::path dir = fresh_dir("edited");
  const fs::path out = dir / "r.json";
  REQUIRE(killed_after(out, 2, dir / "log1"));
  const JournalContents real = read_journal(journal_of(out));
  auto resume_with = [&](const nlohmann::json& header, const std::vector<nlohmann::json>& records) {
    {
      std::ofstream rewrite(journal_of(out), std::ios::trunc);
      rewrite << header.dump() << "\n";
      for (const auto& r : records) rewrite << r.dump() << "\n";
    }
    return run_args(with(slow_run_args(out), {"--resume", journal_of(out)}), dir / "log");
  };
  const nlohmann::json first = real.records.at(0).record;
  nlohmann::json no_index = first, no_status = first, bad_schema = real.header, bad_size = real.header;
  no_index.erase("plan_index");
  no_status.erase("status");
  bad_schema["schema_version"] = "0.1.0";
  bad_size["plan_size"] = 13;
  const struct {
    const char* what;
    nlohmann::json header;
    std::vector<nlohmann::json> records;
    const char* expected;
  } cases[] = {
      {"a hand-written ok record", real.header, {{{"plan_index", 0}, {"status", "ok"}}}, "does not match case 0"},
      {"a record without plan_index", real.header, {no_index}, "plan_index"},
      {"a record without status", real.header, {no_status}, "status"},
      {"a case twice", real.header, {first, first}, "twice"},
      {"another schema_version", bad_schema, {first}, "schema_version"},
      {"another plan_size", bad_size, {first}, "plan_size"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const ProcessResult result = resume_with(c.header, c.records);
    INFO(result.output);
    CHECK(result.exit_status == 2);
    const auto errors = error_lines(result.output);
    REQUIRE(errors.size() == 1);
    CHECK_THAT(errors[0], Contains(c.expected));
    CHECK_FALSE(fs::exists(out));
  }
  fs::remove_all(dir);
}

TEST_CASE("resuming with an --out other than the journal's is refused", "[journal][resume][spawns]") {
  const fs::path dir = fresh_dir("resume-out");
  const fs::path out = dir / "r.json";
  REQUIRE(killed_after(out, 1, dir / "log1"));
  const std::string before = read_text(journal_of(out));
  auto args = slow_run_args(dir / "other.json");
  const ProcessResult result = run_args(with(args, {"--resume", journal_of(out)}), dir / "log2");
  INFO(result.output);
  CHECK(result.exit_status == 2);
  const auto errors = error_lines(result.output);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Contains("--out") && Contains(out.string()));
  CHECK(read_text(journal_of(out)) == before);
  CHECK_FALSE(fs::exists(dir / "other.json"));
  fs::remove_all(dir);
}

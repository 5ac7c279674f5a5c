// Nothing is lost: a real run killed with SIGINT writes what finished (marked interrupted); one
// killed with SIGKILL leaves its journal, and --resume completes it into the file an uninterrupted
// run writes. A case too big for memory is skipped with the reason, and the run goes on.
#include <catch2/catch.hpp>

#include <signal.h>

#include <filesystem>

#include "src/journal.hpp"
#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
namespace fs = std::filesystem;

TEST_CASE("SIGINT and SIGTERM finish the sample, write the finished cases marked interrupted, exit 128+signal",
          "[robustness][signals]") {
  for (int sig : {SIGINT, SIGTERM}) {
    INFO("signal " << sig);
    const fs::path dir = test::fresh_dir("sigint");
    const fs::path out = dir / "r.json";
    const pid_t pid = spawn(slow_run_args(out), dir / "log");
    wait_for_journal(fs::path(out.string() + ".journal.jsonl"), 2);
    REQUIRE(kill(pid, sig) == 0);
    CHECK(wait_exit(pid) == 128 + sig);
    const nlohmann::json doc = read_json(out);
    CHECK(doc["interrupted"] == true);
    CHECK(doc["results"].size() >= 2);
    CHECK(doc["results"].size() < 12);
    for (const auto& r : doc["results"]) CHECK(r["status"] == "ok");
    CHECK(fs::exists(out.string() + ".journal.jsonl"));  // kept for --resume
    fs::remove_all(dir);
  }
}

TEST_CASE("after SIGKILL the journal survives and --resume completes the run", "[robustness][resume]") {
  const fs::path dir = test::fresh_dir("sigkill");
  const fs::path out = dir / "r.json";
  const fs::path journal = out.string() + ".journal.jsonl";
  const auto args = slow_run_args(out);
  CHECK(killed_after(out, 3, dir / "log1"));
  CHECK_FALSE(fs::exists(out));
  const JournalContents before = read_journal(journal.string());
  REQUIRE(before.records.size() >= 3);
  REQUIRE(before.records.size() < 12);

  auto resume_args = args;
  resume_args.push_back("--resume");
  resume_args.push_back(journal.string());
  const pid_t resumed = spawn(resume_args, dir / "log2");
  CHECK(wait_exit(resumed) == 0);
  const nlohmann::json doc = read_json(out);
  REQUIRE(doc["results"].size() == 12);
  CHECK_FALSE(doc.contains("interrupted"));
  for (std::size_t i = 0; i < doc["results"].size(); ++i) CHECK(doc["results"][i]["plan_index"] == i);
  for (const auto& kept : before.records) CHECK(doc["results"][kept.record["plan_index"].get<std::size_t>()] == kept.record);
  CHECK(doc["argv"] == before.header["argv"]);
  CHECK_FALSE(fs::exists(journal));  // complete: the journal is no longer needed
  fs::remove_all(dir);
}

TEST_CASE("resume refuses a journal of another config", "[robustness][resume]") {
  const fs::path dir = test::fresh_dir("resume-mismatch");
  const fs::path journal = dir / "j.jsonl";
  {
    Journal j(journal.string(), {{"journal", "lattnbench"}, {"config", {{"reps", 99}}}}, false);
  }
  const auto result = test::run_process(test::binary() + " --suite kernel --seq 16 --dim 4 --quiet --out " + (dir / "r.json").string() +
                                        " --resume " + journal.string());
  CHECK(result.exit_status == 2);
  CHECK_THAT(result.output, Catch::Matchers::Contains("the journal's config differs"));
  fs::remove_all(dir);
}

TEST_CASE("resume refuses a journal written on another CPU", "[robustness][resume]") {
  // A VM can be given another CPU generation under the same model name: the signature tells.
  const fs::path dir = test::fresh_dir("resume-cpu");
  const fs::path out = dir / "r.json";
  const fs::path journal = out.string() + ".journal.jsonl";
  const auto args = slow_run_args(out);
  killed_after(out, 1, dir / "log1");
  JournalContents contents = read_journal(journal.string());
  REQUIRE(contents.header["device"].contains("cpu_signature"));
  contents.header["device"]["cpu_signature"] = "GenuineIntel family 6 model 143 stepping 8";
  {
    Journal rewritten(journal.string(), contents.header, false);
    for (const auto& record : contents.records) rewritten.append(record.record);
  }
  auto resume_args = args;
  resume_args.push_back("--resume");
  resume_args.push_back(journal.string());
  std::string command;
  for (const auto& arg : resume_args) command += arg + " ";
  const auto result = test::run_process(command);
  CHECK(result.exit_status == 2);
  CHECK_THAT(result.output, Catch::Matchers::Contains("written on another device") &&
                                Catch::Matchers::Contains("GenuineIntel family 6 model 143"));
  fs::remove_all(dir);
}

TEST_CASE("a case too big for memory is skipped with the reason, and the run goes on", "[robustness][memory]") {
  const fs::path dir = test::fresh_dir("memguard");
  const fs::path out = dir / "r.json";
  const auto result = test::run_process(test::binary() + " --suite kernel --seq 16,16777216 --dim 128 --batch 1 --heads 1 --impl scan "
                                        "--mode fwd --reps 2 --min-sample-ms 1 --quiet --out " + out.string());
  CHECK(result.exit_status == 0);
  const nlohmann::json doc = read_json(out);
  REQUIRE(doc["results"].size() == 2);
  CHECK(doc["results"][0]["status"] == "ok");
  CHECK(doc["results"][1]["status"] == "skipped");
  CHECK_THAT(doc["results"][1]["skip_reason"].get<std::string>(), Catch::Matchers::Contains("memory: needs about"));
  fs::remove_all(dir);
}

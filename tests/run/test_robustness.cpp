// Nothing is lost: a real run killed with SIGINT writes what finished (marked interrupted); one
// killed with SIGKILL leaves its journal, and --resume completes it into the file an uninterrupted
// run writes. A case too big for memory is skipped with the reason, and the run goes on.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "src/results/journal.hpp"
#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
namespace fs = std::filesystem;

TEST_CASE("SIGINT and SIGTERM finish the sample, write the finished cases marked interrupted, exit 128+signal",
          "[robustness][signals][spawns]") {
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
    // One case at a time (--no-interleave): at most the one in flight is partial.
    CHECK(std::count_if(doc["results"].begin(), doc["results"].end(),
                        [](const nlohmann::json& r) { return r["stopped_on"] == "interrupted"; }) <= 1);
    CHECK(fs::exists(out.string() + ".journal.jsonl"));  // kept for --resume
    fs::remove_all(dir);
  }
}

TEST_CASE("SIGINT in an interleaved batch keeps every case's samples, and --resume measures those cases again in full",
          "[robustness][signals][resume][interleave][spawns]") {
  const fs::path dir = test::fresh_dir("sigint-batch");
  const fs::path out = dir / "r.json";
  const fs::path journal = journal_of(out);
  // Eight cases of ~1 ms calls, 30 samples of 20 ms each: one batch of about 5 s of rounds.
  const std::vector<std::string> args = {binary(), "--suite", "kernel", "--seq", "3000,3001", "--dim", "48", "--batch", "1",
                                         "--heads", "4", "--reps", "30", "--max-noise", "0", "--timeout", "0",
                                         "--min-sample-ms", "20", "--threads", "1", "--out", out.string()};
  const pid_t pid = spawn(args, dir / "log1");
  // The progress on a pipe says when the batch's rounds begin.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_text(dir / "log1").find("prepared, sampling in rounds") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // About 15 rounds of the 8 cases (each sample at least 20 ms), far from the 30 samples.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  REQUIRE(kill(pid, SIGINT) == 0);
  CHECK(wait_exit(pid) == 128 + SIGINT);
  const nlohmann::json partial = read_json(out);
  INFO(read_text(dir / "log1"));
  CHECK(partial["interrupted"] == true);
  // Every case with a sample is kept. A sample shorter than its minimum starts a case's samples
  // over (at most three times), so on a busy machine a case can be caught with none.
  const std::size_t kept = partial["results"].size();
  CHECK(kept >= 4);
  CHECK(kept <= 8);
  for (const auto& r : partial["results"]) {
    CHECK(r["stopped_on"] == "interrupted");
    CHECK(r["samples_ms"].size() >= 1);
    CHECK(r["samples_ms"].size() < 30);
  }
  CHECK_THAT(read_text(dir / "log1"),
             Catch::Matchers::Contains("interrupted after 0 of 8 cases and " + std::to_string(kept) + " kept partial"));
  CHECK(read_journal(journal.string()).records.size() == kept);  // the journal has them too

  auto resume_args = args;
  resume_args.push_back("--resume");
  resume_args.push_back(journal.string());
  const pid_t resumed = spawn(resume_args, dir / "log2");
  CHECK(wait_exit(resumed) == 0);
  const nlohmann::json doc = read_json(out);
  REQUIRE(doc["results"].size() == 8);
  CHECK_FALSE(doc.contains("interrupted"));
  for (const auto& r : doc["results"]) {
    CHECK(r["stopped_on"] == "samples");
    CHECK(r["samples_ms"].size() == 30);  // measured again from the start, not completed
  }
  CHECK_FALSE(fs::exists(journal));
  fs::remove_all(dir);
}

TEST_CASE("interleaved batches are bounded by memory: a tiny bound makes batches of one", "[robustness][interleave][memory][spawns]") {
  const fs::path dir = test::fresh_dir("batch-memory");
  const std::string small = binary() + " --suite kernel --seq 16,32 --dim 8 --reps 2 --min-sample-ms 1 --threads 1 --out ";
  // A pipe: one line per batch and per finished case, none per sampling round.
  const auto together = test::run_process(small + (dir / "a.json").string());
  REQUIRE(together.exit_status == 0);
  CHECK_THAT(together.output, Catch::Matchers::Contains("batch of 8 cases (000-") &&
                                  Catch::Matchers::Contains("prepared, sampling in rounds"));
  CHECK(together.output.find("round ") == std::string::npos);
  const auto alone = test::run_process(small + (dir / "b.json").string() + " --batch-memory 1e-9");
  REQUIRE(alone.exit_status == 0);
  INFO(alone.output);
  std::size_t batches = 0, finished = 0;
  for (std::size_t at = 0; (at = alone.output.find("batch of 1 case (", at)) != std::string::npos; ++at) ++batches;
  for (std::size_t at = 0; (at = alone.output.find("\n[", at)) != std::string::npos; ++at) ++finished;
  CHECK(batches == 8);
  CHECK(finished == 8);
  CHECK(alone.output.find("batch of 2") == std::string::npos);
  CHECK(read_json(dir / "b.json")["config"]["batch_memory"] == 1e-9);
  for (const char* bad : {"0", "-0.5", "2"}) {
    const auto refused = test::run_process(small + (dir / "c.json").string() + " --batch-memory " + bad);
    CHECK(refused.exit_status == 2);
    CHECK_THAT(refused.output, Catch::Matchers::Contains("--batch-memory: expected a number in (0, 1]"));
  }
  fs::remove_all(dir);
}

TEST_CASE("after SIGKILL the journal survives and --resume completes the run", "[robustness][resume][spawns]") {
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

TEST_CASE("resume refuses a journal of another config", "[robustness][resume][spawns]") {
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

TEST_CASE("resume refuses a journal written on another CPU", "[robustness][resume][spawns]") {
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

TEST_CASE("a case too big for memory is skipped with the reason, and the run goes on", "[robustness][memory][spawns]") {
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

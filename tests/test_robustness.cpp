// Nothing is lost: a real run killed with SIGINT writes what finished (marked interrupted); one
// killed with SIGKILL leaves its journal, and --resume completes it into the file an uninterrupted
// run writes. A case too big for memory is skipped with the reason, and the run goes on.
#include <catch2/catch.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "src/journal.hpp"
#include "test_util.hpp"

extern char** environ;

using namespace lattn;
namespace fs = std::filesystem;

namespace {

// Twelve cases of a few hundred milliseconds each.
std::vector<std::string> slow_run_args(const fs::path& out) {
  return {test::binary(), "--suite", "kernel", "--seq", "3000,3001,3002", "--dim", "48", "--batch", "1", "--heads", "4", "--reps", "4",
          "--min-sample-ms", "20", "--threads", "1", "--quiet", "--out", out.string()};
}

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

std::size_t line_count(const fs::path& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// Waits until the journal holds `records` finished cases (plus its header line).
void wait_for_journal(const fs::path& journal, std::size_t records) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (line_count(journal) < records + 1) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int wait_exit(pid_t pid, bool* signalled = nullptr) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (signalled) *signalled = WIFSIGNALED(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Starts slow_run_args(out), SIGKILLs it once its journal holds `records` cases; whether the
// signal ended it.
bool killed_after(const fs::path& out, std::size_t records, const fs::path& log) {
  const pid_t pid = spawn(slow_run_args(out), log);
  wait_for_journal(out.string() + ".journal.jsonl", records);
  REQUIRE(kill(pid, SIGKILL) == 0);
  bool signalled = false;
  wait_exit(pid, &signalled);
  return signalled;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

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

// Running the real executable in the background for the tests of what a run keeps, refuses and
// survives: spawning it with its output in a log, waiting for its journal to grow, killing it,
// and reading what it left.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

extern char** environ;

namespace lattn::test {

// Twelve cases of a few hundred milliseconds each, one after another: the journal tests wait for
// the k-th record and then act while the run goes on, and interleaved rounds would journal all
// twelve at the end of their one batch.
inline std::vector<std::string> slow_run_args(const std::filesystem::path& out) {
  return {binary(), "--suite", "kernel", "--seq", "3000,3001,3002", "--dim", "48", "--batch", "1", "--heads", "4", "--reps", "4",
          "--min-sample-ms", "20", "--no-interleave", "--threads", "1", "--quiet", "--out", out.string()};
}

inline std::string journal_of(const std::filesystem::path& out) { return out.string() + ".journal.jsonl"; }

// Starts `args` with stdout and stderr in `log`. With `file_size_limit` > 0 the child runs under
// RLIMIT_FSIZE of that many bytes with SIGXFSZ ignored: a write past the limit then fails with
// EFBIG, as one past the end of a full disk fails with ENOSPC.
inline pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, rlim_t file_size_limit = 0) {
  require_spawns_tag();
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  if (file_size_limit > 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // only async-signal-safe calls until exec
      const struct rlimit limit{file_size_limit, file_size_limit};
      ::signal(SIGXFSZ, SIG_IGN);
      ::setrlimit(RLIMIT_FSIZE, &limit);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fd);
    return pid;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

inline std::size_t line_count(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// Waits until the journal holds `records` finished cases (plus its header line).
inline void wait_for_journal(const std::filesystem::path& journal, std::size_t records) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (line_count(journal) < records + 1) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

inline int wait_exit(pid_t pid, bool* signalled = nullptr) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (signalled) *signalled = WIFSIGNALED(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs `args` to the end; its exit status and output.
inline ProcessResult run_args(const std::vector<std::string>& args, const std::filesystem::path& log,
                              rlim_t file_size_limit = 0) {
  ProcessResult result;
  result.exit_status = wait_exit(spawn(args, log, file_size_limit));
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

// Starts slow_run_args(out), SIGKILLs it once its journal holds `records` cases; whether the
// signal ended it.
inline bool killed_after(const std::filesystem::path& out, std::size_t records, const std::filesystem::path& log) {
  const pid_t pid = spawn(slow_run_args(out), log);
  wait_for_journal(journal_of(out), records);
  REQUIRE(kill(pid, SIGKILL) == 0);
  bool signalled = false;
  wait_exit(pid, &signalled);
  return signalled;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of `output` that are errors (warnings about a loaded machine may come before them).
inline std::vector<std::string> error_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.find("lattnbench: error") != std::string::npos || line.find("internal error") != std::string::npos)
      lines.push_back(line);
  return lines;
}

inline std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace lattn::test

#include "src/run/isolate.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "src/run/interrupt.hpp"
#include "src/results/record_json.hpp"

namespace lattn {
namespace {

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone: nothing to tell
    done += std::size_t(n);
  }
}

std::string read_all(int fd) {
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return text;
    text.append(buffer, std::size_t(n));
  }
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

}  // namespace

Measurement run_isolated(const Case& kase, const std::function<Measurement()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw RuntimeFailure(std::string("--isolate: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw RuntimeFailure(std::string("--isolate: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    omp_set_num_threads(1);  // see isolate.hpp
    CaseRecord record;
    record.kase = kase;
    try {
      record.measured = body();
      record.status = !record.measured->unchecked.empty()       ? Status::unchecked
                      : record.measured->check_failure.empty() ? Status::ok
                                                               : Status::failed;
    } catch (const std::exception& e) {
      record.status = Status::failed;
      record.error = e.what();
    }
    write_all(fds[1], to_json(record).dump());
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(0);  // no exit handlers, no destructors of the parent's objects
  }
  ::close(fds[1]);
  const std::string text = read_all(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // SIGINT or SIGTERM reached the child too (one process group): the case is left out, as a case
  // interrupted in this process is, not failed.
  throw_if_stop_requested();
  if (WIFSIGNALED(status))
    throw RuntimeFailure(fmt::format("{} crashed with {} (signal {}) in its isolated child process", kase.impl,
                                     signal_name(WTERMSIG(status)), WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty())
    throw RuntimeFailure(fmt::format("{}'s isolated child process exited with status {} before sending its record",
                                     kase.impl, WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  CaseRecord record;
  try {
    record = record_from_json(nlohmann::json::parse(text), kase, "--isolate");
  } catch (const std::exception& e) {
    throw RuntimeFailure(std::string("--isolate: the child's record does not read back: ") + e.what());
  }
  if (!record.error.empty()) throw RuntimeFailure(record.error);
  if (!record.measured) throw RuntimeFailure("--isolate: the child's record has no measurement");
  return *record.measured;
}

}  // namespace lattn

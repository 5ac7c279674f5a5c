// SIGTERM is answered within a second wherever the run is: in a long warm-up, and in the float64
// reference of a long sequence (which runs before the case's first call). Real processes, timed.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
namespace fs = std::filesystem;

namespace {

// Seconds from SIGTERM to the process's exit, with its exit status; a process still running
// after `give_up` seconds is killed and reported as not stopping.
struct Stop {
  std::optional<double> seconds;
  int exit_status = -1;
};

Stop terminate_and_time(pid_t pid, double give_up = 20) {
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(kill(pid, SIGTERM) == 0);
  Stop stop;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    REQUIRE(done >= 0);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    if (done == pid) {
      stop.seconds = elapsed;
      stop.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return stop;
    }
    if (elapsed > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return stop;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// SIGTERM to `pid`: it must exit 128 + SIGTERM within a second.
void check_stops_within_a_second(pid_t pid, const fs::path& log) {
  const Stop stop = terminate_and_time(pid);
  INFO(read_text(log));
  REQUIRE(stop.seconds.has_value());
  CHECK(*stop.seconds < 1.0);
  CHECK(stop.exit_status == 128 + SIGTERM);
}

// Starts `args`, waits until its journal exists (the first case has begun) and `settle` more.
pid_t start_case(const std::vector<std::string>& args, const fs::path& out, const fs::path& log,
                 std::chrono::milliseconds settle) {
  const pid_t pid = spawn(args, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(journal_of(out))) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(settle);
  return pid;
}

// ~1 ms calls: a million warm-up calls would take about 20 minutes.
std::vector<std::string> long_warm_up_run(const fs::path& out) {
  return {binary(), "--suite", "kernel", "--seq", "3000", "--dim", "48", "--batch", "1", "--heads", "4",
          "--impl", "scan", "--mode", "fwd", "--warmup", "1000000", "--threads", "1", "--quiet", "--out", out.string()};
}

}  // namespace

TEST_CASE("SIGTERM during a long warm-up stops the run within a second", "[signals][stop][spawns]") {
  const fs::path dir = fresh_dir("stop-warmup");
  const fs::path out = dir / "r.json";
  const pid_t pid = start_case(long_warm_up_run(out), out, dir / "log", std::chrono::milliseconds(500));
  check_stops_within_a_second(pid, dir / "log");
  CHECK(read_json(out)["interrupted"] == true);
  fs::remove_all(dir);
}

TEST_CASE("SIGTERM as the journal appears, in the start-up's measurements, still writes the result file",
          "[signals][stop][spawns]") {
  const fs::path dir = fresh_dir("stop-start-up");
  const fs::path out = dir / "r.json";
  // No settling: the signal lands while the start-up times a float64 reference and an sgemm, before
  // the first case; the run must end the usual way, not by the signal's default action.
  const pid_t pid = start_case(long_warm_up_run(out), out, dir / "log", std::chrono::milliseconds(0));
  check_stops_within_a_second(pid, dir / "log");
  INFO(read_text(dir / "log"));
  CHECK(read_json(out)["interrupted"] == true);
  CHECK(read_json(out)["results"].empty());
  CHECK_FALSE(fs::exists(fs::path(journal_of(out) + ".lock")));
  fs::remove_all(dir);
}

TEST_CASE("SIGTERM while a long case's inputs and float64 reference are made stops the run within a second",
          "[signals][stop][spawns]") {
  const fs::path dir = fresh_dir("stop-reference");
  const fs::path out = dir / "r.json";
  // The inputs of 4096 tokens at D 1024 take a fraction of a second, their float64 forward and
  // backward (6 x 4096 x 1024^2 flops, one thread) well over ten.
  const pid_t pid = start_case({binary(), "--suite", "kernel", "--seq", "4096", "--dim", "1024", "--batch", "1", "--heads",
                                "1", "--impl", "scan", "--mode", "fwd_bwd", "--threads", "1", "--quiet", "--out",
                                out.string()},
                               out, dir / "log", std::chrono::milliseconds(1000));
  check_stops_within_a_second(pid, dir / "log");
  fs::remove_all(dir);
}

TEST_CASE("SIGTERM during an interleaved batch's rounds stops the run within a second, keeping the samples taken",
          "[signals][stop][interleave][spawns]") {
  const fs::path dir = fresh_dir("stop-rounds");
  const fs::path out = dir / "r.json";
  // Four cases of ~1 ms calls sampled in rounds (no noise target, no timeout, 100 samples of
  // 20 ms each: about 9 s in all, inside one batch's time bound), stopped 2 s into the rounds (the
  // progress on a pipe says when they begin).
  const pid_t pid = start_case({binary(), "--suite", "kernel", "--seq", "3000", "--dim", "48", "--batch", "1", "--heads", "4",
                                "--reps", "100", "--max-noise", "0", "--timeout", "0", "--min-sample-ms", "20",
                                "--interleave", "--threads", "1", "--out", out.string()},
                               out, dir / "log", std::chrono::milliseconds(0));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_text(dir / "log").find("prepared, sampling in rounds") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  check_stops_within_a_second(pid, dir / "log");
  const auto doc = read_json(out);
  CHECK(doc["interrupted"] == true);
  // No case had taken its last sample; each that had taken one is kept with its samples, partial.
  // (A sample shorter than its minimum starts a case's samples over, so on a busy machine a case
  // can be caught with none: tests/run/test_interleave.cpp's stop request counts them exactly.)
  const std::size_t kept = doc["results"].size();
  CHECK(kept >= 2);
  CHECK(kept <= 4);
  for (const auto& r : doc["results"]) {
    INFO(r.dump());
    CHECK(r["status"] == "ok");
    CHECK(r["stopped_on"] == "interrupted");
    CHECK(r["samples_ms"].size() >= 1);
    CHECK(r["samples_ms"].size() < 100);
  }
  CHECK(line_count(journal_of(out)) == 1 + kept);  // the header and the partial cases
  fs::remove_all(dir);
}

// What a run writes is checked before anything runs: --dump must be a folder it can write,
// --out, --gbench-out, the journal and the dump folder must be distinct, an existing target must
// be a regular file (a device or FIFO is never replaced), and a run refused with exit 2 leaves no
// folder behind. A dump is written whole or not at all.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// One quick case.
std::vector<std::string> quick_args(const fs::path& out) {
  return {binary(), "--suite", "kernel", "--seq", "16", "--dim", "4", "--batch", "1", "--heads", "1", "--impl", "scan",
          "--mode", "fwd", "--reps", "2", "--warmup", "0", "--min-sample-ms", "1", "--threads", "1", "--quiet",
          "--out", out.string()};
}

void expect_refused(const std::vector<std::string>& args, const fs::path& log, const std::string& expected) {
  const ProcessResult result = run_args(args, log);
  INFO(result.output);
  CHECK(result.exit_status == 2);
  const auto errors = error_lines(result.output);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Contains(expected));
}

}  // namespace

TEST_CASE("a --dump that is a file or cannot be made a folder is refused before any case runs", "[paths][dump][spawns]") {
  const fs::path dir = fresh_dir("dump-target");
  std::ofstream(dir / "a-file") << "x";
  expect_refused(with(quick_args(dir / "r.json"), {"--dump", (dir / "a-file").string()}), dir / "log", "--dump");
  // /proc takes no new folders, for root either.
  expect_refused(with(quick_args(dir / "r.json"), {"--dump", "/proc/lattn-dump"}), dir / "log", "--dump");
  CHECK_FALSE(fs::exists(dir / "r.json"));
  CHECK_FALSE(fs::exists(journal_of(dir / "r.json")));
  fs::remove_all(dir);
}

TEST_CASE("a dump that does not fit is not left half-written", "[paths][dump][disk][spawns]") {
  // RLIMIT_FSIZE with SIGXFSZ ignored stands in for a full disk (test_journal_safety.cpp): the
  // journal fits under 64 KiB, q.npy (4 heads x 3000 x 48 floats, 2.2 MiB) does not.
  const fs::path dir = fresh_dir("dump-full");
  const fs::path out = dir / "r.json";
  const std::vector<std::string> args = {binary(), "--suite", "kernel", "--seq", "3000", "--dim", "48", "--batch", "1",
                                         "--heads", "4", "--impl", "scan", "--mode", "fwd", "--reps", "2",
                                         "--min-sample-ms", "1", "--threads", "1", "--quiet", "--out", out.string(),
                                         "--dump", (dir / "dump").string()};
  const ProcessResult result = run_args(args, dir / "log", 64 * 1024);
  INFO(result.output);
  CHECK(result.exit_status == 4);
  for (const auto& entry : fs::recursive_directory_iterator(dir / "dump")) {
    if (!entry.is_regular_file()) continue;
    INFO(entry.path());
    CHECK(entry.path().extension() == ".npy");  // no temporary file left
    CHECK(entry.file_size() <= 64 * 1024);
    CHECK(entry.path().filename() != "q.npy");  // it cannot be there, whole or cut
  }
  fs::remove_all(dir);
}

TEST_CASE("the paths of --out, --gbench-out, the journal and --dump must be distinct", "[paths][collisions][spawns]") {
  const fs::path dir = fresh_dir("collide");
  const fs::path out = dir / "r.json";
  expect_refused(with(quick_args(out), {"--gbench-out", out.string()}), dir / "log", "--gbench-out");
  expect_refused(with(quick_args(out), {"--gbench-out", journal_of(out)}), dir / "log", "journal");
  expect_refused(with(quick_args(out), {"--gbench-out", (dir / "." / "r.json").string()}), dir / "log", "--gbench-out");
  expect_refused(with(quick_args(out), {"--dump", out.string()}), dir / "log", "--dump");
  expect_refused(with(quick_args(dir / "d.json"), {"--dump", (dir / "d.json").string()}), dir / "log", "--dump");
  CHECK_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

TEST_CASE("an existing --out or --gbench-out that is not a regular file is refused and left alone", "[paths][special][spawns]") {
  const fs::path dir = fresh_dir("special");
  const fs::path fifo = dir / "fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  expect_refused(quick_args(fifo), dir / "log", "not a regular file");
  CHECK(fs::is_fifo(fifo));
  expect_refused(with(quick_args(dir / "r.json"), {"--gbench-out", fifo.string()}), dir / "log", "not a regular file");
  CHECK(fs::is_fifo(fifo));
  CHECK_FALSE(fs::exists(dir / "r.json"));
  fs::remove_all(dir);
}

TEST_CASE("a run refused with exit 2 creates no folder for its --out", "[paths][folders][spawns]") {
  const fs::path dir = fresh_dir("nofolder");
  // The folder of --gbench-out cannot be made (/proc takes none); --out's could, but must not be.
  expect_refused(with(quick_args(dir / "new" / "r.json"), {"--gbench-out", "/proc/lattn-x/g.json"}), dir / "log",
                 "--gbench-out");
  CHECK_FALSE(fs::exists(dir / "new"));
  if (!cuda_usable()) {
    expect_refused(with(quick_args(dir / "new2" / "r.json"), {"--backend", "cuda"}), dir / "log", "no CUDA device");
    CHECK_FALSE(fs::exists(dir / "new2"));
  }
  fs::remove_all(dir);
}

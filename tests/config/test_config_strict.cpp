// Input that used to be accepted silently or mis-reported: a key given twice, a second YAML
// document, a YAML tag, an empty item in a comma list, nesting past the bound, a config that is a
// directory, a device or too large, more threads than the machine can run, and control characters
// echoed raw into the one-line error.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.hpp"
#include "src/config/config.hpp"
#include "process_util.hpp"

using namespace lattn;
using namespace lattn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::string& text, const std::string& name = "suite.yaml") {
  return config_error(text, name);
}

test::ProcessResult lattnbench(const std::string& args) {
  return run_process("timeout 60 " + binary() + " " + args + " --quiet --out " +
                     (fs::temp_directory_path() / "lattn-never" / "r.json").string());
}

std::size_t lines(const std::string& s) { return std::size_t(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("a key given twice is an error naming both lines, in YAML and JSON", "[config][strict]") {
  CHECK_THAT(error_of("reps: 5\nwarmup: 1\nreps: 7\n"), Contains("suite.yaml:3") && Contains("'reps'") && Contains("line 1"));
  CHECK_THAT(error_of("kernel:\n  seq: 16\n  seq: 32\n"), Contains("suite.yaml:3") && Contains("'kernel.seq'"));
  CHECK_THAT(error_of("{\"reps\": 5,\n \"reps\": 2}", "s.json"), Contains("s.json:2") && Contains("'reps'"));
  CHECK_THAT(error_of("{\"kernel\": {\"dim\": 4, \"dim\": 8}}", "s.json"), Contains("'kernel.dim'"));
}

TEST_CASE("a second YAML document and YAML tags are errors naming the line", "[config][strict]") {
  CHECK_THAT(error_of("reps: 5\n---\nreps: 6\n"), Contains("suite.yaml:2") && Contains("second YAML document"));
  CHECK_THAT(error_of("reps: 5\n...\n---\nwarmup: 1\n"), Contains("second YAML document"));
  CHECK_THAT(error_of("reps: !!str 5\n"), Contains("suite.yaml:1") && Contains("tag"));
  CHECK_THAT(error_of("reps: !!int 5\n"), Contains("tag"));
  CHECK_THAT(error_of("kernel: !custom\n  seq: 16\n"), Contains("tag"));
  CHECK_THAT(error_of("kernel:\n  seq: !!seq [16]\n"), Contains("suite.yaml:2") && Contains("tag"));
  CHECK(error_of("reps: \"5\"\n").find("tag") == std::string::npos);  // quoting is not a tag
}

TEST_CASE("nesting deeper than the bound says so with its line", "[config][strict]") {
  const std::string deep = "reps: " + std::string(100, '[') + std::string(100, ']') + "\n";
  CHECK_THAT(error_of(deep), Contains("suite.yaml:1") && Contains("nested deeper than 64"));
  CHECK_THAT(error_of("{\"reps\": " + std::string(3000, '[') + std::string(3000, ']') + "}", "d.json"),
             Contains("nested deeper than 64"));
  std::string block;
  for (int i = 0; i < 100; ++i) block += std::string(2 * std::size_t(i), ' ') + "k" + std::to_string(i) + ":\n";
  CHECK_THAT(error_of(block), Contains("nested deeper than 64"));
}

TEST_CASE("an empty item in a comma list is an error", "[config][strict]") {
  CHECK_THAT(override_error("seq", "16,"), Contains("--seq") && Contains("empty"));
  CHECK_THAT(override_error("seq", ",16"), Contains("--seq") && Contains("empty"));
  CHECK_THAT(override_error("impl", "scan,,chunked"), Contains("--impl") && Contains("empty"));
  CHECK(override_error("seq", "16,32").empty());
}

TEST_CASE("threads are bounded by what the machine can run", "[config][strict][threads][spawns]") {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const long most = std::min(4096L, 4L * cores);
  CHECK(override_error("threads", std::to_string(most)).empty());
  CHECK_THAT(override_error("threads", std::to_string(most + 1)),
             Contains("--threads") && Contains(std::to_string(cores) + " logical cores"));
  CHECK_THAT(error_of("threads: " + std::to_string(most + 1) + "\n"), Contains("suite.yaml:1: threads"));
  // The real binary answers at once instead of starting thousands of threads.
  const auto result = lattnbench("--threads 4096 --suite kernel --seq 16 --dim 4");
  CHECK(result.exit_status == (4096 > most ? 2 : 0));
  if (4096 > most) CHECK(lines(result.output) == 1);
}

TEST_CASE("a config that is a directory, a device or too large is refused in one line", "[config][strict][files][spawns]") {
  const fs::path dir = fresh_dir("config-files");
  struct Bad {
    std::string path, expected;
  } cases[] = {
      {dir.string(), "is a directory"},
      {"/dev/zero", "not a regular file"},
      {(dir / "big.yaml").string(), "1 MiB"},
  };
  {
    std::ofstream big(dir / "big.yaml");
    big << "reps: 5\n";
    for (int i = 0; i < 150000; ++i) big << "# padding\n";
  }
  for (const Bad& bad : cases) {
    INFO(bad.path);
    const auto result = lattnbench("--config " + bad.path);
    CHECK(result.exit_status == 2);
    CHECK_THAT(result.output, Contains("lattnbench: error: " + bad.path) && Contains(bad.expected));
    CHECK(lines(result.output) == 1);
  }
  fs::remove_all(dir);
}

TEST_CASE("control characters in what an error echoes are escaped: one line, never cut short", "[config][strict][escape][spawns]") {
  CHECK_THAT(override_error("impl", "fu\nsed"), Contains("'fu\\nsed'"));
  const std::string nul_key = error_of("{\"re\\u0000ps\": 5}", "n.json");
  CHECK_THAT(nul_key, Contains("re\\x00ps"));
  CHECK(nul_key.find('\0') == std::string::npos);
  CHECK_THAT(error_of("\"a\\tb\\rc\": 1\n"), Contains("a\\tb\\rc"));
  CHECK(std::string(UsageError("x\ny", "z\x1b[31m").what()) == "x\\ny: z\\x1b[31m");
  // The real binary: a value, a key and a path with a newline each give one line.
  const fs::path dir = fresh_dir("escape");
  std::ofstream(dir / "key.yaml") << "\"bad\\nkey\": 1\n";
  for (const std::string& args : {std::string("--impl $'fu\\nsed'"), "--config " + (dir / "key.yaml").string(),
                                  std::string("--config $'/nonexistent/a\\nb.yaml'")}) {
    INFO(args);
    const auto result = run_process("bash -c \"" + binary() + " " + args + " --quiet\"");
    CHECK(result.exit_status == 2);
    CHECK(lines(result.output) == 1);
  }
  fs::remove_all(dir);
}

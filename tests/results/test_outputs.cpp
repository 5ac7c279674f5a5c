// The real executable's outputs: --out - (the JSON on stdout), several --out files in one run,
// --format json without a default file, the Google Benchmark export's cpu_time, the columns of
// what varies, and --help, --list and --list-cases as a user reads them.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "process_util.hpp"
#include "src/config/install_paths.hpp"

using namespace lattn;
using namespace lattn::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
namespace fs = std::filesystem;

namespace {

const std::string kQuick =
    " --suite kernel --seq 16 --dim 4 --batch 1 --heads 1 --chunk 8 --impl scan --mode fwd --reps 3 --warmup 0"
    " --min-sample-ms 1 --threads 1";

// Runs lattnbench in `dir` with stderr to dir/err.txt: the result is stdout alone.
ProcessResult in_dir(const fs::path& dir, const std::string& args) {
  return run_process("(cd '" + dir.string() + "' && '" + binary() + "' " + args + " 2>err.txt)");
}

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("an --out of '-' or /dev/stdout puts the result JSON on stdout and writes no result file", "[outputs][stdout][spawns]") {
  for (const char* target : {"-", "/dev/stdout"}) {
    const fs::path dir = fresh_dir("out-stdout");
    const ProcessResult r = in_dir(dir, kQuick + " --out " + target);
    INFO(target << "\n" << r.output << read_text(dir / "err.txt"));
    REQUIRE(r.exit_status == 0);
    const nlohmann::json doc = nlohmann::json::parse(r.output);  // stdout is the JSON and nothing else
    REQUIRE(doc["results"].size() == 1);
    CHECK(doc["results"][0]["status"] == "ok");
    // The progress went to stderr; no results/ folder, no journal or lock left behind.
    CHECK_THAT(read_text(dir / "err.txt"), Contains("scan"));
    CHECK(entries(dir) == std::set<std::string>{"err.txt"});
  }
}

TEST_CASE("a --format json run without --out prints the JSON and writes no default result file", "[outputs][stdout][spawns]") {
  const fs::path dir = fresh_dir("format-json");
  const ProcessResult r = in_dir(dir, kQuick + " -q --format json");
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  CHECK(nlohmann::json::parse(r.output)["results"].size() == 1);
  CHECK(entries(dir) == std::set<std::string>{"err.txt"});
  // With the table on stdout the default file is written, as before.
  const ProcessResult table = in_dir(dir, kQuick + " -q");
  REQUIRE(table.exit_status == 0);
  CHECK_THAT(table.output, Contains("results: results/lattnbench-cpu-"));
  CHECK(fs::is_directory(dir / "results"));
}

TEST_CASE("several --out files in one run, each in its extension's format, and stdout beside them", "[outputs][several][spawns]") {
  const fs::path dir = fresh_dir("out-several");
  const ProcessResult r = in_dir(dir, kQuick + " -q --out r.json --out sub/r.csv --out r.md");
  INFO(r.output << read_text(dir / "err.txt"));
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.output, Contains("results: r.json, sub/r.csv, r.md"));
  const nlohmann::json doc = read_json(dir / "r.json");
  CHECK(doc["results"].size() == 1);
  const auto csv = lines_of(read_text(dir / "sub" / "r.csv"));
  REQUIRE(csv.size() == 2);
  CHECK(csv[0].rfind("suite,impl,mode,", 0) == 0);
  const auto md = lines_of(read_text(dir / "r.md"));
  REQUIRE(md.size() == 5);  // what every row shares, a blank line, the header, its rule and the row
  CHECK(md[0].rfind("held constant: ", 0) == 0);
  CHECK(md[2].rfind("| suite | impl |", 0) == 0);
  // The journal was beside the first file, and went with the finished run.
  CHECK_FALSE(fs::exists(dir / "r.json.journal.jsonl"));

  // The JSON on stdout and a CSV file together.
  const ProcessResult both = in_dir(dir, kQuick + " --out - --out both.csv");
  REQUIRE(both.exit_status == 0);
  CHECK(nlohmann::json::parse(both.output)["results"].size() == 1);
  CHECK(lines_of(read_text(dir / "both.csv")).size() == 2);
}

TEST_CASE("contradicting outputs are refused with one line and exit 2, nothing written", "[outputs][errors][spawns]") {
  const fs::path dir = fresh_dir("out-refused");
  struct Bad {
    std::string args, expected;
  };
  for (const Bad& bad : std::vector<Bad>{{"--out - --format csv", "--out: '-' puts the result JSON on stdout"},
                                         {"--out - --out /dev/stdout", "--out: stdout ('-' or /dev/stdout) is given twice"},
                                         {"--out a.json --out ./a.json", "'./a.json' is also the path of --out"},
                                         {"--out a.txt", "cannot tell the format of 'a.txt'"}}) {
    const ProcessResult r = in_dir(dir, kQuick + " " + bad.args);
    const std::string err = read_text(dir / "err.txt");
    INFO(bad.args << "\n" << r.output << err);
    CHECK(r.exit_status == 2);
    CHECK(r.output.empty());
    CHECK(error_lines(err).size() == 1);
    CHECK_THAT(err, Contains(bad.expected));
    CHECK(entries(dir) == std::set<std::string>{"err.txt"});
  }
}

TEST_CASE("the Google Benchmark export's cpu_time is the process CPU time the samples took", "[outputs][gbench][spawns]") {
  const fs::path dir = fresh_dir("gbench-cpu");
  const ProcessResult r = in_dir(dir, kQuick + " -q --out r.json --gbench-out g.json");
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  const nlohmann::json record = read_json(dir / "r.json")["results"][0];
  REQUIRE(record["samples_cpu_ms"].size() == record["samples_ms"].size());
  const nlohmann::json gbench = read_json(dir / "g.json");
  int differ = 0, iterations = 0;
  for (const auto& b : gbench["benchmarks"]) {
    REQUIRE(b.contains("cpu_time"));
    CHECK(b["cpu_time"].get<double>() >= 0.0);
    if (b["run_type"] != "iteration") continue;
    const std::size_t i = b["repetition_index"].get<std::size_t>();
    CHECK(b["cpu_time"].get<double>() == Approx(record["samples_cpu_ms"][i].get<double>() * 1e6));
    CHECK(b["real_time"].get<double>() == Approx(record["samples_ms"][i].get<double>() * 1e6));
    ++iterations;
    differ += b["cpu_time"] != b["real_time"];
  }
  CHECK(iterations == 3);
  CHECK(differ > 0);  // two clocks: equal in every sample only if one were a copy of the other
}

TEST_CASE("the table, CSV and markdown of a run show what varies in it, and the noise and samples", "[outputs][columns][spawns]") {
  const fs::path dir = fresh_dir("varying-columns");
  const ProcessResult r =
      in_dir(dir, kQuick + " -q --rule additive,delta --decay scalar --gate-norm 1,16 --out r.csv --out r.md");
  INFO(r.output << read_text(dir / "err.txt"));
  REQUIRE(r.exit_status == 0);
  const auto table = lines_of(r.output);
  REQUIRE(table.size() > 5);
  // What every row shares once, then the header.
  CHECK_THAT(table[0], StartsWith("held constant: backend cpu, dtype float32") && Contains("normalize_keys true"));
  CHECK_THAT(table[1], Contains(" rule ") && Contains(" gate_norm ") && Contains(" noise% ") && Contains(" samples "));
  const std::size_t figures = table[1].find("median_ms") - 1;
  std::set<std::string> identities;
  for (std::size_t i = 2; i <= 5; ++i) identities.insert(table[i].substr(0, figures));
  CHECK(identities.size() == 4);  // four cases, four different-looking rows
  const auto csv = lines_of(read_text(dir / "r.csv"));
  CHECK_THAT(csv[0], Contains(",rule,gate_norm,normalize_keys,") && Contains(",reps,noise_pct,stopped_on,"));
  CHECK(csv.size() == 5);
  const auto md = lines_of(read_text(dir / "r.md"));
  CHECK_THAT(md[0], StartsWith("held constant: "));
  CHECK_THAT(md[2], Contains("| decay | rule | gate_norm |") && Contains("| noise_pct | reps |"));
}

TEST_CASE("the help types every value and lists the installed configs, and --list and --list-cases line up", "[outputs][help][spawns]") {
  const ProcessResult help = run_process(binary() + " --help");
  REQUIRE(help.exit_status == 0);
  CHECK_THAT(help.output, !Contains(" TEXT") && !Contains("{false}") && !Contains("Excludes"));
  CHECK_THAT(help.output, Contains("--seq INT,...") && Contains("--decay NAME,...") && Contains("--gate-norm NUMBER,...") &&
                              Contains("--normalize-keys BOOL,...") && Contains("--max-noise PCT") &&
                              Contains("--shard K/N") && Contains("--interleave ") && Contains("--no-interleave "));
  std::string out_line, config_line;
  for (const std::string& line : lines_of(help.output)) {
    if (line.find("-o,--out") != std::string::npos) out_line = line;
    if (line.find("-c,--config") != std::string::npos) config_line = line;
  }
  CHECK_THAT(out_line, Contains(".csv") && Contains(".md") && Contains("'-'"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(source_dir()) / "configs"))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  REQUIRE(names.size() >= 4);
  for (const std::string& name : names) CHECK_THAT(config_line, Contains(name));

  const ProcessResult list = run_process(binary() + " --list");
  REQUIRE(list.exit_status == 0);
  CHECK_THAT(list.output, Contains("\nrules:    additive, delta, trapezoidal, dplr\n") && Contains("\nconfigs:  "));

  const ProcessResult cases = run_process(binary() + " --suite kernel --seq 16 --dim 4 --batch 1 --heads 1 --chunk 8 "
                                                    "--mode fwd --impl scan,chunked --decay none,scalar --list-cases");
  REQUIRE(cases.exit_status == 0);
  std::set<std::size_t> seconds_column;
  int rows = 0;
  for (const std::string& line : lines_of(cases.output))
    if (line.rfind("00", 0) == 0) {  // a case's line: its plan index first
      seconds_column.insert(line.find(" s  "));
      ++rows;
    }
  CHECK(rows == 4);
  CHECK(seconds_column.size() == 1);  // names of different lengths, the figures in one column
}

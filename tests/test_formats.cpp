// Renderings of a real result document: the Google Benchmark export, CSV, markdown, the summary.
#include <catch2/catch.hpp>

#include <set>

#include "formats.hpp"
#include "summary.hpp"

using namespace lattn;

namespace {
nlohmann::json record(const char* impl, int seq, double median, double temp_mb) {
  return {{"suite", "kernel"}, {"impl", impl}, {"mode", "fwd"}, {"backend", "cpu"}, {"dtype", "float32"},
          {"decay", "none"}, {"batch", 2}, {"heads", 4}, {"seq", seq}, {"dim", 64}, {"chunk", 128},
          {"status", "ok"}, {"median_ms", median}, {"q1_ms", median * 0.9}, {"q3_ms", median * 1.1},
          {"inner", 3}, {"samples_ms", {median, median}}, {"gflops", 1.0}, {"temp_mb", temp_mb}, {"rel_err", 1e-7}};
}

nlohmann::json sample_document() {
  nlohmann::json results = {record("scan", 512, 1.0, 0.0), record("chunked", 512, 2.0, 0.5),
                            record("scan", 2048, 4.0, 0.0), record("chunked", 2048, 3.0, 0.5),
                            {{"suite", "kernel"}, {"impl", "scan"}, {"mode", "fwd"}, {"status", "skipped"}, {"skip_reason", "x"}}};
  return {{"schema_version", "1.0.0"}, {"created_utc", "2026-12-02T00:00:00Z"}, {"argv", {"lattnbench"}},
          {"device", {{"backend", "cpu"}, {"hostname", "h"}, {"threads", 2}, {"build_type", "Release"}}},
          {"results", results}, {"summary", build_summary(results)}};
}
}  // namespace

TEST_CASE("the Google Benchmark export parses and carries one entry per measured case", "[formats]") {
  const nlohmann::json doc = sample_document();
  const nlohmann::json gbench = nlohmann::json::parse(to_gbench(doc).dump());
  REQUIRE(gbench["benchmarks"].size() == 4);
  CHECK(gbench["context"]["library_build_type"] == "release");
  std::set<std::string> names;
  for (const auto& b : gbench["benchmarks"]) {
    names.insert(b["name"].get<std::string>());
    CHECK(b["time_unit"] == "ms");
    CHECK(b["run_type"] == "iteration");
    CHECK(b.contains("real_time"));
    CHECK(b.contains("iterations"));
  }
  CHECK(names.size() == 4);
  CHECK(gbench["benchmarks"][0]["real_time"] == 1.0);
  CHECK(gbench["benchmarks"][0]["name"] == "kernel/scan/fwd/batch:2/heads:4/seq:512/dim:64/chunk:128/decay:none/float32");
}

TEST_CASE("CSV and markdown have a header and a row per record", "[formats]") {
  const nlohmann::json doc = sample_document();
  const std::string csv = to_csv(doc["results"]);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);
  CHECK(csv.rfind("suite,impl,mode", 0) == 0);
  const std::string md = to_markdown(doc["results"]);
  CHECK(std::count(md.begin(), md.end(), '\n') == 7);
  CHECK(format_for_path("a/b.csv", "--out") == OutputFormat::csv);
  CHECK(format_for_path("b.json", "--out") == OutputFormat::json);
  CHECK_THROWS(format_for_path("b.txt", "--out"));
  CHECK_THROWS(parse_output_format("xml", "--format"));
}

TEST_CASE("the summary names the fastest impl, its factor and memory, and the crossover in seq", "[formats][summary]") {
  const nlohmann::json summary = sample_document()["summary"];
  REQUIRE(summary["comparisons"].size() == 2);
  CHECK(summary["comparisons"][0]["fastest"] == "scan");
  CHECK(summary["comparisons"][0]["speedup"].get<double>() == Approx(2.0));
  CHECK(summary["comparisons"][0]["other_temp_mb"] == 0.5);
  CHECK(summary["comparisons"][1]["fastest"] == "chunked");
  REQUIRE(summary["crossovers"].size() == 1);
  const auto& change = summary["crossovers"][0]["changes"][0];
  CHECK(change["from"] == "scan");
  CHECK(change["to"] == "chunked");
  CHECK(change["after_seq"] == 512);
  CHECK(change["by_seq"] == 2048);
  const std::string text = format_summary(summary);
  CHECK(text.find("scan wins up to seq 512, chunked from seq 2048") != std::string::npos);
}

// Renderings of a run's records: the Google Benchmark export, CSV, markdown, the summary, and the
// record's JSON read back as --resume reads it.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>

#include "src/formats.hpp"
#include "src/record_json.hpp"
#include "src/summary.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {
CaseRecord record(const char* impl, int seq, double median, double temp_mb, std::size_t index = 0) {
  CaseRecord r;
  r.kase = test::kernel_case({2, 4, seq, 64, 128, Decay::none}, impl, Mode::fwd);
  r.kase.plan_index = index;
  r.status = Status::ok;
  Measurement m;
  m.median_ms = median;
  m.mean_ms = median;
  m.q1_ms = median * 0.9;
  m.q3_ms = median * 1.1;
  m.inner = 3;
  m.reps = 2;
  m.samples_ms = {median, median};
  m.gflops = 1.0;
  m.temp_mb = temp_mb;
  m.rel_err = 1e-7;
  r.measured = m;
  return r;
}

RunDocument sample_document() {
  RunDocument doc;
  doc.version = "0.1.0";
  doc.created_utc = "2026-12-02T00:00:00Z";
  doc.argv = {"lattnbench"};
  doc.device.backend = "cpu";
  doc.device.host.hostname = "h";
  doc.device.host.threads = 2;
  doc.device.host.build_type = "Release";
  doc.results = {record("scan", 512, 1.0, 0.0, 0), record("chunked", 512, 2.0, 0.5, 1), record("scan", 2048, 4.0, 0.0, 2),
                 record("chunked", 2048, 3.0, 0.5, 3)};
  CaseRecord skipped;
  skipped.kase = test::kernel_case({2, 4, 512, 64, 128, Decay::none}, "scan", Mode::fwd, "cpu", "bf16");
  skipped.status = Status::skipped;
  skipped.skip_reason = "x";
  doc.results.push_back(skipped);
  return doc;
}
}  // namespace

TEST_CASE("the Google Benchmark export has every sample as a repetition and the aggregates", "[formats]") {
  RunDocument doc = sample_document();
  doc.device.host.cpu_mhz = 2450.4;
  doc.device.host.load_avg = {1.5, 1.0, 0.5};
  doc.device.host.cache_kib = {{"L1d", 32}, {"L2", 1024}};
  doc.results[1].status = Status::failed;
  doc.results[1].measured->check_failure = "o rel_err 1e-2 over tolerance 1e-4";
  const nlohmann::json gbench = nlohmann::json::parse(to_gbench(doc).dump());
  // 4 measured cases x (2 samples + mean, median, stddev); the skipped one is left out.
  REQUIRE(gbench["benchmarks"].size() == 4 * 5);
  const auto& context = gbench["context"];
  CHECK(context["library_build_type"] == "release");
  CHECK(context["mhz_per_cpu"] == 2450);
  CHECK(context["load_avg"] == nlohmann::json::array({1.5, 1.0, 0.5}));
  REQUIRE(context["caches"].size() == 2);
  CHECK(context["caches"][0]["type"] == "Data");
  CHECK(context["caches"][0]["level"] == 1);
  CHECK(context["caches"][0]["size"] == 32 * 1024);
  std::set<std::string> names;
  for (const auto& b : gbench["benchmarks"]) {
    names.insert(b["name"].get<std::string>());
    CHECK(b["time_unit"] == "ns");
    CHECK(b.contains("real_time"));
    CHECK(b["iterations"] == 3);
    CHECK(b["repetitions"] == 2);
  }
  CHECK(names.size() == 4 * 4);  // each case's name and its three aggregates'
  const auto& first = gbench["benchmarks"][0];
  CHECK(first["name"] == "kernel/scan/fwd/batch:2/heads:4/seq:512/dim:64/chunk:128/decay:none/float32");
  CHECK(first["run_type"] == "iteration");
  CHECK(first["repetition_index"] == 0);
  CHECK(first["real_time"].get<double>() == Approx(1.0e6));  // 1 ms
  CHECK(gbench["benchmarks"][2]["run_type"] == "aggregate");
  CHECK(gbench["benchmarks"][2]["aggregate_name"] == "mean");
  CHECK(gbench["benchmarks"][4]["aggregate_name"] == "stddev");
  CHECK(gbench["benchmarks"][4]["real_time"] == 0.0);  // two equal samples
  // The failed check is an error with its message, on every entry of that case.
  CHECK_FALSE(first.contains("error_occurred"));
  CHECK(gbench["benchmarks"][5]["error_occurred"] == true);
  CHECK(gbench["benchmarks"][5]["error_message"] == "o rel_err 1e-2 over tolerance 1e-4");
}

TEST_CASE("CSV and markdown have a header and a row per record", "[formats]") {
  const RunDocument doc = sample_document();
  const std::string csv = to_csv(doc.results);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);
  CHECK(csv.rfind("suite,impl,mode", 0) == 0);
  CHECK(csv.find("kernel,scan,fwd,cpu,float32,none,2,4,512,64,128,,,ok,1,0.9,1.1,3,1,") != std::string::npos);
  const std::string md = to_markdown(doc.results);
  CHECK(std::count(md.begin(), md.end(), '\n') == 7);
  CHECK(format_for_path("a/b.csv", "--out") == OutputFormat::csv);
  CHECK(format_for_path("b.json", "--out") == OutputFormat::json);
  CHECK_THROWS(format_for_path("b.txt", "--out"));
  CHECK_THROWS(parse_output_format("xml", "--format"));
}

TEST_CASE("the summary names the fastest impl, its factor and memory, and the crossover in seq", "[formats][summary]") {
  const RunDocument doc = sample_document();
  const nlohmann::json summary = to_json(build_summary(doc.results));
  REQUIRE(summary["comparisons"].size() == 2);
  CHECK(summary["comparisons"][0]["fastest"] == "scan");
  CHECK(summary["comparisons"][0]["speedup"].get<double>() == Approx(2.0));
  CHECK(summary["comparisons"][0]["other_temp_mb"] == 0.5);
  CHECK(summary["comparisons"][0]["seq"] == 512);
  CHECK_FALSE(summary["comparisons"][0].contains("impl"));
  CHECK(summary["comparisons"][1]["fastest"] == "chunked");
  REQUIRE(summary["crossovers"].size() == 1);
  CHECK_FALSE(summary["crossovers"][0].contains("seq"));
  const auto& change = summary["crossovers"][0]["changes"][0];
  CHECK(change["from"] == "scan");
  CHECK(change["to"] == "chunked");
  CHECK(change["after_seq"] == 512);
  CHECK(change["by_seq"] == 2048);
  const std::string text = format_summary(build_summary(doc.results));
  CHECK(text.find("scan wins up to seq 512, chunked from seq 2048") != std::string::npos);
}

TEST_CASE("a record's JSON reads back as the same record, and one of another case is refused", "[formats][journal]") {
  CaseRecord r = record("chunked", 512, 2.0, 0.5, 7);
  r.measured->rel_err = std::numeric_limits<double>::infinity();  // JSON writes null
  r.measured->rel_errs = {{"o", std::numeric_limits<double>::infinity()}, {"hT", 1e-7}};
  r.measured->check_failure = "non-finite output at o[3]";
  r.measured->peak_fraction = 0.5;
  r.status = Status::failed;
  const nlohmann::json j = to_json(r);
  CHECK(j["rel_err"].is_null());
  const CaseRecord back = record_from_json(j, r.kase, "journal:2");
  CHECK(to_json(back) == j);
  CHECK(std::isinf(back.measured->rel_err));

  Case other = r.kase;
  other.impl = "scan";
  CHECK_THROWS_WITH(record_from_json(j, other, "journal:2"), Catch::Matchers::Contains("journal:2") &&
                                                                 Catch::Matchers::Contains("'impl' does not match"));
  nlohmann::json no_status = j;
  no_status.erase("status");
  CHECK_THROWS_WITH(record_from_json(no_status, r.kase, "journal:3"), Catch::Matchers::Contains("no 'status'"));
  nlohmann::json few_samples = j;
  few_samples["samples_ms"] = {1.0};
  CHECK_THROWS_WITH(record_from_json(few_samples, r.kase, "journal:4"), Catch::Matchers::Contains("1 samples"));
}

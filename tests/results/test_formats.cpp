// Renderings of a run's records: the Google Benchmark export, CSV, markdown, the summary, and the
// record's JSON read back as --resume reads it.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>

#include "cases.hpp"
#include "src/results/formats.hpp"
#include "src/results/record_json.hpp"
#include "src/results/report.hpp"
#include "src/results/summary.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;

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
  m.samples_cpu_ms = {median * 1.9, median * 2.1};  // two threads working through each call
  m.noise_pct = 3.5;
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
  // cpu_time is each sample's own process CPU time, not a copy of real_time.
  CHECK(first["cpu_time"].get<double>() == Approx(1.9e6));
  CHECK(gbench["benchmarks"][1]["cpu_time"].get<double>() == Approx(2.1e6));
  CHECK(gbench["benchmarks"][2]["run_type"] == "aggregate");
  CHECK(gbench["benchmarks"][2]["aggregate_name"] == "mean");
  CHECK(gbench["benchmarks"][2]["cpu_time"].get<double>() == Approx(2.0e6));
  CHECK(gbench["benchmarks"][3]["cpu_time"].get<double>() == Approx(2.0e6));  // median
  CHECK(gbench["benchmarks"][4]["aggregate_name"] == "stddev");
  CHECK(gbench["benchmarks"][4]["real_time"] == 0.0);  // two equal samples
  CHECK(gbench["benchmarks"][4]["cpu_time"].get<double>() == Approx(std::sqrt(2.0) * 0.1e6));
  // The failed check is an error with its message, on every entry of that case.
  CHECK_FALSE(first.contains("error_occurred"));
  CHECK(gbench["benchmarks"][5]["error_occurred"] == true);
  CHECK(gbench["benchmarks"][5]["error_message"] == "o rel_err 1e-2 over tolerance 1e-4");
}

TEST_CASE("a record without process CPU times has no cpu_time in the export, rather than a copy", "[formats]") {
  RunDocument doc = sample_document();
  for (CaseRecord& r : doc.results)
    if (r.measured) r.measured->samples_cpu_ms.clear();  // a record from a journal written before they were taken
  const nlohmann::json gbench = to_gbench(doc);
  REQUIRE(gbench["benchmarks"].size() == 4 * 5);
  for (const auto& b : gbench["benchmarks"]) {
    CHECK(b.contains("real_time"));
    CHECK_FALSE(b.contains("cpu_time"));
  }
}

TEST_CASE("CSV and markdown have a header and a row per record", "[formats]") {
  const RunDocument doc = sample_document();
  const std::string csv = to_csv(doc.results);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);
  CHECK(csv.rfind("suite,impl,mode,backend,dtype,decay,batch,heads,seq,dim,chunk,window,head_dim,rule,status,median_ms,"
                  "q1_ms,q3_ms,inner,reps,noise_pct,stopped_on,", 0) == 0);
  CHECK(csv.find("kernel,scan,fwd,cpu,float32,none,2,4,512,64,128,,,additive,ok,1,0.9,1.1,3,2,3.5,samples,1,")
        != std::string::npos);
  const std::string md = to_markdown(doc.results);
  // What every row shares, a blank line, then the header, its rule and a row per record.
  CHECK(md.rfind("held constant: backend cpu\n\n|", 0) == 0);
  CHECK(std::count(md.begin(), md.end(), '\n') == 9);
  CHECK(md.find("| noise_pct | reps |") != std::string::npos);
  CHECK(md.find("| 3.5 | 2 |") != std::string::npos);
  // The dtype varies in this document (one bf16 case): a column, so that no two rows look alike.
  CHECK(md.find("| dtype |") != std::string::npos);
  CHECK(md.find("| rule |") != std::string::npos);  // additive throughout, but the rule names the family
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
  CHECK(text.find("scan is 2.00x faster than chunked") != std::string::npos);
}

TEST_CASE("every option that varies in a run is a column of the table, CSV and markdown", "[formats][columns]") {
  // --rule additive,delta --decay scalar --gate-norm 1,16: four cases alike but for rule and gate_norm.
  std::vector<CaseRecord> records;
  for (const Rule rule : {Rule::additive, Rule::delta})
    for (const char* gate_norm : {"1", "16"}) {
      CaseRecord r = record("scan", 512, 1.0, 0.0, records.size());
      r.kase = test::gated_case({2, 4, 512, 64, 128, Decay::scalar, rule}, gate_norm, "scan", Mode::fwd);
      records.push_back(r);
    }
  CHECK(varying_keys(records) == std::vector<std::string>{"rule", "gate_norm"});  // normalize_keys: true throughout
  const std::string table = format_table(records);
  // What did not vary is said once above the rows; the header after it.
  CHECK(table.rfind("held constant: backend cpu, dtype float32, normalize_keys true\n", 0) == 0);
  const std::size_t header_start = table.find('\n') + 1;
  const std::string header = table.substr(header_start, table.find('\n', header_start) - header_start);
  CHECK_THAT(header, Catch::Matchers::Contains(" rule ") && Catch::Matchers::Contains(" gate_norm ") &&
                         Catch::Matchers::Contains(" noise% ") && Catch::Matchers::Contains(" samples "));
  CHECK_THAT(header, !Catch::Matchers::Contains("normalize_keys"));
  // Each row's identity, everything before the figures, is its own.
  const std::size_t figures = header.find("median_ms") - 1;
  std::set<std::string> identities;
  std::size_t start = table.find('\n', header_start) + 1;
  while (start < table.size()) {
    const std::size_t end = table.find('\n', start);
    const std::string row = table.substr(start, end - start);
    identities.insert(row.substr(0, figures));
    CHECK_THAT(row, Catch::Matchers::Contains("    3.5       2 "));  // noise% and samples
    start = end + 1;
  }
  CHECK(identities.size() == 4);
  const std::string md = to_markdown(records);
  CHECK(md.find("| decay | rule | gate_norm |") != std::string::npos);
  CHECK(md.find("| scalar | delta | 1 |") != std::string::npos);
  const std::string csv = to_csv(records);
  CHECK(csv.find(",head_dim,rule,gate_norm,normalize_keys,status,") != std::string::npos);
  CHECK(csv.find(",,,delta,1,true,ok,") != std::string::npos);
  CHECK(csv.find(",,,additive,16,,ok,") != std::string::npos);
}

TEST_CASE("the summary says tie where the quartiles overlap, and names the layer's head dim", "[formats][summary]") {
  // Medians 1.00 and 1.05 ms with quartiles 0.9-1.1 and 0.945-1.155: compare.py's IQR interval
  // of the factor reaches below 1, so neither is faster.
  std::vector<CaseRecord> records = {record("scan", 512, 1.0, 0.0, 0), record("chunked", 512, 1.05, 0.5, 1)};
  std::string text = format_summary(build_summary(records));
  CHECK_THAT(text, Catch::Matchers::Contains("scan and chunked tie (quartiles overlap; medians 1 vs 1.05 ms)"));
  CHECK_THAT(text, !Catch::Matchers::Contains("faster"));
  records[1].measured->q1_ms = 1.11;  // now above the fastest's q3
  text = format_summary(build_summary(records));
  CHECK_THAT(text, Catch::Matchers::Contains("scan is 1.05x faster than chunked"));

  std::vector<CaseRecord> layer;
  for (const bool chunked : {false, true}) {
    CaseRecord r = record(chunked ? "chunked" : "scan", 512, chunked ? 2.0 : 1.0, 0.0, layer.size());
    r.kase = test::layer_case({{2, 8, 512, 64, 128}, 128, chunked}, Mode::fwd);
    layer.push_back(r);
  }
  text = format_summary(build_summary(layer));
  CHECK_THAT(text, Catch::Matchers::Contains("layer fwd batch=2 heads=8 seq=512 head_dim=64 "));
  CHECK_THAT(text, !Catch::Matchers::Contains(" dim=64"));
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
  CHECK(back.measured->samples_cpu_ms == r.measured->samples_cpu_ms);
  nlohmann::json few_cpu = j;
  few_cpu["samples_cpu_ms"] = {1.0};
  CHECK_THROWS_WITH(record_from_json(few_cpu, r.kase, "journal:5"), Catch::Matchers::Contains("1 samples_cpu_ms for 2"));
  nlohmann::json older = j;  // a journal from before the CPU times: read, without them
  older.erase("samples_cpu_ms");
  CHECK(record_from_json(older, r.kase, "journal:6").measured->samples_cpu_ms.empty());
}

TEST_CASE("a record that did not pass is out of the summary's comparisons, and listed with its status",
          "[formats][summary]") {
  // A wrong impl, fastest of all: scan, chunked and it at seq 512; it alone beside scan at 2048.
  std::vector<CaseRecord> records = {record("scan", 512, 2.0, 0.0, 0), record("chunked", 512, 3.0, 0.5, 1),
                                     record("mine:wrong", 512, 0.01, 0.0, 2), record("scan", 2048, 4.0, 0.0, 3),
                                     record("mine:wrong", 2048, 0.04, 0.0, 4)};
  for (CaseRecord* wrong : {&records[2], &records[4]}) {
    wrong->status = Status::failed;
    wrong->measured->check_failure = "o rel_err 1.0e-02 over tolerance 1.0e-04";
  }
  CaseRecord no_samples = record("chunked", 2048, 1.0, 0.0, 5);  // a record without a sample
  no_samples.measured->samples_ms.clear();
  records.push_back(no_samples);
  const Summary summary = build_summary(records);
  REQUIRE(summary.comparisons.size() == 1);  // seq 512: scan against chunked; seq 2048 has scan alone
  CHECK(summary.comparisons[0].fastest->kase.impl == "scan");
  CHECK(summary.comparisons[0].other->kase.impl == "chunked");
  CHECK(summary.comparisons[0].ranking.empty());  // two contenders, not three
  REQUIRE(summary.not_compared.size() == 3);
  const nlohmann::json j = to_json(summary);
  CHECK(j["not_compared"][0]["impl"] == "mine:wrong");
  CHECK(j["not_compared"][0]["status"] == "failed");
  CHECK(j["not_compared"][0]["seq"] == 512);
  CHECK(j["not_compared"][0]["reason"] == "o rel_err 1.0e-02 over tolerance 1.0e-04");
  CHECK(j["not_compared"][2]["reason"] == "no samples");
  const std::string text = format_summary(summary);
  const std::string ranked = text.substr(0, text.find("Not compared"));
  CHECK_THAT(ranked, Contains("scan is 1.50x faster than chunked") && !Contains("mine:wrong"));
  CHECK_THAT(text.substr(ranked.size()),
             Contains("Not compared (did not pass):\n") &&
                 Contains("seq=512 dim=64 chunk=128: mine:wrong failed: o rel_err 1.0e-02 over tolerance 1.0e-04\n") &&
                 Contains("seq=2048 dim=64 chunk=128: chunked ok: no samples\n"));
}

TEST_CASE("the tables show an unknown figure as -, the fraction of peak as %peak, and what every row shares once",
          "[formats][columns]") {
  // The delta rule with a vector decay (Kimi Linear's family): the rule a column beside the decay.
  std::vector<CaseRecord> records;
  for (const char* impl : {"scan", "py:scan"}) {
    CaseRecord r = record(impl, 512, 1.0, 0.25, records.size());
    r.kase = test::gated_case({2, 4, 512, 64, 128, Decay::vector, Rule::delta}, "16", impl, Mode::fwd);
    records.push_back(r);
  }
  records[0].measured->peak_fraction = 0.375;
  records[0].measured->temp_source = "counting_allocator";
  records[1].measured->temp_unknown = "a Python impl's memory comes from its own allocator";
  const std::string table = format_table(records);
  INFO(table);
  const auto line = [&](std::size_t i) {
    std::size_t start = 0;
    for (; i > 0; --i) start = table.find('\n', start) + 1;
    return table.substr(start, table.find('\n', start) - start);
  };
  CHECK(line(0).rfind("held constant: backend cpu, dtype float32, ", 0) == 0);
  CHECK_THAT(line(0), !Contains("rule") && !Contains("decay"));
  const std::string header = line(1);
  CHECK_THAT(header, Contains(" decay  rule ") && Contains(" GFLOP/s  %peak  temp_MiB "));
  // The figures' columns, right-aligned under the header: %peak 37.5 and temp 0.250; unknown: "-".
  const auto cell = [&](const std::string& row, const std::string& name) {
    const std::size_t end = header.find(name) + name.size();
    const std::size_t start = row.find_last_of(' ', end - 1) + 1;
    return row.substr(start, end - start);
  };
  CHECK(cell(line(2), "%peak") == "37.5");
  CHECK(cell(line(2), "temp_MiB") == "0.250");
  CHECK(cell(line(3), "%peak") == "-");
  CHECK(cell(line(3), "temp_MiB") == "-");
  CHECK_THAT(line(2), Contains(" vector delta "));
  // Markdown: the same columns, "-" where unknown; the CSV's cell empty, its source beside it.
  const std::string md = to_markdown(records);
  CHECK_THAT(md, Contains("| decay | rule |") && Contains("| %peak | blas_fraction | temp_mb | temp_mb_source |"));
  CHECK_THAT(md, Contains("| 37.5 | - | 0.25 | counting_allocator |") && Contains("| - | - | - | - |"));
  const std::string csv = to_csv(records);
  CHECK_THAT(csv,
             Contains(",temp_mb,temp_mb_source,") && Contains(",0,0.25,counting_allocator,0,") && Contains(",0,,,0,"));
  // And the summary's text.
  const std::string text = format_summary(build_summary(records));
  CHECK_THAT(text, Contains("temp 0.25 vs - MiB"));
}

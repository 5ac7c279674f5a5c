// The result file a real smoke run writes: it parses, carries every key of docs/spec.md section 4 and the
// device block, and is written whole (no temporary file left beside it).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "src/results/record_json.hpp"
#include "src/results/report.hpp"
#include "src/config/plan.hpp"
#include "src/run/runner.hpp"
#include "test_util.hpp"

using namespace lattn;
namespace fs = std::filesystem;

TEST_CASE("a smoke run writes a complete result file", "[report]") {
  const fs::path dir = test::fresh_dir("report");
  RunRequest request;
  request.config = load_config_file(test::source_dir() + "/configs/smoke.yaml");
  request.argv = {"lattnbench", "--config", "configs/smoke.yaml"};
  request.out_path = (dir / "out.json").string();
  request.dump_dir = (dir / "dump").string();
  request.quiet = true;
  REQUIRE(run_benchmarks(request) == 0);

  std::ifstream in(request.out_path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  CHECK(doc["schema_version"] == kSchemaVersion);
  CHECK(doc["argv"].size() == 3);
  CHECK(doc["config"]["kernel"]["chunk"] == nlohmann::json::array({32}));
  for (const char* key : {"backend", "cpu_model", "threads", "blas", "blas_version", "compiler", "build_type",
                          "lattnbench_version", "git_revision", "git_dirty", "hostname"})
    CHECK(doc["device"].contains(key));
#if defined(__x86_64__) && defined(__linux__)
  // "AuthenticAMD family 25 model 17 stepping 1": what tells CPUs of one model name apart.
  CHECK_THAT(doc["device"]["cpu_signature"].get<std::string>(), Catch::Matches(R"(\S+ family \d+ model \d+( stepping \d+)?)"));
#endif
  if (doc["device"].contains("cache_kib"))
    for (const auto& [level, kib] : doc["device"]["cache_kib"].items()) {
      INFO(level);
      CHECK(kib.get<long>() > 0);
    }
  const auto& results = doc["results"];
  REQUIRE(results.size() == expand_plan(request.config).size());
  for (const auto& r : results) {
    INFO(r.dump());
    for (const char* key : {"suite", "impl", "mode", "chunk", "batch", "heads", "seq", "dim", "dtype", "compile_s", "inner",
                            "median_ms", "q1_ms", "q3_ms", "rel_err", "temp_mb", "arg_mb", "out_mb", "samples_ms",
                            "flops", "gflops", "status"})
      CHECK(r.contains(key));
    CHECK(r["status"] == "ok");
    CHECK(r["samples_ms"].size() == 3);
    CHECK(r["q1_ms"].get<double>() <= r["median_ms"].get<double>());
    CHECK(r["median_ms"].get<double>() <= r["q3_ms"].get<double>());
    if (r["suite"] == "layer") {
      CHECK(r["rel_errs"].size() == (r["mode"] == "fwd" ? 1u : 8u));
      CHECK(r["dim"] == r["head_dim"]);
      CHECK(r["model_dim"] == r["heads"].get<int>() * r["head_dim"].get<int>());
      CHECK(r.contains("window"));
    } else {
      CHECK(r["rel_errs"].size() == (r["mode"] == "fwd" ? 2u : 6u));
      CHECK_FALSE(r.contains("window"));
    }
  }
  CHECK(std::count_if(results.begin(), results.end(), [](const auto& r) { return r["suite"] == "layer"; }) == 16);
  CHECK(doc["totals"]["ok"] == results.size());

  std::size_t leftovers = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) ++leftovers;
  CHECK(leftovers == 0);
  // --dump: the first case's inputs and outputs as .npy files
  CHECK(fs::exists(dir / "dump" / "000-kernel-scan-fwd-b1h2t24d16c32-none" / "q.npy"));
  CHECK(fs::exists(dir / "dump" / "000-kernel-scan-fwd-b1h2t24d16c32-none" / "o.npy"));
  // and a layer case's
  const fs::path layer_dump = dir / "dump" / "017-layer-scan-fwd_bwd-b1h2t24d8c32w5-retnet";
  for (const char* name : {"x", "wq", "wk", "wv", "wo", "g", "beta", "dOut", "out", "dx", "dwq", "dwk", "dwv", "dwo", "dg", "dbeta"})
    CHECK(fs::exists(layer_dump / (std::string(name) + ".npy")));
  fs::remove_all(dir);
}

TEST_CASE("atomic writes replace a file whole", "[report]") {
  const fs::path dir = test::fresh_dir("atomic");
  const std::string path = (dir / "sub" / "r.json").string();
  write_file_atomically(path, "first");
  write_file_atomically(path, "second, longer");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "second, longer");
  CHECK(std::distance(fs::directory_iterator(dir / "sub"), fs::directory_iterator()) == 1);
  fs::remove_all(dir);
}

TEST_CASE("the table has a row per result, skipped ones with their reason", "[report]") {
  std::vector<CaseRecord> records(2);
  records[0].kase = test::kernel_case({2, 4, 512, 64, 128, Decay::none}, "scan", Mode::fwd);
  records[0].status = Status::ok;
  records[0].measured = Measurement{};
  records[0].measured->median_ms = 1.5;
  records[0].measured->q1_ms = 1.4;
  records[0].measured->q3_ms = 1.6;
  records[0].measured->gflops = 3.0;
  records[0].measured->rel_err = 1e-7;
  records[1].kase = test::kernel_case({2, 4, 512, 64, 128, Decay::none}, "chunked", Mode::fwd);
  records[1].status = Status::skipped;
  records[1].skip_reason = "bf16 is not supported";
  const std::string table = format_table(records);
  CHECK(std::count(table.begin(), table.end(), '\n') == 4);  // what every row shares, the header, two rows
  CHECK(table.rfind("held constant: backend cpu, dtype float32\nsuite ", 0) == 0);
  CHECK(table.find("1.5000") != std::string::npos);
  CHECK(table.find("skipped: bf16 is not supported") != std::string::npos);
}

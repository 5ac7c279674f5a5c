// Plugins (docs/plugins.md) through the real executable: the example plugin timed, checked and
// reported beside the built-in impls (its flop model, its file's digest in the config block, the
// summary); a wrong plugin exits 1; a plugin's error or leaked scratch fails its case and the run
// goes on; each kind of bad plugin exits 2 with one line before any case runs; a crash loses no
// finished case, and under --isolate fails only its own case. The SHA-256 and the flop crediting
// as units.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/results/sha256.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A small kernel run: seconds, whatever the plugins.
const std::string kSmall = " --suite kernel --batch 1 --heads 2 --dim 8 --chunk 16 --reps 2 --warmup 1 --min-sample-ms 1 --threads 1 -q";

test::ProcessResult lattnbench(const std::string& args) { return test::run_process(test::binary() + " " + args); }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> records_of(const nlohmann::json& doc, const std::string& impl) {
  std::vector<nlohmann::json> out;
  for (const auto& r : doc["results"])
    if (r["impl"] == impl) out.push_back(r);
  return out;
}

std::size_t lines(const std::string& s) { return std::size_t(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("SHA-256 of the FIPS 180-4 examples", "[plugins]") {
  CHECK(sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(sha256_hex(two_blocks.data(), two_blocks.size()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  CHECK(sha256_hex(million.data(), million.size()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("a plugin impl is credited with the flop model of its IMPL part's form, else the first form's", "[plugins]") {
  const Op& op = linear_attention_op();
  CHECK(op.credited_form("scan") == op.form("scan"));
  CHECK(op.credited_form("mine:chunked") == op.form("chunked"));
  CHECK(op.credited_form("mine:fused") == &op.forms.front());
  CHECK(op.credited_form("fused") == nullptr);
  CHECK(op.credited_form("Mine:scan") == nullptr);
  CHECK(is_plugin_impl_name("a_1:b_2"));
  CHECK_FALSE(is_plugin_impl_name("a:"));
  CHECK_FALSE(is_plugin_impl_name("a:b:c"));
}

TEST_CASE("the example plugin runs beside the built-in impls, checked and reported like them", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-example");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_mine " --impl mine:scan,scan,chunked --seq 40 --mode fwd,fwd_bwd "
                                 "--decay none,retnet --out " + (dir / "r.json").string() + kSmall);
  INFO(result.output);
  REQUIRE(result.exit_status == 0);
  CHECK_THAT(result.output, Contains("mine:scan") && Contains("Fastest impl"));
  const nlohmann::json doc = read_json(dir / "r.json");
  const auto mine = records_of(doc, "mine:scan"), scan = records_of(doc, "scan");
  REQUIRE(mine.size() == 4);
  REQUIRE(scan.size() == 4);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    INFO(mine[i].dump());
    CHECK(mine[i]["status"] == "ok");
    CHECK(mine[i]["rel_err"].get<double>() < 1e-4);
    CHECK(mine[i]["flops"] == scan[i]["flops"]);  // credited with scan's model
    CHECK(mine[i]["mode"] == scan[i]["mode"]);
  }
  // The backward's two D x D states come from the harness's allocator: counted.
  for (const auto& r : mine)
    if (r["mode"] == "fwd_bwd") CHECK(r["temp_mb"].get<double>() * 1024 * 1024 >= 2 * 8 * 8 * 4);
  const auto& plugins = doc["config"]["plugins"];
  REQUIRE(plugins.size() == 1);
  CHECK(plugins[0]["name"] == "mine");
  CHECK(plugins[0]["path"] == fs::absolute(LATTN_PLUGIN_mine).lexically_normal().string());
  CHECK(plugins[0]["sha256"] == sha256_file_hex(LATTN_PLUGIN_mine));
}

TEST_CASE("the list (--list) shows plugin impls with their device and the planned cases they decline", "[plugins][spawns]") {
  const auto list = lattnbench("--list --plugin " LATTN_PLUGIN_mine " --plugin " LATTN_PLUGIN_wrong " --seq 13,16 --dim 8");
  INFO(list.output);
  CHECK(list.exit_status == 0);
  CHECK_THAT(list.output, Contains("mine:scan") && Contains("test_wrong:zeros") && Contains("cpu"));
  CHECK_THAT(list.output, Contains("declines") && Contains("test plugins decline seq 13"));
}

TEST_CASE("a plugin's own reason to decline a case is the case's skip reason", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-decline");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_mine " --impl mine:scan --seq 13 --mode fwd_bwd --dtype bf16 "
                                 "--out " + (dir / "bf16.json").string() + kSmall);
  INFO(result.output);
  CHECK(result.exit_status == 0);
  CHECK(records_of(read_json(dir / "bf16.json"), "mine:scan")[0]["skip_reason"] ==
        "plugin impls run float32 only on the CPU backend, not bf16");
  const auto wrong = lattnbench("--plugin " LATTN_PLUGIN_wrong " --impl test_wrong:zeros --seq 13 --mode fwd_bwd --out " +
                                (dir / "seq.json").string() + kSmall);
  INFO(wrong.output);
  CHECK(wrong.exit_status == 0);
  const auto skipped = records_of(read_json(dir / "seq.json"), "test_wrong:zeros")[0];
  CHECK(skipped["status"] == "skipped");
  CHECK(skipped["skip_reason"] == "test_wrong:zeros has no backward (fwd only)");
}

TEST_CASE("a plugin impl named for the layer suite skips its cases", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-layer");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_mine " --suite layer --impl mine:scan --seq 16 --head-dim 8 "
                                 "--window 4 --batch 1 --heads 1 --mode fwd --reps 2 --warmup 1 --min-sample-ms 1 -q "
                                 "--out " + (dir / "r.json").string());
  INFO(result.output);
  CHECK(result.exit_status == 0);
  CHECK(records_of(read_json(dir / "r.json"), "mine:scan")[0]["skip_reason"] ==
        "the cpu backend has no mine:scan impl of the layer op");
}

TEST_CASE("lattnbench keeps its side of the contract: what forward and backward see, saved, scratch", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-contract");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_contract " --impl test_contract:checks --seq 16 "
                                 "--mode fwd,fwd_bwd --decay none,retnet --out " + (dir / "r.json").string() + kSmall);
  INFO(result.output);
  CHECK(result.exit_status == 1);  // it writes zeros: the check fails, the calls do not
  const auto records = records_of(read_json(dir / "r.json"), "test_contract:checks");
  REQUIRE(records.size() == 4);
  for (const auto& r : records) {
    INFO(r.dump());
    CHECK_FALSE(r.contains("error"));
    CHECK(r["rel_err"].get<double>() == Approx(1.0));
    // The forward's saved block (100 bytes), given back by the backward, is counted scratch.
    if (r["mode"] == "fwd_bwd") CHECK(r["temp_mb"].get<double>() * 1024 * 1024 == Approx(100));
  }
}

TEST_CASE("a version 2 plugin is handed each rule's case fields and tensors", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-v2");
  // test_v2:checks returns what lattnbench broke as its error, and writes zeros: each case fails
  // its check (rel_err 1) without an error when the contract holds.
  const std::string forms[] = {"--rule dplr --decay none,scalar,vector", "--rule trapezoidal --decay scalar --mimo-rank 1,2",
                               "--rule additive --decay vector --bonus true,false", "--rule delta --decay scalar --householder 1,2"};
  for (const std::string& form : forms) {
    const auto result = lattnbench("--plugin " LATTN_PLUGIN_v2 " --impl test_v2:checks --seq 16 --mode fwd,fwd_bwd " +
                                   form + " --out " + (dir / "r.json").string() + kSmall);
    INFO(form << "\n" << result.output);
    CHECK(result.exit_status == 1);
    const auto records = records_of(read_json(dir / "r.json"), "test_v2:checks");
    CHECK(records.size() >= 4);
    for (const auto& r : records) {
      INFO(r.dump());
      CHECK_FALSE(r.contains("error"));
      CHECK(r["status"] == "failed");
      CHECK(r["rel_err"].get<double>() == Approx(1.0));
    }
  }
}

TEST_CASE("a version 2 C plugin's dplr forward, from the tensors a, b and g, passes the float64 check", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-v2-dplr");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_v2dplr " --impl test_v2dplr:scan --seq 21 --rule dplr,additive "
                                 "--decay none,retnet,scalar,vector --mode fwd,fwd_bwd --out " + (dir / "r.json").string() +
                                 kSmall);
  INFO(result.output);
  CHECK(result.exit_status == 0);
  std::size_t ran = 0;
  for (const auto& r : records_of(read_json(dir / "r.json"), "test_v2dplr:scan")) {
    INFO(r.dump());
    if (r["mode"] == "fwd_bwd") {
      CHECK(r["skip_reason"] == "test_v2dplr:scan has no backward (fwd only)");
    } else if (r.value("rule", "additive") == "additive") {
      CHECK(r["skip_reason"] == "test_v2dplr:scan: test_v2dplr computes rule dplr only");
    } else {
      CHECK(r["status"] == "ok");
      CHECK(r["rel_err"].get<double>() < 1e-4);
      ++ran;
    }
  }
  CHECK(ran == 4);  // every decay
}

TEST_CASE("a version 1 plugin still loads, runs its rules and declines those only version 2 describes", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-v1-declines");
  const struct {
    std::string form, reason;
  } declined[] = {
      {"--rule dplr --decay vector", "mine:scan: the plugin interface (version 1) has no tensors a and b for rule dplr"},
      {"--rule trapezoidal --decay scalar",
       "mine:scan: the plugin interface (version 1) has no dt or trap tensor for rule trapezoidal"},
      {"--rule additive --decay vector --bonus true", "mine:scan: the plugin interface (version 1) has no bonus tensor u"},
      {"--rule delta --decay none --householder 2",
       "mine:scan: the plugin interface (version 1) takes one key, value and beta row per token (householder 1)"},
  };
  for (const auto& d : declined) {
    const auto result = lattnbench("--plugin " LATTN_PLUGIN_mine " --impl mine:scan --seq 16 --mode fwd,fwd_bwd " + d.form +
                                   " --out " + (dir / "r.json").string() + kSmall);
    INFO(d.form << "\n" << result.output);
    CHECK(result.exit_status == 0);
    const auto records = records_of(read_json(dir / "r.json"), "mine:scan");
    REQUIRE(records.size() == 2);
    for (const auto& r : records) {
      CHECK(r["status"] == "skipped");
      CHECK(r["skip_reason"] == d.reason);
    }
  }
  const auto additive = lattnbench("--plugin " LATTN_PLUGIN_mine " --impl mine:scan --seq 16 --mode fwd,fwd_bwd --out " +
                                   (dir / "ok.json").string() + kSmall);
  INFO(additive.output);
  CHECK(additive.exit_status == 0);
  for (const auto& r : records_of(read_json(dir / "ok.json"), "mine:scan")) CHECK(r["status"] == "ok");
  const auto list = lattnbench("--list --plugin " LATTN_PLUGIN_mine " --plugin " LATTN_PLUGIN_v2 " --seq 16 --dim 8");
  INFO(list.output);
  CHECK(list.exit_status == 0);
  CHECK_THAT(list.output, Contains("interface version 1") && Contains("interface version 2"));
}

TEST_CASE("a wrong plugin fails its check and the run exits 1", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-wrong");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_wrong " --impl test_wrong:zeros,scan --seq 13,16 --mode fwd "
                                 "--out " + (dir / "r.json").string() + kSmall);
  INFO(result.output);
  CHECK(result.exit_status == 1);
  const auto doc = read_json(dir / "r.json");
  const auto wrong = records_of(doc, "test_wrong:zeros");
  REQUIRE(wrong.size() == 2);
  CHECK(wrong[0]["status"] == "skipped");
  CHECK(wrong[0]["skip_reason"] == "test_wrong:zeros: test plugins decline seq 13");
  CHECK(wrong[1]["status"] == "failed");
  CHECK(wrong[1]["rel_err"].get<double>() == Approx(1.0));
  for (const auto& r : records_of(doc, "scan")) CHECK(r["status"] == "ok");
}

TEST_CASE("a plugin's error or leaked scratch fails its case with the message, and the run goes on", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-error");
  const auto result = lattnbench("--plugin " LATTN_PLUGIN_fail " --plugin " LATTN_PLUGIN_leak " --plugin " LATTN_PLUGIN_mine
                                 " --impl test_fail:refuses,test_leak:leaks,mine:scan --seq 16 --mode fwd --out " +
                                 (dir / "r.json").string() + kSmall);
  INFO(result.output);
  CHECK(result.exit_status == 1);
  const auto doc = read_json(dir / "r.json");
  const auto refused = records_of(doc, "test_fail:refuses")[0];
  CHECK(refused["status"] == "failed");
  CHECK(refused["error"] == "test_fail:refuses forward failed: test_fail refuses seq 16 on purpose");
  const auto leaked = records_of(doc, "test_leak:leaks")[0];
  CHECK(leaked["status"] == "failed");
  CHECK_THAT(leaked["error"].get<std::string>(), Contains("left 4096 bytes of scratch allocated"));
  CHECK(records_of(doc, "mine:scan")[0]["status"] == "ok");
}

TEST_CASE("bad plugins exit 2 with one line before any case runs", "[plugins][errors][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-bad");
  const std::string out = " --seq 16 --out " + (dir / "never.json").string() + kSmall;
  const std::string text_file = test::source_dir() + "/tests/plugins/test_plugin.c";
  const struct {
    std::string args, says;
  } bad[] = {
      {"--plugin /nonexistent/libnothing.so", "plugin /nonexistent/libnothing.so: no such file"},
      {"--plugin " + text_file, "not a shared library lattnbench can load"},
      {"--plugin " LATTN_PLUGIN_nosymbol, "exports no lattn_plugin_v1"},
      {"--plugin " LATTN_PLUGIN_abi, "built for plugin ABI 2, this lattnbench loads ABI 1"},
      {"--plugin " LATTN_PLUGIN_abi2, "built for plugin ABI 3, lattn_plugin_v2 is ABI 2"},
      {"--plugin " LATTN_PLUGIN_badname, "plugin name 'Test-Name' is not [a-z0-9_]+"},
      {"--plugin " LATTN_PLUGIN_dupimpl, "two impls are named 'zeros'"},
      {"--plugin " LATTN_PLUGIN_mine " --plugin " LATTN_PLUGIN_dupname, "plugin name 'mine' is taken by"},
      {"--plugin " LATTN_PLUGIN_mine " --impl mine:nope", "no loaded plugin provides 'mine:nope' (loaded: mine:scan)"},
      {"--impl mine:scan", "no loaded plugin provides 'mine:scan' (no plugin is loaded"},
  };
  for (const auto& b : bad) {
    const auto result = lattnbench(b.args + out);
    INFO(b.args << "\n" << result.output);
    CHECK(result.exit_status == 2);
    CHECK(lines(result.output) == 1);
    CHECK_THAT(result.output, Contains("lattnbench: error: ") && Contains(b.says));
    CHECK_FALSE(fs::exists(dir / "never.json"));
  }
}

TEST_CASE("a config's plugins: are relative to the config file", "[plugins][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-config");
  fs::create_directories(dir / "cfg");
  fs::copy_file(LATTN_PLUGIN_mine, dir / "cfg" / "libmine.so");
  std::ofstream(dir / "cfg" / "suite.yaml") << "suites: kernel\nplugins: [libmine.so]\nthreads: 1\nreps: 2\nwarmup: 1\n"
                                               "min_sample_ms: 1\nkernel:\n  impl: [mine:scan, scan]\n  seq: 16\n"
                                               "  dim: 8\n  batch: 1\n  heads: 1\n  mode: fwd\n";
  const auto result = test::run_process("cd " + dir.string() + " && " + test::binary() + " -q --config cfg/suite.yaml --out r.json");
  INFO(result.output);
  CHECK(result.exit_status == 0);
  const auto doc = read_json(dir / "r.json");
  CHECK(doc["config"]["plugins"][0]["path"] == (dir / "cfg" / "libmine.so").string());
  CHECK(records_of(doc, "mine:scan")[0]["status"] == "ok");
}

TEST_CASE("a plugin that crashes loses no finished case, and under --isolate fails only its own", "[plugins][isolate][spawns]") {
  const fs::path dir = test::fresh_dir("plugin-crash");
  const std::string plugins = "--plugin " LATTN_PLUGIN_mine " --plugin " LATTN_PLUGIN_crash " --seq 16 --mode fwd ";
  const auto crashed = lattnbench(plugins + "--impl mine:scan,test_crash:crashes --out " + (dir / "c.json").string() + kSmall);
  INFO(crashed.output);
  CHECK(crashed.exit_status != 0);
  CHECK_FALSE(fs::exists(dir / "c.json"));
  std::ifstream journal(dir / "c.json.journal.jsonl");
  std::string header, first;
  std::getline(journal, header);
  std::getline(journal, first);
  CHECK(nlohmann::json::parse(first)["impl"] == "mine:scan");

  const auto isolated = lattnbench(plugins + "--isolate --impl test_crash:crashes,mine:scan --out " +
                                   (dir / "i.json").string() + kSmall);
  INFO(isolated.output);
  CHECK(isolated.exit_status == 1);
  const auto doc = read_json(dir / "i.json");
  const auto crash = records_of(doc, "test_crash:crashes")[0];
  CHECK(crash["status"] == "failed");
  CHECK(crash["error"] == "test_crash:crashes crashed with SIGABRT (signal 6) in its isolated child process");
  CHECK(records_of(doc, "mine:scan")[0]["status"] == "ok");
}

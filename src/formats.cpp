#include "formats.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "error.hpp"
#include "report.hpp"
#include "summary.hpp"

namespace lattn {
namespace {

const std::vector<std::string>& column_keys() {
  static const std::vector<std::string> keys = {
      "suite",  "impl",    "mode",    "backend", "dtype",   "decay",  "batch",   "heads",      "seq",
      "dim",    "chunk",   "window",  "head_dim", "status", "median_ms", "q1_ms", "q3_ms",    "inner",
      "gflops", "peak_fraction", "peak_fraction_now", "roofline_fraction", "gbytes_per_s", "temp_mb", "arg_mb", "out_mb", "rel_err", "compile_s"};
  return keys;
}

std::string cell(const nlohmann::json& r, const std::string& key) {
  if (!r.contains(key)) return "";
  const auto& v = r[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string gbench_name(const nlohmann::json& r) {
  std::string name = fmt::format("{}/{}/{}", r.value("suite", ""), r.value("impl", ""), r.value("mode", ""));
  for (const char* key : {"batch", "heads", "seq", "dim", "chunk", "window"})
    if (r.contains(key)) name += fmt::format("/{}:{}", key, r[key].dump());
  name += "/decay:" + r.value("decay", std::string("none"));
  return name + "/" + r.value("dtype", std::string("float32"));
}

}  // namespace

OutputFormat parse_output_format(const std::string& text, const std::string& flag) {
  if (text == "table") return OutputFormat::table;
  if (text == "json") return OutputFormat::json;
  if (text == "csv") return OutputFormat::csv;
  if (text == "md") return OutputFormat::md;
  throw UsageError(flag, "unknown format '" + text + "' (expected one of: table, json, csv, md)");
}

OutputFormat format_for_path(const std::string& path, const std::string& flag) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".json") return OutputFormat::json;
  if (ext == ".csv") return OutputFormat::csv;
  if (ext == ".md") return OutputFormat::md;
  throw UsageError(flag, "cannot tell the format of '" + path + "' (expected a .json, .csv or .md file)");
}

std::string to_csv(const nlohmann::json& results) {
  std::string out;
  for (const auto& key : column_keys()) out += (out.empty() ? "" : ",") + key;
  out += "\n";
  for (const auto& r : results) {
    std::string row;
    for (std::size_t i = 0; i < column_keys().size(); ++i) row += (i ? "," : "") + csv_escape(cell(r, column_keys()[i]));
    out += row + "\n";
  }
  return out;
}

std::string to_markdown(const nlohmann::json& results) {
  const std::vector<std::string> keys = {"suite", "impl", "mode", "batch", "heads", "seq", "dim", "chunk", "decay",
                                         "median_ms", "q1_ms", "q3_ms", "gflops", "peak_fraction", "peak_fraction_now", "temp_mb",
                                         "rel_err", "status"};
  std::string out = "|";
  for (const auto& k : keys) out += " " + k + " |";
  out += "\n|";
  for (std::size_t i = 0; i < keys.size(); ++i) out += i < 9 ? "---|" : "---:|";
  out += "\n";
  for (const auto& r : results) {
    out += "|";
    for (const auto& k : keys) out += " " + cell(r, k) + " |";
    out += "\n";
  }
  return out;
}

nlohmann::json to_gbench(const nlohmann::json& doc) {
  const auto& device = doc["device"];
  nlohmann::json context = {
      {"date", doc.value("created_utc", "")},
      {"host_name", device.value("hostname", "")},
      {"executable", doc["argv"].empty() ? "lattnbench" : doc["argv"][0].get<std::string>()},
      {"num_cpus", device.value("cpu_cores", 0)},
      {"mhz_per_cpu", 0},
      {"cpu_scaling_enabled", false},
      {"caches", nlohmann::json::array()},
      {"load_avg", nlohmann::json::array()},
      {"library_build_type", device.value("build_type", "") == "Release" ? "release" : "debug"},
      {"lattnbench_version", doc.value("version", "")},
      {"lattnbench_backend", device.value("backend", "")},
      {"lattnbench_device", device.value("gpu", device.value("cpu_model", ""))},
  };
  // One entry per case, its median as real_time: github-action-benchmark keys data points by name,
  // so per-sample entries would read as duplicates. The quartiles travel as counters.
  nlohmann::json benchmarks = nlohmann::json::array();
  long family = 0;
  for (const auto& r : doc["results"]) {
    if (!r.contains("median_ms")) continue;
    const double median = r["median_ms"].get<double>();
    nlohmann::json e = {{"name", gbench_name(r)}, {"family_index", family++}, {"per_family_instance_index", 0},
                        {"run_name", gbench_name(r)}, {"run_type", "iteration"}, {"repetitions", 1},
                        {"repetition_index", 0}, {"threads", device.value("threads", 1)},
                        {"iterations", r.value("inner", 1)}, {"real_time", median}, {"cpu_time", median},
                        {"time_unit", "ms"}, {"q1_ms", r.value("q1_ms", median)}, {"q3_ms", r.value("q3_ms", median)},
                        {"samples", r.contains("samples_ms") ? r["samples_ms"].size() : 0},
                        {"gflops", r.value("gflops", 0.0)}, {"gbytes_per_s", r.value("gbytes_per_s", 0.0)},
                        {"temp_mb", r.value("temp_mb", 0.0)}, {"rel_err", r.value("rel_err", 0.0)}};
    if (r.contains("peak_fraction")) e["peak_fraction"] = r["peak_fraction"];
    benchmarks.push_back(e);
  }
  return {{"context", context}, {"benchmarks", benchmarks}};
}

std::string render(const nlohmann::json& doc, OutputFormat format) {
  switch (format) {
    case OutputFormat::json:
      return doc.dump(2) + "\n";
    case OutputFormat::csv:
      return to_csv(doc["results"]);
    case OutputFormat::md:
      return to_markdown(doc["results"]);
    case OutputFormat::table:
      break;
  }
  return format_table(doc["results"]) + format_summary(doc.value("summary", nlohmann::json::object({{"comparisons", nlohmann::json::array()}, {"crossovers", nlohmann::json::array()}})));
}

}  // namespace lattn

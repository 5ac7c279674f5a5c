#include "summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace lattn {
namespace {

// Keys that make two records the same shape, apart from impl (and, for crossovers, seq).
const std::vector<std::string>& shape_keys() {
  static const std::vector<std::string> keys = {"suite", "mode", "backend", "dtype", "decay", "batch",
                                                "heads", "dim", "chunk", "window", "head_dim", "seq"};
  return keys;
}

nlohmann::json shape_of(const nlohmann::json& record, bool with_seq) {
  nlohmann::json shape = nlohmann::json::object();
  for (const auto& key : shape_keys())
    if (record.contains(key) && (with_seq || key != "seq")) shape[key] = record[key];
  return shape;
}

std::string label(const nlohmann::json& shape) {
  std::string out = fmt::format("{} {}", shape.value("suite", ""), shape.value("mode", ""));
  for (const char* key : {"batch", "heads", "seq", "dim", "chunk", "window"})
    if (shape.contains(key)) out += fmt::format(" {}={}", key, shape[key].dump());
  if (shape.value("decay", "none") != "none") out += " decay=" + shape["decay"].get<std::string>();
  if (shape.value("dtype", "float32") != "float32") out += " " + shape["dtype"].get<std::string>();
  return out;
}

}  // namespace

nlohmann::json build_summary(const nlohmann::json& results) {
  std::map<std::string, std::vector<const nlohmann::json*>> by_shape;
  std::vector<std::string> shape_order;
  for (const auto& r : results) {
    if (!r.contains("median_ms") || r.value("status", "") == "skipped") continue;
    const std::string key = shape_of(r, true).dump();
    if (!by_shape.count(key)) shape_order.push_back(key);
    by_shape[key].push_back(&r);
  }

  nlohmann::json comparisons = nlohmann::json::array();
  std::map<std::string, std::vector<nlohmann::json>> by_series;  // shape without seq -> comparisons
  std::vector<std::string> series_order;
  for (const auto& key : shape_order) {
    auto records = by_shape[key];
    if (records.size() < 2) continue;
    std::sort(records.begin(), records.end(), [](auto* a, auto* b) { return (*a)["median_ms"] < (*b)["median_ms"]; });
    const auto& best = *records.front();
    const auto& other = *records[1];
    nlohmann::json c = shape_of(best, true);
    c["fastest"] = best["impl"];
    c["other"] = other["impl"];
    c["fastest_median_ms"] = best["median_ms"];
    c["other_median_ms"] = other["median_ms"];
    c["speedup"] = other["median_ms"].get<double>() / std::max(best["median_ms"].get<double>(), 1e-300);
    c["fastest_temp_mb"] = best.value("temp_mb", 0.0);
    c["other_temp_mb"] = other.value("temp_mb", 0.0);
    comparisons.push_back(c);
    const std::string series = shape_of(best, false).dump();
    if (!by_series.count(series)) series_order.push_back(series);
    by_series[series].push_back(c);
  }

  nlohmann::json crossovers = nlohmann::json::array();
  for (const auto& series : series_order) {
    auto points = by_series[series];
    if (points.size() < 2) continue;
    std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a["seq"] < b["seq"]; });
    nlohmann::json entry = nlohmann::json::parse(series);
    entry["winners"] = nlohmann::json::array();
    entry["changes"] = nlohmann::json::array();
    for (std::size_t i = 0; i < points.size(); ++i) {
      entry["winners"].push_back({{"seq", points[i]["seq"]}, {"fastest", points[i]["fastest"]}});
      if (i > 0 && points[i]["fastest"] != points[i - 1]["fastest"])
        entry["changes"].push_back({{"after_seq", points[i - 1]["seq"]}, {"by_seq", points[i]["seq"]},
                                    {"from", points[i - 1]["fastest"]}, {"to", points[i]["fastest"]}});
    }
    crossovers.push_back(entry);
  }
  return {{"comparisons", comparisons}, {"crossovers", crossovers}};
}

std::string format_summary(const nlohmann::json& summary) {
  std::string out;
  if (summary["comparisons"].empty()) return out;
  out += "\nFastest impl per shape and mode:\n";
  for (const auto& c : summary["comparisons"])
    out += fmt::format("  {}: {} is {:.2f}x faster than {} ({:.4g} vs {:.4g} ms); temp {:.3g} vs {:.3g} MiB\n", label(c),
                       c["fastest"].get<std::string>(), c["speedup"].get<double>(), c["other"].get<std::string>(),
                       c["fastest_median_ms"].get<double>(), c["other_median_ms"].get<double>(),
                       c["fastest_temp_mb"].get<double>(), c["other_temp_mb"].get<double>());
  if (!summary["crossovers"].empty()) out += "Crossover in seq:\n";
  for (const auto& x : summary["crossovers"]) {
    if (x["changes"].empty()) {
      out += fmt::format("  {}: {} wins at every seq measured\n", label(x), x["winners"][0]["fastest"].get<std::string>());
      continue;
    }
    for (const auto& ch : x["changes"])
      out += fmt::format("  {}: {} wins up to seq {}, {} from seq {}\n", label(x), ch["from"].get<std::string>(),
                         ch["after_seq"].get<int>(), ch["to"].get<std::string>(), ch["by_seq"].get<int>());
  }
  return out;
}

std::string above_peak_warning(const nlohmann::json& results, double peak_gflops, double median_gflops) {
  const auto above = std::count_if(results.begin(), results.end(),
                                   [](const nlohmann::json& r) { return r.value("peak_fraction", 0.0) > 1.0; });
  if (above == 0) return {};
  return fmt::format(
      "{} case(s) ran above the start-up sgemm peak ({:.1f} GFLOP/s; median of its products {:.1f}): it was "
      "measured in a busier stretch than they ran in; read peak_fraction_now",
      above, peak_gflops, median_gflops);
}

std::string peak_spread_warning(double peak_gflops, double median_gflops) {
  if (!(peak_gflops > 0.0) || !(median_gflops > 0.0) || median_gflops >= 0.9 * peak_gflops) return {};
  return fmt::format(
      "the start-up sgemm products spread: median {:.1f} against best {:.1f} GFLOP/s ({:.2f}); the machine's rate "
      "moved while the peak was measured, so a case as fast as sgemm's median reads peak_fraction {:.2f}: read "
      "peak_fraction_now beside it",
      median_gflops, peak_gflops, median_gflops / peak_gflops, median_gflops / peak_gflops);
}

}  // namespace lattn

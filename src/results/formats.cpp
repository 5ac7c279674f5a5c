#include "src/results/formats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <tuple>

#include "core/error.hpp"
#include "core/op.hpp"
#include "src/results/record_json.hpp"
#include "src/results/report.hpp"
#include "src/results/summary.hpp"

namespace lattn {
namespace {

// A column of the CSV and markdown views: its key (as in the JSON record) and its cell, empty
// where the record has no such value.
struct Column {
  const char* key;
  std::function<std::string(const CaseRecord&)> cell;
};

std::string number(double v) { return fmt::format("{:.6g}", v); }
std::string number(std::optional<double> v) { return v ? number(*v) : ""; }

// The cell of a figure the record has only when it was measured.
template <class Get>
Column measured(const char* key, Get get) {
  return {key, [get](const CaseRecord& r) { return r.measured ? std::string(get(*r.measured)) : std::string(); }};
}

// The cell of a shape parameter the case's op may not have.
Column param(const char* key, Param p, int Case::*member) {
  return {key, [p, member](const CaseRecord& r) { return r.kase.op->has(p) ? std::to_string(r.kase.*member) : ""; }};
}

const std::vector<Column>& columns() {
  static const std::vector<Column> all = {
      {"suite", [](const CaseRecord& r) { return r.kase.op->suite; }},
      {"impl", [](const CaseRecord& r) { return r.kase.impl; }},
      {"mode", [](const CaseRecord& r) { return to_string(r.kase.mode); }},
      {"backend", [](const CaseRecord& r) { return r.kase.backend; }},
      {"dtype", [](const CaseRecord& r) { return r.kase.dtype; }},
      {"decay", [](const CaseRecord& r) { return r.kase.op->has(Param::decay) ? r.kase.decay : ""; }},
      {"batch", [](const CaseRecord& r) { return std::to_string(r.kase.batch); }},
      {"heads", [](const CaseRecord& r) { return std::to_string(r.kase.heads); }},
      {"seq", [](const CaseRecord& r) { return std::to_string(r.kase.seq); }},
      {"dim", [](const CaseRecord& r) { return std::to_string(r.kase.dim); }},
      param("chunk", Param::chunk, &Case::chunk),
      param("window", Param::window, &Case::window),
      {"head_dim",
       [](const CaseRecord& r) {
         if (!r.kase.op->extra_identity) return std::string();
         for (const auto& [key, value] : r.kase.op->extra_identity(r.kase))
           if (key == "head_dim") return std::to_string(value);
         return std::string();
       }},
      {"status", [](const CaseRecord& r) { return to_string(r.status); }},
      measured("median_ms", [](const Measurement& m) { return number(m.median_ms); }),
      measured("q1_ms", [](const Measurement& m) { return number(m.q1_ms); }),
      measured("q3_ms", [](const Measurement& m) { return number(m.q3_ms); }),
      measured("inner", [](const Measurement& m) { return std::to_string(m.inner); }),
      measured("reps", [](const Measurement& m) { return std::to_string(m.samples_ms.size()); }),
      measured("noise_pct", [](const Measurement& m) { return number(m.noise_pct); }),
      measured("stopped_on", [](const Measurement& m) { return m.stopped_on; }),
      measured("gflops", [](const Measurement& m) { return number(m.gflops); }),
      measured("peak_fraction", [](const Measurement& m) { return number(m.peak_fraction); }),
      measured("blas_fraction", [](const Measurement& m) { return number(m.blas_fraction); }),
      measured("blas_fraction_now", [](const Measurement& m) { return number(m.blas_fraction_now); }),
      measured("roofline_fraction", [](const Measurement& m) { return number(m.roofline_fraction); }),
      measured("gbytes_per_s", [](const Measurement& m) { return number(m.gbytes_per_s); }),
      measured("temp_mb", [](const Measurement& m) { return m.temp_unknown.empty() ? number(m.temp_mb) : ""; }),
      measured("temp_mb_source", [](const Measurement& m) { return m.temp_unknown.empty() ? m.temp_source : ""; }),
      measured("arg_mb", [](const Measurement& m) { return number(m.arg_mb); }),
      measured("out_mb", [](const Measurement& m) { return number(m.out_mb); }),
      measured("rel_err",
               [](const Measurement& m) {
                 if (!m.unchecked.empty()) return std::string();  // not checked: no error to give
                 return std::isfinite(m.rel_err) ? number(m.rel_err) : std::string("null");
               }),
      measured("compile_s", [](const Measurement& m) { return number(m.compile_s); }),
  };
  return all;
}

const Column& column(const std::string& key) {
  for (const Column& c : columns())
    if (key == c.key) return c;
  throw RuntimeFailure("no column " + key);
}

// An op option's cell (rule, gate_norm, normalize_keys), empty where the case has no such option.
Column option_column(const std::string& key) {
  return {nullptr, [key](const CaseRecord& r) {
            for (const Axis& axis : r.kase.op->axes)
              if (axis.param == Param::option && axis.key == key && !option_recorded(axis, r.kase.option(key))) return std::string();
            return r.kase.option(key);
          }};
}

// The CSV's columns: the fixed ones, with every op option any record has after head_dim, so that
// a file's columns depend on the ops it ran and not on which values varied.
std::vector<std::pair<std::string, Column>> csv_columns(const std::vector<CaseRecord>& records) {
  std::vector<std::pair<std::string, Column>> out;
  for (const Column& c : columns()) {
    out.emplace_back(c.key, c);
    if (std::string(c.key) == "head_dim")
      for (const std::string& key : option_keys(records)) out.emplace_back(key, option_column(key));
  }
  return out;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// google/benchmark's names: the case's identity as path components.
std::string gbench_name(const Case& c) {
  const Op& op = *c.op;
  std::string name = fmt::format("{}/{}/{}/batch:{}/heads:{}/seq:{}/dim:{}", op.suite, c.impl, to_string(c.mode),
                                 c.batch, c.heads, c.seq, c.dim);
  if (op.has(Param::chunk)) name += fmt::format("/chunk:{}", c.chunk);
  if (op.has(Param::window)) name += fmt::format("/window:{}", c.window);
  name += "/decay:" + (op.has(Param::decay) ? c.decay : std::string("none"));
  for (const auto& [key, value] : distinguishing_options(c)) name += "/" + key + ":" + value;
  return name + "/" + c.dtype;
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

std::vector<std::string> option_keys(const std::vector<CaseRecord>& records) {
  std::vector<std::string> keys;
  for (const CaseRecord& r : records)
    for (const Axis& axis : r.kase.op->axes)
      if (axis.param == Param::option && !r.kase.option(axis.key).empty() && option_recorded(axis, r.kase.option(axis.key)) &&
          std::find(keys.begin(), keys.end(), axis.key) == keys.end())
        keys.push_back(axis.key);
  return keys;
}

std::vector<std::string> varying_keys(const std::vector<CaseRecord>& records) {
  // A key varies when two records that have it hold different values: the delta rule's
  // normalize_keys, absent from additive records, varies only when both true and false ran.
  const auto varies = [&](const std::function<std::string(const CaseRecord&)>& value) {
    std::string seen;
    for (const CaseRecord& r : records) {
      const std::string v = value(r);
      if (v.empty()) continue;
      if (seen.empty()) seen = v;
      else if (v != seen) return true;
    }
    return false;
  };
  std::vector<std::string> keys;
  if (varies([](const CaseRecord& r) { return r.kase.dtype; })) keys.push_back("dtype");
  if (varies([](const CaseRecord& r) { return r.kase.backend; })) keys.push_back("backend");
  for (const std::string& key : option_keys(records))
    if (varies([&](const CaseRecord& r) { return r.kase.option(key); })) keys.push_back(key);
  return keys;
}

std::vector<std::pair<std::string, std::string>> constant_values(const std::vector<CaseRecord>& records) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto constant = [&](const std::string& key, const std::function<std::string(const CaseRecord&)>& value) {
    std::string seen;
    for (const CaseRecord& r : records) {
      const std::string v = value(r);
      if (v.empty()) continue;
      if (seen.empty())
        seen = v;
      else if (v != seen)
        return;
    }
    if (!seen.empty()) out.emplace_back(key, seen);
  };
  constant("backend", [](const CaseRecord& r) { return r.kase.backend; });
  constant("dtype", [](const CaseRecord& r) { return r.kase.dtype; });
  for (const std::string& key : option_keys(records))
    constant(key, [&](const CaseRecord& r) { return r.kase.option(key); });
  return out;
}

std::string constant_line(const std::vector<CaseRecord>& records, const std::vector<std::string>& shown) {
  std::string line;
  for (const auto& [key, value] : constant_values(records))
    if (std::find(shown.begin(), shown.end(), key) == shown.end())
      line += (line.empty() ? "" : ", ") + key + " " + value;
  return line.empty() ? line : "held constant: " + line;
}

std::vector<std::string> table_option_keys(const std::vector<CaseRecord>& records) {
  std::vector<std::string> keys = varying_keys(records);
  const std::vector<std::string> options = option_keys(records);
  if (std::find(options.begin(), options.end(), "rule") != options.end() &&
      std::find(keys.begin(), keys.end(), "rule") == keys.end()) {
    // Before the other options, where varying_keys would have put it.
    auto at =
        std::find_if(keys.begin(), keys.end(), [](const std::string& k) { return k != "dtype" && k != "backend"; });
    keys.insert(at, "rule");
  }
  return keys;
}

std::optional<double> fraction_of_peak(const CaseRecord& r) {
  if (!r.measured) return std::nullopt;
  return r.kase.op && r.kase.op->bytes ? r.measured->bandwidth_fraction : r.measured->peak_fraction;
}

bool is_stdout_path(const std::string& path) { return path == "-" || path == "/dev/stdout"; }

std::vector<Output> parse_outputs(const std::vector<std::string>& paths) {
  std::vector<Output> outputs;
  for (const std::string& path : paths) {
    if (path.empty()) continue;
    Output o;
    if (!is_stdout_path(path)) {
      o.path = path;
      o.format = format_for_path(path, "--out");
    }
    for (const Output& earlier : outputs)
      if (earlier.path == o.path)
        throw UsageError("--out", o.to_stdout() ? "stdout ('-' or /dev/stdout) is given twice"
                                                : "'" + path + "' is given twice");
    outputs.push_back(o);
  }
  return outputs;
}

std::string to_csv(const std::vector<CaseRecord>& records) {
  const auto all = csv_columns(records);
  std::string out;
  for (std::size_t i = 0; i < all.size(); ++i) out += (i ? "," : "") + all[i].first;
  out += "\n";
  for (const CaseRecord& r : records) {
    std::string row;
    for (std::size_t i = 0; i < all.size(); ++i) row += (i ? "," : "") + csv_escape(all[i].second.cell(r));
    out += row + "\n";
  }
  return out;
}

std::string to_markdown(const std::vector<CaseRecord>& records) {
  // The case's identity (with what varies in this run), then the figures, right-aligned.
  std::vector<std::pair<std::string, Column>> shown;
  for (const char* key : {"suite", "impl", "mode", "batch", "heads", "seq", "dim", "chunk", "decay"})
    shown.emplace_back(key, column(key));
  bool layer = false;
  for (const CaseRecord& r : records) layer = layer || r.kase.op->has(Param::window);
  if (layer) {
    shown.emplace_back("window", column("window"));
    shown.emplace_back("head_dim", column("head_dim"));
  }
  const std::vector<std::string> options = table_option_keys(records);
  for (const std::string& key : options)
    shown.emplace_back(key, key == "dtype" || key == "backend" ? column(key) : option_column(key));
  const std::size_t identity = shown.size();
  for (const char* key : {"median_ms", "q1_ms", "q3_ms", "noise_pct", "reps", "gflops"})
    shown.emplace_back(key, column(key));
  // The percentage of the device's peak: of the compute ceiling, or of the bandwidth for the decode step.
  shown.emplace_back("%peak", Column{nullptr, [](const CaseRecord& r) {
                                       const auto f = fraction_of_peak(r);
                                       return f ? fmt::format("{:.1f}", *f * 100) : std::string();
                                     }});
  for (const char* key : {"blas_fraction", "temp_mb", "temp_mb_source", "rel_err", "status"})
    shown.emplace_back(key, column(key));
  std::string out;
  if (const std::string constant = constant_line(records, options); !constant.empty()) out += constant + "\n\n";
  out += "|";
  for (const auto& [key, c] : shown) out += " " + key + " |";
  out += "\n|";
  for (std::size_t i = 0; i < shown.size(); ++i) out += i < identity ? "---|" : "---:|";
  out += "\n";
  for (const CaseRecord& r : records) {
    out += "|";
    // "-" where the record has no such value (a skipped case's figures, a scratch not counted).
    for (const auto& [key, c] : shown) {
      const std::string cell = c.cell(r);
      out += " " + (cell.empty() ? std::string("-") : cell) + " |";
    }
    out += "\n";
  }
  return out;
}

namespace {

// google/benchmark's cache list: {"type", "level", "size" (bytes), "num_sharing"} from "L1d" etc.
nlohmann::json gbench_caches(const HostInfo& host) {
  nlohmann::json caches = nlohmann::json::array();
  for (const auto& [name, kib] : host.cache_kib) {
    const char last = name.back();
    caches.push_back({{"type", last == 'd' ? "Data" : last == 'i' ? "Instruction" : "Unified"},
                      {"level", name.size() > 1 ? name[1] - '0' : 0},
                      {"size", kib * 1024},
                      {"num_sharing", 0}});
  }
  return caches;
}

double to_ns(double ms) { return ms * 1e6; }

// google/benchmark's aggregates of a case's samples: mean, median, and the sample stddev.
struct Aggregates {
  double mean = 0, median = 0, stddev = 0;
};

Aggregates aggregates(std::vector<double> samples) {
  Aggregates a;
  if (samples.empty()) return a;
  const double n = double(samples.size());
  for (double x : samples) a.mean += x / n;
  double sum_sq = 0;
  for (double x : samples) sum_sq += (x - a.mean) * (x - a.mean);
  a.stddev = samples.size() > 1 ? std::sqrt(sum_sq / (n - 1)) : 0.0;
  std::sort(samples.begin(), samples.end());
  const std::size_t mid = samples.size() / 2;
  a.median = samples.size() % 2 ? samples[mid] : (samples[mid - 1] + samples[mid]) / 2;
  return a;
}

}  // namespace

nlohmann::json to_gbench(const RunDocument& doc) {
  const HostInfo& host = doc.device.host;
  nlohmann::json context = {
      {"date", doc.created_utc},
      {"host_name", host.hostname},
      {"executable", doc.argv.empty() ? "lattnbench" : doc.argv[0]},
      {"num_cpus", host.cpu_cores},
      {"mhz_per_cpu", host.cpu_mhz ? long(std::lround(*host.cpu_mhz)) : 0L},
      {"cpu_scaling_enabled", host.cpu_scaling_enabled},
      {"caches", gbench_caches(host)},
      {"load_avg", host.load_avg},
      {"library_build_type", host.build_type == "Release" ? "release" : "debug"},
      {"lattnbench_version", doc.version},
      {"lattnbench_backend", doc.device.backend},
      {"lattnbench_device",
       doc.device.cuda && doc.device.cuda->gpu ? doc.device.cuda->gpu->name : host.cpu_model},
  };
  // As google/benchmark writes --benchmark_repetitions: every sample a repetition (so that its
  // tools/compare.py runs its U test), then the mean, median and stddev aggregates. Times in ns,
  // the one unit both files of a comparison share, whatever the case: a 40 us case is 40000, not
  // a rounded 0 ms. cpu_time is the process CPU time of the same calls, every thread's (as
  // google/benchmark's MeasureProcessCPUTime), omitted for a record from a journal written before
  // lattnbench took it: a copy of real_time would claim a figure nobody measured.
  nlohmann::json benchmarks = nlohmann::json::array();
  long family = 0;
  for (const CaseRecord& r : doc.results) {
    if (r.status == Status::skipped) continue;
    const std::string name = gbench_name(r.kase);
    const nlohmann::json base = {{"name", name}, {"family_index", family++}, {"per_family_instance_index", 0},
                                 {"run_name", name}, {"threads", host.threads}, {"time_unit", "ns"}};
    if (!r.measured) {  // broke before it was measured
      nlohmann::json e = base;
      e.update({{"run_type", "iteration"}, {"repetitions", 1}, {"repetition_index", 0}, {"iterations", 0},
                {"real_time", 0.0}, {"cpu_time", 0.0}, {"error_occurred", true}, {"error_message", r.error}});
      benchmarks.push_back(e);
      continue;
    }
    const Measurement& m = *r.measured;
    nlohmann::json counters = {{"gflops", m.gflops}, {"gbytes_per_s", m.gbytes_per_s}, {"temp_mb", m.temp_mb}};
    if (m.unchecked.empty())  // an unchecked case has no error to give
      counters["rel_err"] = std::isfinite(m.rel_err) ? nlohmann::json(m.rel_err) : nlohmann::json(nullptr);
    if (m.peak_fraction) counters["peak_fraction"] = *m.peak_fraction;
    if (m.blas_fraction) counters["blas_fraction"] = *m.blas_fraction;
    const std::string error = !m.check_failure.empty() ? m.check_failure : r.error;
    const bool has_cpu = m.samples_cpu_ms.size() == m.samples_ms.size() && !m.samples_ms.empty();
    auto entry = [&](nlohmann::json e, double ms, double cpu_ms) {
      e.update(base);
      e.update(counters);
      e["iterations"] = m.inner;
      e["repetitions"] = int(m.samples_ms.size());
      e["real_time"] = to_ns(ms);
      if (has_cpu) e["cpu_time"] = to_ns(cpu_ms);
      if (!error.empty()) {
        e["error_occurred"] = true;
        e["error_message"] = error;
      }
      return e;
    };
    for (std::size_t i = 0; i < m.samples_ms.size(); ++i)
      benchmarks.push_back(entry({{"run_type", "iteration"}, {"repetition_index", i}}, m.samples_ms[i],
                                 has_cpu ? m.samples_cpu_ms[i] : 0.0));
    const Aggregates wall = aggregates(m.samples_ms), cpu = aggregates(m.samples_cpu_ms);
    for (const auto& [aggregate, ms, cpu_ms] : {std::tuple{"mean", m.mean_ms, cpu.mean}, {"median", m.median_ms, cpu.median},
                                               {"stddev", wall.stddev, cpu.stddev}}) {
      nlohmann::json e = entry({{"run_type", "aggregate"}, {"aggregate_name", aggregate}, {"aggregate_unit", "time"}}, ms, cpu_ms);
      e["name"] = name + "_" + aggregate;
      benchmarks.push_back(e);
    }
  }
  return {{"context", context}, {"benchmarks", benchmarks}};
}

std::string render(const RunDocument& doc, OutputFormat format) {
  switch (format) {
    case OutputFormat::json:
      return to_json(doc).dump(2) + "\n";
    case OutputFormat::csv:
      return to_csv(doc.results);
    case OutputFormat::md:
      return to_markdown(doc.results);
    case OutputFormat::table:
      break;
  }
  return format_table(doc.results) + format_summary(build_summary(doc.results));
}

}  // namespace lattn

// Other renderings of a run: CSV and markdown rows, and a Google Benchmark JSON export that
// existing tooling (github-action-benchmark's googlecpp mode, google/benchmark's tools/compare.py)
// reads as it is.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/results/record.hpp"

namespace lattn {

enum class OutputFormat { table, json, csv, md };

// "table", "json", "csv", "md"; throws UsageError naming `flag` otherwise.
OutputFormat parse_output_format(const std::string& text, const std::string& flag);
// By the file's extension: .json, .csv, .md; throws UsageError naming `flag` for others.
OutputFormat format_for_path(const std::string& path, const std::string& flag);

// Where one --out goes: a file in its extension's format, or, for "-" and /dev/stdout, the
// result JSON on stdout (the progress lines stay on stderr).
struct Output {
  std::string path;  // empty for stdout
  OutputFormat format = OutputFormat::json;
  bool to_stdout() const { return path.empty(); }
};
bool is_stdout_path(const std::string& path);
// The --out paths in order, empty ones left out; throws UsageError naming --out for an unknown
// extension, stdout given twice, or one file given twice.
std::vector<Output> parse_outputs(const std::vector<std::string>& paths);

// The op options (rule, gate_norm, normalize_keys, ...) any record has, in their op's axis order.
std::vector<std::string> option_keys(const std::vector<CaseRecord>& records);
// What varies among the records beyond the fixed columns every view has: dtype, backend and each
// op option whose value differs between two records that have it. Every view shows these as
// columns, so that no two rows look alike.
std::vector<std::string> varying_keys(const std::vector<CaseRecord>& records);

// The values of dtype, backend and each op option that every record having it holds alike, in that
// order: what the tables print once above their rows ("held constant").
std::vector<std::pair<std::string, std::string>> constant_values(const std::vector<CaseRecord>& records);
// The line the stdout and markdown tables print above their rows, "held constant: rule delta,
// dtype float32, ..." without the keys in `shown` (those the table has as columns); "" for none.
std::string constant_line(const std::vector<CaseRecord>& records, const std::vector<std::string>& shown);
// The option columns a table shows: those that vary (varying_keys), and the rule wherever a record
// has one, since the rule and the decay together name the family (the delta rule with a vector
// decay is not GLA).
std::vector<std::string> table_option_keys(const std::vector<CaseRecord>& records);

// The record's fraction of its device's peak, the tables' %peak: peak_fraction (against the
// compute ceiling), or for an op with a byte model (the decode step) bandwidth_fraction (against
// the measured bandwidth); nothing where it is unknown.
std::optional<double> fraction_of_peak(const CaseRecord& record);

// CSV: every column of the JSON record's scalar figures, with each op option any record has.
std::string to_csv(const std::vector<CaseRecord>& records);
std::string to_markdown(const std::vector<CaseRecord>& records);
// google/benchmark's JSON: per case every sample as a repetition, then mean, median and stddev
// aggregates (ns); a failed check or a broken case carries error_occurred and its message.
nlohmann::json to_gbench(const RunDocument& document);

// The whole document in `format` (table: the table and the summary).
std::string render(const RunDocument& document, OutputFormat format);

}  // namespace lattn

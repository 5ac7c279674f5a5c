// Other renderings of a run: CSV and markdown rows, and a Google Benchmark JSON export that
// existing tooling (github-action-benchmark's googlecpp mode, google/benchmark's tools/compare.py)
// reads as it is.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "record.hpp"

namespace lattn {

enum class OutputFormat { table, json, csv, md };

// "table", "json", "csv", "md"; throws UsageError naming `flag` otherwise.
OutputFormat parse_output_format(const std::string& text, const std::string& flag);
// By the file's extension: .json, .csv, .md; throws UsageError naming `flag` for others.
OutputFormat format_for_path(const std::string& path, const std::string& flag);

std::string to_csv(const std::vector<CaseRecord>& records);
std::string to_markdown(const std::vector<CaseRecord>& records);
// google/benchmark's JSON: per case every sample as a repetition, then mean, median and stddev
// aggregates (ns); a failed check or a broken case carries error_occurred and its message.
nlohmann::json to_gbench(const RunDocument& document);

// The whole document in `format` (table: the table and the summary).
std::string render(const RunDocument& document, OutputFormat format);

}  // namespace lattn

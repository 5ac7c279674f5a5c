// What a run writes: the result file, whole or not at all, and the table on stdout.
#pragma once

#include <string>
#include <vector>

#include "record.hpp"

namespace lattn {

// Writes `content` to a temporary file beside `path`, flushes it to disk, then renames it over
// `path`: a reader sees the old file or the whole new one, never part of one. Creates the folder.
void write_file_atomically(const std::string& path, const std::string& content);

// Fails early (UsageError naming `flag`) when `path` could not be written, so that a long run does
// not end in an error with its results lost.
void check_writable(const std::string& path, const std::string& flag);

// The results as an aligned text table, one row per record.
std::string format_table(const std::vector<CaseRecord>& records);

}  // namespace lattn

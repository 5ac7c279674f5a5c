// What a run writes: the result file, whole or not at all, and the table on stdout.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/results/formats.hpp"
#include "src/results/record.hpp"

namespace lattn {

// Writes all of `data` to `fd`, continuing short writes and EINTR; 0, or the errno of the failure
// (ENOSPC for a write that took nothing).
int write_all(int fd, std::string_view data);

// Writes `pieces` one after another to a temporary file beside `path`, flushes it to disk, then
// renames it over `path`: a reader sees the old file or the whole new one, never part of one, and
// a failed write leaves no temporary file. Creates the folder. A full disk throws EnvironmentError
// (core/error.hpp), other failures RuntimeFailure.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces);
inline void write_file_atomically(const std::string& path, std::string_view content) {
  write_file_atomically(path, std::vector<std::string_view>{content});
}

// The results as an aligned text table, one row per record.
std::string format_table(const std::vector<CaseRecord>& records);

// Writes the document to each output that is a file, atomically, in its format (the stdout one
// is the caller's to print, after the files). Throws as write_file_atomically.
void write_output_files(const std::vector<Output>& outputs, const RunDocument& document);

}  // namespace lattn

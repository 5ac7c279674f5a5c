// The run's journal: a header line, then one JSON line per finished case, each written whole with
// one write(2) in append mode and fsynced before the next case starts, so that a run killed at
// case 40 of 44 keeps 39 (--resume). A write the disk cut short leaves a last line without its
// newline; resuming cuts it off before appending.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "src/results/record.hpp"

namespace lattn {

class Journal {
 public:
  // Creates (truncates) `path` and writes `header`; or, with `append`, adds to an existing journal.
  // A failed write throws EnvironmentError for a full disk (core/error.hpp), else RuntimeFailure.
  Journal(const std::string& path, const nlohmann::json& header, bool append);
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal();

  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  void write_line(const nlohmann::json& line);
  std::string path_;
  int fd_ = -1;
};

struct JournalLine {
  int number = 0;  // 1-based line of the file
  nlohmann::json record;
};

struct JournalContents {
  nlohmann::json header;
  std::vector<JournalLine> records;
  std::size_t whole_bytes = 0;    // the bytes up to the end of the last whole line
  std::size_t partial_bytes = 0;  // the bytes of a last line without its newline (cut short)
};

// Reads a journal; a last line without its newline (a write cut short) is left out and counted in
// partial_bytes. Throws UsageError naming the file (and line) for anything that is not a
// lattnbench journal: not a regular file, no header, a damaged line before the last.
JournalContents read_journal(const std::string& path);
JournalContents parse_journal(const std::string& text, const std::string& path);

// Cuts a partial last line off the journal at `path` (saying so on stderr), so that what is
// appended next starts a line of its own.
void cut_partial_line(const std::string& path, const JournalContents& contents);

// The records of a journal being resumed, by plan index, after checking that it belongs to this
// run: its header's config, shard, plan_size, schema_version and device equal `header`'s, and each
// record is a case of `plan` (this run's shard of `full_plan`), given once, that reads back
// through record_from_json. Throws UsageError naming the file and line.
std::map<std::size_t, CaseRecord> resumed_records(const JournalContents& journal, const nlohmann::json& header,
                                                  const std::vector<Case>& full_plan, const std::vector<Case>& plan,
                                                  const std::string& path);

}  // namespace lattn

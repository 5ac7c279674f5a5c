// The run's journal: a header line, then one JSON line per finished case, each flushed to disk
// before the next case starts, so that a run killed at case 40 of 44 keeps 39 (--resume).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace lattn {

class Journal {
 public:
  // Creates (truncates) `path` and writes `header`; or, with `append`, adds to an existing journal.
  Journal(const std::string& path, const nlohmann::json& header, bool append);
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal();

  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  void write_line(const nlohmann::json& line);
  std::string path_;
  std::FILE* file_ = nullptr;
};

struct JournalLine {
  int number = 0;  // 1-based line of the file
  nlohmann::json record;
};

struct JournalContents {
  nlohmann::json header;
  std::vector<JournalLine> records;
};

// Reads a journal; a last line cut short by a kill is dropped. Throws UsageError naming the file
// for anything that is not a lattnbench journal.
JournalContents read_journal(const std::string& path);

}  // namespace lattn

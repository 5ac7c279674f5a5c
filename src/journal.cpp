#include "journal.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.hpp"

namespace lattn {

Journal::Journal(const std::string& path, const nlohmann::json& header, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw UsageError(path, std::string("cannot open the journal: ") + std::strerror(errno));
  if (!append) write_line(header);
}

Journal::~Journal() {
  if (file_) std::fclose(file_);
}

void Journal::append(const nlohmann::json& record) { write_line(record); }

void Journal::write_line(const nlohmann::json& line) {
  const std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0 ||
      ::fsync(::fileno(file_)) != 0)
    throw RuntimeFailure("cannot write the journal " + path_ + ": " + std::strerror(errno));
}

JournalContents read_journal(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(path, "cannot read the journal");
  JournalContents contents;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json parsed;
    try {
      parsed = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      if (in.peek() == EOF) break;  // the line a kill cut short
      throw UsageError(path + ":" + std::to_string(number), "not a JSON line: the journal is damaged");
    }
    if (number == 1) {
      if (parsed.value("journal", "") != "lattnbench")
        throw UsageError(path + ":1", "not a lattnbench journal (no header line)");
      contents.header = parsed;
    } else {
      contents.records.push_back({number, parsed});
    }
  }
  if (contents.header.is_null()) throw UsageError(path, "the journal is empty");
  return contents;
}

}  // namespace lattn

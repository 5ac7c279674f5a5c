#include "src/results/journal.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "src/results/record_json.hpp"
#include "src/results/report.hpp"

namespace lattn {

Journal::Journal(const std::string& path, const nlohmann::json& header, bool append) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) throw_file_error("cannot open the journal " + path, errno);
  if (!append) write_line(header);
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

void Journal::append(const nlohmann::json& record) { write_line(record); }

// One write of the whole line: with O_APPEND it lands at the end as one piece, never interleaved
// with a partial one; a write the disk cuts short leaves a last line without its newline, which
// resuming cuts off. write_all only continues a short write (the disk filling up mid-line).
void Journal::write_line(const nlohmann::json& line) {
  if (const int error = write_all(fd_, line.dump() + "\n"); error != 0)
    throw_file_error("cannot write the journal " + path_, error);
  if (::fsync(fd_) != 0) throw_file_error("cannot flush the journal " + path_, errno);
}

JournalContents parse_journal(const std::string& text, const std::string& path) {
  JournalContents contents;
  std::size_t start = 0;
  int number = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    if (end == std::string::npos) {  // the line a full disk or a kill cut short
      contents.partial_bytes = text.size() - start;
      break;
    }
    ++number;
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    contents.whole_bytes = start;
    if (line.empty()) continue;
    nlohmann::json parsed;
    try {
      parsed = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw UsageError(path + ":" + std::to_string(number), "not a JSON line: the journal is damaged");
    }
    if (number == 1) {
      if (!parsed.is_object() || parsed.value("journal", nlohmann::json()) != "lattnbench")
        throw UsageError(path + ":1", "not a lattnbench journal (no header line)");
      contents.header = parsed;
    } else {
      contents.records.push_back({number, parsed});
    }
  }
  if (contents.header.is_null()) throw UsageError(path, "the journal is empty (no whole header line)");
  return contents;
}

JournalContents read_journal(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UsageError(path, std::string("cannot read the journal: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw UsageError(path, "the journal is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path, "cannot read the journal");
  std::stringstream text;
  text << in.rdbuf();
  return parse_journal(text.str(), path);
}

void cut_partial_line(const std::string& path, const JournalContents& contents) {
  if (contents.partial_bytes == 0) return;
  if (::truncate(path.c_str(), off_t(contents.whole_bytes)) != 0)
    throw_file_error("cannot cut the partial last line of the journal " + path, errno);
  fmt::print(stderr, "lattnbench: note: {}: cut off a partial last line ({} bytes, a write cut short); its case runs again\n",
             printable(path), contents.partial_bytes);
}

std::map<std::size_t, CaseRecord> resumed_records(const JournalContents& journal, const nlohmann::json& header,
                                                  const std::vector<Case>& full_plan, const std::vector<Case>& plan,
                                                  const std::string& path) {
  for (const char* key : {"config", "shard", "filter", "plan_size", "schema_version"}) {
    const nlohmann::json theirs = journal.header.value(key, nlohmann::json());
    if (theirs != header.value(key, nlohmann::json()))
      throw UsageError(path, std::string("the journal's ") + key + " differs from this run's" +
                                 (theirs.is_structured() ? "" : " (" + theirs.dump() + ")") +
                                 ": resume with the same command line and build");
  }
  if (journal.header.value("device", nlohmann::json()) != header.value("device", nlohmann::json()))
    throw UsageError(path, "the journal was written on another device (" + journal.header.value("device", nlohmann::json()).dump() + ")");
  std::set<std::size_t> in_shard;
  for (const Case& c : plan) in_shard.insert(c.plan_index);
  std::map<std::size_t, CaseRecord> done;
  for (const JournalLine& line : journal.records) {
    const std::string where = path + ":" + std::to_string(line.number);
    const nlohmann::json& index = line.record.is_object() ? line.record.value("plan_index", nlohmann::json()) : nlohmann::json();
    if (!index.is_number_unsigned() || index.get<std::size_t>() >= full_plan.size())
      throw UsageError(where, "the journal record has no plan_index of this run's plan");
    const std::size_t i = index.get<std::size_t>();
    if (!in_shard.count(i)) throw UsageError(where, "the journal record's case " + std::to_string(i) + " is not in this run's shard");
    if (done.count(i)) throw UsageError(where, "the journal holds case " + std::to_string(i) + " twice");
    CaseRecord record = record_from_json(line.record, full_plan[i], where);
    // A case a stop request cut short is measured again in full: its partial line stays in the
    // journal, and the next line of the same case replaces it.
    if (record.measured && record.measured->stopped_on == "interrupted") continue;
    done[i] = std::move(record);
  }
  return done;
}

}  // namespace lattn

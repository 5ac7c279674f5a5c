#include "src/config/config_text.hpp"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/error.hpp"

namespace lattn {
namespace {

int line_of_byte(const std::string& text, std::size_t byte) {
  byte = std::min(byte, text.size());
  return 1 + int(std::count(text.begin(), text.begin() + long(byte), '\n'));
}

// Throws UsageError when `text` is not strict JSON (the line of the error), or nests deeper than
// kMaxConfigDepth.
void check_json(const std::string& text, const std::string& source) {
  try {
    const auto depth_guard = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
      if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
          depth >= kMaxConfigDepth)
        throw UsageError(source, "nested deeper than " + std::to_string(kMaxConfigDepth) + " levels");
      return false;  // nothing is kept: this pass checks the syntax only
    };
    const nlohmann::json discarded = nlohmann::json::parse(text, depth_guard);
    (void)discarded;
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    const auto colon = what.find(": ", what.find("column"));
    if (colon != std::string::npos) what = what.substr(colon + 2);
    throw UsageError(source + ":" + std::to_string(line_of_byte(text, e.byte ? e.byte - 1 : 0)), "JSON syntax error: " + what);
  } catch (const nlohmann::json::out_of_range& e) {
    // A number too large for a double ("number overflow parsing '1e999'"); it has no position,
    // so the line is where the number first appears.
    const std::string what = e.what();
    const auto open = what.find('\''), close = what.rfind('\'');
    const std::string token = open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
    const std::size_t at_byte = token.empty() ? std::string::npos : text.find(token);
    throw UsageError(source + (at_byte == std::string::npos ? "" : ":" + std::to_string(line_of_byte(text, at_byte))),
                     "JSON number out of range: '" + token + "'");
  }
}

// The YAML event stream checked before any tree is built: one document, no tags ("?" is a plain
// node, "!" a quoted scalar: neither is written by the user), nesting within kMaxConfigDepth
// (yaml-cpp's own guard says only "bad file", and only at ~500 levels).
class StrictEvents : public YAML::EventHandler {
 public:
  explicit StrictEvents(const std::string& source) : source_(source) {}

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1)
      throw UsageError(where(mark), "a second YAML document: a config is one document (remove the '---')");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t, const std::string&) override {
    check_tag(mark, tag);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(mark, tag);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(mark, tag);
  }
  void OnMapEnd() override { --depth_; }

 private:
  std::string where(const YAML::Mark& mark) const { return source_ + ":" + std::to_string(mark.line + 1); }
  void check_tag(const YAML::Mark& mark, const std::string& tag) const {
    if (tag != "?" && tag != "!" && !tag.empty())
      throw UsageError(where(mark), "the YAML tag '" + tag + "' is not accepted in a config (write the value plainly)");
  }
  void open(const YAML::Mark& mark, const std::string& tag) {
    check_tag(mark, tag);
    if (++depth_ > kMaxConfigDepth)
      throw UsageError(where(mark), "nested deeper than " + std::to_string(kMaxConfigDepth) + " levels");
  }

  std::string source_;
  int documents_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string read_config_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UsageError(path, std::string("cannot read the config file: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UsageError(path, std::string("cannot read the config file: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw UsageError(path, "is a directory, expected a config file");
  if (!S_ISREG(st.st_mode)) throw UsageError(path, "is not a regular file (a device, FIFO or socket), expected a config file");
  if (std::size_t(st.st_size) > kMaxConfigBytes)
    throw UsageError(path, "is " + std::to_string(st.st_size) + " bytes, over the 1 MiB limit of a config");
  // Read at most one byte past the limit, in case the file grows while it is read.
  std::string text(kMaxConfigBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UsageError(path, std::string("cannot read the config file: ") + std::strerror(errno));
    if (n == 0) break;
    got += std::size_t(n);
  }
  if (got > kMaxConfigBytes) throw UsageError(path, "is over the 1 MiB limit of a config");
  text.resize(got);
  return text;
}

YAML::Node load_config_tree(const std::string& original_text, const std::string& source) {
  std::string text = original_text;
  const bool is_json = source.size() >= 5 && source.compare(source.size() - 5, 5, ".json") == 0;
  if (is_json) {
    check_json(text, source);
    // Valid JSON has tabs only as whitespace between tokens, which YAML does not accept everywhere.
    std::replace(text.begin(), text.end(), '\t', ' ');
  }
  try {
    std::istringstream events_in(text);
    YAML::Parser parser(events_in);
    StrictEvents strict(source);
    while (parser.HandleNextDocument(strict)) {
    }
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UsageError(source + ":" + std::to_string(e.mark.line + 1), "YAML syntax error: " + e.msg);
  }
}

}  // namespace lattn

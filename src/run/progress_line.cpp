#include "src/run/progress_line.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

namespace lattn {
namespace {

// The status line is cut to the terminal's width: a line that wraps cannot be rewritten in place.
std::size_t terminal_columns() {
  winsize size{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 10) return size.ws_col;
  return 80;
}

}  // namespace

ProgressLine::ProgressLine(bool enabled, bool terminal) : enabled_(enabled), terminal_(terminal) {}

ProgressLine::~ProgressLine() { close(); }

bool ProgressLine::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

void ProgressLine::draw(const std::string& status) {
  std::string line = status;
  const std::size_t columns = terminal_columns() - 1;
  if (line.size() > columns) line = line.substr(0, columns - 3) + "...";
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = std::chrono::steady_clock::now();
}

void ProgressLine::note(const std::string& line) {
  if (!enabled_) return;
  if (terminal_ && drawn_) std::fputs("\r\033[K", stderr);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  drawn_ = false;
}

void ProgressLine::finished(const std::string& status, const std::string& line) {
  if (!enabled_) return;
  if (terminal_) {
    draw(status);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
}

void ProgressLine::status(const std::string& status) {
  if (!enabled_ || !terminal_) return;
  if (drawn_ && std::chrono::steady_clock::now() - last_draw_ < std::chrono::milliseconds(250)) return;
  draw(status);
}

void ProgressLine::close() {
  if (!enabled_ || !terminal_ || !drawn_) return;
  std::fputs("\n", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace lattn

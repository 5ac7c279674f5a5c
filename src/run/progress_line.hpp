// The run's progress on stderr. On a terminal: one status line (cases done / total, elapsed, ETA,
// the case last finished) rewritten in place, with the lines that must stay (a failed case, a
// warning) printed above it. On a pipe or a file: one line per finished case and per batch, never
// one per sampling round, so that a log reads as a list of what finished.
#pragma once

#include <chrono>
#include <string>

namespace lattn {

class ProgressLine {
 public:
  // `enabled` false (--quiet): prints nothing. `terminal`: stderr is a terminal.
  ProgressLine(bool enabled, bool terminal);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Whether stderr is a terminal (the status line is rewritten) or not (lines are appended).
  static bool stderr_is_terminal();
  bool on_terminal() const { return terminal_; }

  // A line that stays: above the status line on a terminal, appended elsewhere.
  void note(const std::string& line);
  // A case finished: its line on a pipe; on a terminal the status line shows it.
  void finished(const std::string& status, const std::string& line);
  // The status line now (terminal only; at most a few rewrites a second).
  void status(const std::string& status);
  // Ends the status line, so that what follows starts on a line of its own.
  void close();

 private:
  void draw(const std::string& status);
  bool enabled_, terminal_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace lattn

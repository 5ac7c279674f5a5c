// One error type for everything the user got wrong: a config file, a flag, a size, a backend that
// is not there. It carries where (file:line, or the flag) and what was expected; main prints it on
// one line and exits with status 2 (docs/cli.md). A failure of the environment the run writes to
// (a full disk, a quota, an I/O error, a read-only file system) is an EnvironmentError, exit 4.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lattn {

// `text` with every control character written as an escape (\n, \t, \r, \xHH), and the Unicode
// line separators U+0085, U+2028, U+2029 as \u escapes: what an error message echoes of the
// user's input (a value, a key, a path) then stays on one line, and a NUL cannot cut it short.
inline std::string printable(std::string_view text) {
  static const char* const hex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = [&](std::size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0; };
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    else if (c == 0xc2 && next(1) == 0x85) out += "\\u0085", ++i;
    else if (c == 0xe2 && next(1) == 0x80 && (next(2) == 0xa8 || next(2) == 0xa9))
      out += next(2) == 0xa8 ? "\\u2028" : "\\u2029", i += 2;
    else out += char(c);
  }
  return out;
}

class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& where, const std::string& what)
      : std::runtime_error(printable(where.empty() ? what : where + ": " + what)) {}
};

// An internal failure of a library call (BLAS, CUDA, the file system) with the call site.
class RuntimeFailure : public std::runtime_error {
 public:
  explicit RuntimeFailure(const std::string& what) : std::runtime_error(printable(what)) {}
};

// The environment would not take what the run wrote: the disk is full, a quota is reached, the
// device failed or is read-only. Not a bug and not bad usage: main exits 4.
class EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& what) : std::runtime_error(printable(what)) {}
};

// errno values that mean the environment refused a write. EFBIG is a file over the size limit
// (RLIMIT_FSIZE, or the file system's own), which a run meets the way it meets a full disk.
inline bool is_environment_errno(int error) {
  return error == ENOSPC || error == EDQUOT || error == EIO || error == EROFS || error == EFBIG;
}

// Throws the error a failed file operation is: EnvironmentError for is_environment_errno, else
// RuntimeFailure. `what` says what was being done ("cannot write x.json").
[[noreturn]] inline void throw_file_error(const std::string& what, int error) {
  const std::string message = what + ": " + std::strerror(error);
  if (is_environment_errno(error)) throw EnvironmentError(message);
  throw RuntimeFailure(message);
}

}  // namespace lattn

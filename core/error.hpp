// One error type for everything the user got wrong: a config file, a flag, a size, a backend that
// is not there. It carries where (file:line, or the flag) and what was expected; main prints it on
// one line and exits with status 2 (docs/cli.md).
#pragma once

#include <stdexcept>
#include <string>

namespace lattn {

class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& where, const std::string& what)
      : std::runtime_error(where.empty() ? what : where + ": " + what) {}
};

// An internal failure of a library call (BLAS, CUDA, the file system) with the call site.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace lattn

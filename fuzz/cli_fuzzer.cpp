// libFuzzer target: the command-line parser on arbitrary argv (the input's bytes split at NUL
// into arguments after "lattnbench"). Every argv must parse to a run request or an answer, or be
// refused with a UsageError; anything else (a crash, another exception, a hang) is a bug. A
// --config it names is read as the binary would (capped at 1 MiB; a device or folder refused).
// Built with -DLATTN_FUZZ=ON and clang; scripts/fuzz.sh runs it, and
// tests/config/test_fuzz_regressions.cpp replays what it found (fuzz/regressions/cli/).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "src/cli/cli.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> argv = {"lattnbench"};
  std::string arg;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(arg);
      arg.clear();
    } else {
      arg += char(data[i]);
    }
  }
  if (!arg.empty()) argv.push_back(arg);
  try {
    (void)lattn::parse_command_line(argv);
  } catch (const lattn::UsageError&) {
  }
  return 0;
}

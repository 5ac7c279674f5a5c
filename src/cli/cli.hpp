// The command line (docs/cli.md): parses argv into a run request, or into the answer to --help or
// --version, or --list. It prints nothing and runs nothing (the config file is all it reads), so
// that it can be fuzzed (fuzz/cli_fuzzer.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/plugins/plugins.hpp"
#include "src/run/runner.hpp"

namespace lattn {

struct CliOutcome {
  std::optional<RunRequest> request;  // empty when the command is answered without a run
  std::string output;                 // the answer to print on stdout (--help, --version)
  // --list: print list_capabilities() (src/run/capabilities.hpp), with `request`'s plugins and config
  // when it holds them (a config or plugins were named), and run nothing.
  bool list = false;
};

// Throws UsageError for bad flags or config.
CliOutcome parse_command_line(const std::vector<std::string>& argv);

}  // namespace lattn

// The command line (docs/cli.md): parses argv into a run request, or handles --help, --version
// and --list itself.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plugins.hpp"
#include "runner.hpp"

namespace lattn {

struct CliOutcome {
  std::optional<RunRequest> request;  // empty when the command was fully handled (help, list, ...)
  int exit_status = 0;
};

// Throws UsageError for bad flags or config.
CliOutcome parse_command_line(const std::vector<std::string>& argv);

// With plugins, their impls beside the backends' own, and for each the planned cases of `config`
// it declines, with the reasons.
std::string list_capabilities(const Plugins& plugins = {}, const Config* config = nullptr);

}  // namespace lattn

// Exit status: 0 every case ran and passed its check; 1 a case failed its check or broke (its
// results are still written); 2 bad usage or config, with one line saying where and what.
#include <fmt/format.h>

#include <exception>

#include "cli.hpp"
#include "backend.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  lattn::prepare_process_environment(argv);
  try {
    const lattn::CliOutcome outcome = lattn::parse_command_line(std::vector<std::string>(argv, argv + argc));
    if (!outcome.request) return outcome.exit_status;
    return lattn::run_benchmarks(*outcome.request);
  } catch (const lattn::UsageError& e) {
    fmt::print(stderr, "lattnbench: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lattnbench: internal error: {}\n", e.what());
    return 3;
  }
}

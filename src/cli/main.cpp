// Exit status (docs/cli.md): 0 every case ran and passed its check; 1 a case failed its check or
// broke (its results are still written); 2 bad usage or config, with one line saying where and
// what; 3 an internal error (a bug); 4 the environment refused a write (a full disk, a quota, an
// I/O error, a read-only file system): one line, the finished cases kept in the journal for
// --resume; 128 + signal when SIGINT or SIGTERM stopped the run.
#include <fmt/format.h>

#include <exception>

#include "src/run/capabilities.hpp"
#include "src/cli/cli.hpp"
#include "src/run/backend.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  lattn::prepare_process_environment(argv);
  try {
    const lattn::CliOutcome outcome = lattn::parse_command_line(std::vector<std::string>(argv, argv + argc));
    if (outcome.list) {
      fmt::print("{}", outcome.request ? lattn::list_capabilities(outcome.request->plugins, &outcome.request->config)
                                       : lattn::list_capabilities());
      return 0;
    }
    if (!outcome.request) {
      fmt::print("{}", outcome.output);
      return 0;
    }
    if (outcome.request->list_cases) {
      fmt::print("{}", lattn::list_cases(*outcome.request));
      return 0;
    }
    return lattn::run_benchmarks(*outcome.request);
  } catch (const lattn::UsageError& e) {
    fmt::print(stderr, "lattnbench: error: {}\n", e.what());
    return 2;
  } catch (const lattn::EnvironmentError& e) {
    fmt::print(stderr, "lattnbench: error: {}\n", e.what());
    return 4;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lattnbench: internal error: {}\n", lattn::printable(e.what()));
    return 3;
  }
}

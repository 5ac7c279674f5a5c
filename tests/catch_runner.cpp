// Catch2's implementation, compiled once per build for every test executable (the library
// lattn_catch, tests/CMakeLists.txt), and the Session each executable's own main() runs through
// run_catch (Catch2 declares Session only where its implementation is compiled). Compiled into each
// executable, the implementation took longer than most of the test files themselves, once per
// executable and build.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_runner.hpp"

namespace lattn::test {

int run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }

}  // namespace lattn::test

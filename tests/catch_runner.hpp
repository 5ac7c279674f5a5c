// The test executables' Catch2 session (catch_runner.cpp, the library lattn_catch): a main() does
// what its executable needs first, then returns run_catch(argc, argv).
#pragma once

namespace lattn::test {

// Catch::Session().run(argc, argv): the number of failed test cases (capped at 255 by Catch).
int run_catch(int argc, char** argv);

}  // namespace lattn::test

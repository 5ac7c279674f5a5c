// The tests run in the environment the program runs in: lattnbench sets the OpenMP spin count and
// the OpenBLAS core at start-up (src/run/backend.hpp, prepare_process_environment), and a test process that did not
// would time and run the kernels differently (the in-process smoke run took ~100 s instead of ~13).
#include "catch_runner.hpp"

#include <cstdlib>

#include "src/run/backend.hpp"

int main(int argc, char** argv) {
  lattn::prepare_process_environment(argv);
  // The kernels' default choices in every lattnbench this process starts (backends/cpu/tuning.hpp):
  // no calibration, no cache read or written, the same choices on every machine. The tuning's own
  // tests say --tuning (which beats this) or unset it.
  ::setenv("LATTN_TUNING", "default", 1);
  return lattn::test::run_catch(argc, argv);
}

// The Catch2 main of the emulation tests. The device limit the run emulates comes from
// LATTN_EMU_SHARED_OPTIN (lattn_emu/control.hpp); it is printed so that a log says which.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "lattn_emu/control.hpp"

int main(int argc, char** argv) {
  std::printf("CUDA emulation: opt-in shared memory per block %zu bytes\n", lattn_emu::shared_optin_limit());
  return Catch::Session().run(argc, argv);
}

// The Catch2 main of the emulation tests, with --device-limit h100|a100|<bytes>: the opt-in
// shared memory per block of the emulated device (lattn_emu/control.hpp; LATTN_EMU_SHARED_OPTIN
// otherwise, else H100's). It must be fixed before the first launch, since the project's launch
// helpers read it once per process; CTest runs each group of tests once per limit.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "lattn_emu/control.hpp"

int main(int argc, char** argv) {
  Catch::Session session;
  std::string limit;
  session.cli(session.cli() | Catch::clara::Opt(limit, "h100|a100|bytes")["--device-limit"](
                                  "the emulated device's opt-in shared memory per block"));
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  if (limit == "h100")
    lattn_emu::set_shared_optin_limit(lattn_emu::kH100SharedOptin);
  else if (limit == "a100")
    lattn_emu::set_shared_optin_limit(lattn_emu::kA100SharedOptin);
  else if (!limit.empty())
    lattn_emu::set_shared_optin_limit(std::stoul(limit));
  std::printf("CUDA emulation: opt-in shared memory per block %zu bytes\n", lattn_emu::shared_optin_limit());
  return session.run();
}

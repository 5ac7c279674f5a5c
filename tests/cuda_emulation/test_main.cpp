// The Catch2 main of the emulation tests, with --device-limit h100|a100|<bytes>: the opt-in
// shared memory per block of the emulated device (lattn_emu/control.hpp; LATTN_EMU_SHARED_OPTIN
// otherwise, else H100's). It must be fixed before the first launch, since the project's launch
// helpers read it once per process; CTest runs each group of tests once per limit. The option is
// taken out of the arguments here; the rest go to Catch (tests/catch_runner.cpp).
#include <cstdio>
#include <string>
#include <vector>

#include "catch_runner.hpp"
#include "lattn_emu/control.hpp"

int main(int argc, char** argv) {
  std::vector<char*> args;
  std::string limit;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device-limit" && i + 1 < argc) {
      limit = argv[++i];
    } else if (arg.rfind("--device-limit=", 0) == 0) {
      limit = arg.substr(std::string("--device-limit=").size());
    } else {
      args.push_back(argv[i]);
    }
  }
  if (limit == "h100")
    lattn_emu::set_shared_optin_limit(lattn_emu::kH100SharedOptin);
  else if (limit == "a100")
    lattn_emu::set_shared_optin_limit(lattn_emu::kA100SharedOptin);
  else if (!limit.empty())
    lattn_emu::set_shared_optin_limit(std::stoul(limit));
  std::printf("CUDA emulation: opt-in shared memory per block %zu bytes\n", lattn_emu::shared_optin_limit());
  return lattn::test::run_catch(int(args.size()), args.data());
}

// Warp-synchronous calls: __syncwarp, the shuffles and the implicit barrier of the WMMA *_sync
// calls all meet here. The lanes of a mask meet at one round; a round completes when every lane
// of the mask has arrived, and each lane then reads the value its source lane deposited. What
// CUDA leaves undefined fails the launch instead: a mask without the caller's lane or with lanes
// the warp does not have, a shuffle reading a lane outside the mask, lanes of one mask meeting at
// different operations, and a lane that returns while the others wait for it.
#include <bit>
#include <cstdio>

#include "block_state.hpp"
#include "lattn_emu/device.hpp"

namespace lattn_emu {

namespace {
std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}
}  // namespace

int shuffle_source(const char* what, int lane, int target, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    device_fail(std::string(what) + ": width " + std::to_string(width) + " is not a power of two in 1..32");
  const int group = lane / width * width;
  return target >= group && target < group + width ? target : -1;
}

std::uint64_t warp_exchange(const char* what, unsigned mask, std::uint64_t value, int source) {
  using namespace detail;
  Grid* g = current_grid();
  if (!g) throw Error(std::string(what) + " outside a kernel");
  const unsigned thread = current_thread(), lane = thread % 32, bit = 1u << lane;
  Warp& w = *g->warps[thread / 32];
  std::unique_lock lock(g->mutex);
  if (g->aborted) throw Aborted{};
  auto fail = [&](const std::string& message) {
    abort_locked(*g, std::string(what) + ": " + message);
    throw Aborted{};
  };
  // WMMA and the full-mask calls name all 32 lanes; a block whose size is not a multiple of 32
  // has a partial last warp, which CUDA's masks must then leave out.
  if (!(mask & bit)) fail("mask " + hex(mask) + " does not contain the calling lane " + std::to_string(lane));
  if (mask & ~w.lanes)
    fail("mask " + hex(mask) + " names lanes this warp does not have (it has " + hex(w.lanes) + ")");
  if (mask & w.exited) fail("mask " + hex(mask) + " names lanes that have returned from the kernel");
  if (source >= 0 && !(mask & (1u << source)))
    fail("reads lane " + std::to_string(source) + ", which is not in the mask " + hex(mask));
  WarpRound& r = w.rounds[mask];
  if (r.arrived == 0)
    r.what = what;
  else if (std::string(r.what) != what)
    fail(std::string("lanes of mask ") + hex(mask) + " meet at different calls (" + r.what + " and " + what + ")");
  const std::uint64_t generation = r.generation;
  const int parity = int(generation & 1);
  r.values[parity][lane] = value;
  r.arrived |= bit;
  if (r.arrived == mask) {
    r.arrived = 0;
    ++r.generation;
    g->blocked -= unsigned(std::popcount(mask)) - 1;
    w.cv.notify_all();
  } else {
    wait_locked(*g, lock, w.cv, [&] { return r.generation != generation; }, what);
  }
  return source >= 0 ? r.values[parity][source] : 0;
}

}  // namespace lattn_emu

// Warp-synchronous calls: __syncwarp, the shuffles and the implicit barrier of the WMMA *_sync
// calls all meet here. The lanes of a mask meet at one round; a round completes when every lane
// of the mask has arrived, and each lane then reads the value its source lane deposited. What
// CUDA leaves undefined fails the launch instead: a mask without the caller's lane or with lanes
// the warp does not have, a shuffle reading a lane outside the mask, lanes of one mask meeting at
// different operations, and a lane that returns while the others wait for it. And the lanes'
// agreement on the WMMA calls each made on its own since they last met (note_wmma_call).
#include <bit>
#include <cstdint>
#include <cstdio>
#include <utility>

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

namespace detail {
namespace {
thread_local WmmaCalls t_wmma;
}  // namespace

WmmaCalls wmma_calls() { return t_wmma; }
void wmma_swap(WmmaCalls& other) { std::swap(t_wmma, other); }
void wmma_reset() { t_wmma = WmmaCalls{}; }

bool wmma_agree(Grid& g, unsigned warp, unsigned mask, const WmmaCalls* by_lane) {
  const int first = std::countr_zero(mask);
  for (unsigned rest = mask & (mask - 1); rest; rest &= rest - 1) {
    const int lane = std::countr_zero(rest);
    if (by_lane[lane] == by_lane[first]) continue;
    abort_locked(g, "lanes " + std::to_string(first) + " and " + std::to_string(lane) + " of warp " +
                        std::to_string(warp) + " made different WMMA calls (" + std::to_string(by_lane[first].count) +
                        " and " + std::to_string(by_lane[lane].count) +
                        " since the block started, or the same number of different ones): every lane of the "
                        "warp must make each one");
    return false;
  }
  return true;
}
}  // namespace detail

void note_wmma_call(const char* what) {
  if (const unsigned lanes = warp_lanes(); lanes != 0xffffffffu)
    device_fail(std::string(what) + ": a WMMA call needs all 32 lanes of the warp, and this warp does not have them "
                "(its lanes: " + hex(lanes) + ")");
  auto& c = detail::t_wmma;
  ++c.count;
  c.hash = (c.hash ^ reinterpret_cast<std::uintptr_t>(what)) * 0x100000001b3ull;
}

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
  const std::uint32_t generation = r.done.read();
  const int parity = int(generation & 1);
  r.values[parity][lane] = value;
  r.wmma[lane] = wmma_calls();
  r.arrived |= bit;
  if (r.arrived == mask) {
    if (!wmma_agree(*g, thread / 32, mask, r.wmma)) throw Aborted{};
    r.arrived = 0;
    g->blocked -= unsigned(std::popcount(mask)) - 1;
    r.done.bump();
  } else {
    // Released, the lane reads this round's deposits without the mutex: the lanes' next round
    // deposits into the other parity, and the one after needs this lane's arrival first.
    wait_unlocking(*g, lock, r.done, generation, what);
  }
  return source >= 0 ? r.values[parity][source] : 0;
}

}  // namespace lattn_emu

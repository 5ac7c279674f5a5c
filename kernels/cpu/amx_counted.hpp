// amx::Counted, the third tile policy beside amx::Emulated and amx::Hardware (kernels/cpu/amx.hpp):
// its tile operations do no arithmetic and only count what they execute, so that an AMX kernel runs
// on any CPU with its tile instructions taken out. Its time is then the kernel's work beside the
// tiles (packing, gating, widening, exp, solves), and its counts give the tile work's own time at
// the hardware's rate (one 16 x 16 x 32 tdpbf16ps is 2 x 16 x 16 x 32 flops).
//
// What each operation does:
//   load_config  ldtilecfg's checks (amx::config_error), the shapes kept for the byte counts;
//   load, zero   count (a load: its configured rows x bytes a row), read nothing;
//   dpbf16ps     count, compute nothing;
//   store        count, and write zeros over the configured rows: what follows then reads defined,
//                finite values (no NaN or denormal slowing the work beside the tiles), and the
//                stored bytes' memory traffic stays in the timing as the hardware's would.
// The outputs of a kernel on these tiles are therefore not its results: a case run on them is
// timed, never checked. Each thread counts on its own and adds into the process's totals when it
// releases its tiles (the kernels release once per thread per call), so totals() after a call is
// that call's once reset() ran before it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/amx.hpp"

namespace lattn::cpu::amx {

struct TileCounts {
  std::uint64_t dpbf16ps = 0;                   // tdpbf16ps executed
  std::uint64_t loads = 0, load_bytes = 0;      // tileloadd executed, and the bytes they would read
  std::uint64_t stores = 0, store_bytes = 0;    // tilestored executed, and the bytes they write
  std::uint64_t zeros = 0;                      // tilezero executed
  TileCounts& operator+=(const TileCounts& o) {
    dpbf16ps += o.dpbf16ps;
    loads += o.loads;
    load_bytes += o.load_bytes;
    stores += o.stores;
    store_bytes += o.store_bytes;
    zeros += o.zeros;
    return *this;
  }
};

// Flops of one tdpbf16ps on full tiles (16 rows, 32 bf16 of reduction, 16 columns): every
// tdpbf16ps of amx_gemm.hpp's kernels is one.
constexpr double kFlopsPerDpbf16ps = 2.0 * 16 * 16 * 32;

namespace counted {

struct ThreadTiles {
  TileConfig config;
  bool configured = false;
  TileCounts counts;
};
inline thread_local ThreadTiles thread_tiles;

struct Totals {
  std::atomic<std::uint64_t> dpbf16ps{0}, loads{0}, load_bytes{0}, stores{0}, store_bytes{0}, zeros{0};
};
inline Totals process_totals;

inline void load_config(const TileConfig& c) {
  if (const auto why = config_error(c)) throw std::logic_error("ldtilecfg (counted): " + *why);
  thread_tiles.config = c;
  thread_tiles.configured = true;
}

// This thread's counts into the process's totals.
inline void flush() {
  TileCounts& t = thread_tiles.counts;
  process_totals.dpbf16ps += t.dpbf16ps;
  process_totals.loads += t.loads;
  process_totals.load_bytes += t.load_bytes;
  process_totals.stores += t.stores;
  process_totals.store_bytes += t.store_bytes;
  process_totals.zeros += t.zeros;
  t = TileCounts{};
}

inline void release() {
  flush();
  thread_tiles.configured = false;
}

inline std::size_t tile_bytes(int tile) {
  if (!thread_tiles.configured) throw std::logic_error("counted tiles: no tile configuration loaded");
  return std::size_t(thread_tiles.config.rows[tile]) * thread_tiles.config.colsb[tile];
}

// The process's totals since the last reset (threads that still hold their tiles not included).
inline TileCounts totals() {
  TileCounts t;
  t.dpbf16ps = process_totals.dpbf16ps.load();
  t.loads = process_totals.loads.load();
  t.load_bytes = process_totals.load_bytes.load();
  t.stores = process_totals.stores.load();
  t.store_bytes = process_totals.store_bytes.load();
  t.zeros = process_totals.zeros.load();
  return t;
}

inline void reset() {
  for (auto* x : {&process_totals.dpbf16ps, &process_totals.loads, &process_totals.load_bytes, &process_totals.stores,
                  &process_totals.store_bytes, &process_totals.zeros})
    x->store(0);
}

}  // namespace counted

struct Counted {
  static constexpr const char* name = "counted";
  static void load_config(const TileConfig& c) { counted::load_config(c); }
  static void release() { counted::release(); }
  template <int T>
  static void load(const void*, std::size_t) {
    static_assert(T >= 0 && T < kTiles);
    ++counted::thread_tiles.counts.loads;
    counted::thread_tiles.counts.load_bytes += counted::tile_bytes(T);
  }
  template <int T>
  static void store(void* base, std::size_t stride) {
    static_assert(T >= 0 && T < kTiles);
    const TileConfig& c = counted::thread_tiles.config;
    const std::size_t bytes = counted::tile_bytes(T);
    for (int r = 0; r < c.rows[T]; ++r) std::memset(static_cast<char*>(base) + std::size_t(r) * stride, 0, c.colsb[T]);
    ++counted::thread_tiles.counts.stores;
    counted::thread_tiles.counts.store_bytes += bytes;
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < kTiles);
    ++counted::thread_tiles.counts.zeros;
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C != A && C != B && A != B, "tdpbf16ps takes three distinct tiles");
    ++counted::thread_tiles.counts.dpbf16ps;
  }
};

}  // namespace lattn::cpu::amx

// The state of one emulated launch that its threads share: which block runs, the block barrier,
// the warps' rendezvous, the block's shared memory, and the first error. One mutex guards all of
// it: the threads of a block meet only through these calls, so the emulation's own bookkeeping
// never races, and whatever ThreadSanitizer reports is a race in the emulated kernel.
// Internal to tests/cuda_emulation (block_runner.cpp, warp_sync.cpp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lattn_emu/launch.hpp"

namespace lattn_emu::detail {

// Thrown inside the threads of a block that another thread's error has aborted: it unwinds them
// out of the kernel; the launch reports the first error, not this.
struct Aborted {};

struct WarpRound {  // the lanes of one mask meeting at one warp-synchronous operation
  unsigned arrived = 0;
  std::uint64_t generation = 0;
  const char* what = nullptr;
  std::uint64_t values[2][32] = {};  // by generation parity: a lane may deposit for the next round
};                                   // while the others still read this one's

struct Warp {
  std::condition_variable cv;
  std::map<unsigned, WarpRound> rounds;  // by mask
  unsigned lanes = 0;                    // lanes present (a block's last warp may be partial)
  unsigned exited = 0;                   // lanes that returned from the kernel in this block
};

struct SharedSite {
  std::size_t align = 0;
  void* allocation = nullptr;  // storage is allocation + align (see static_shared_site)
  void* storage = nullptr;
};

struct Grid {
  const LaunchConfig* config = nullptr;
  const std::function<void()>* body = nullptr;
  unsigned threads = 0;
  std::size_t blocks = 0;

  std::mutex mutex;
  std::size_t block = 0;  // the running block, linear (x fastest)
  std::condition_variable block_cv;  // the block barrier, and the step to the next block
  unsigned arrived = 0;              // at the block barrier
  std::uint64_t barrier_generation = 0;
  unsigned exited = 0;   // threads that returned from the kernel in this block
  unsigned blocked = 0;  // threads waiting for others that have not arrived yet
  std::vector<std::unique_ptr<Warp>> warps;

  void* dynamic_allocation = nullptr;
  void* dynamic_shared = nullptr;  // dynamic_allocation + 128: 128-byte aligned, not 256
  std::map<const void*, SharedSite> sites;
  std::size_t static_shared_bytes = 0;

  bool aborted = false;
  std::string error;
};

// The grid and thread index of the calling host thread while it runs a kernel.
Grid* current_grid();
unsigned current_thread();

// Under g.mutex: records the first error (with where it happened) and wakes every waiting thread.
void abort_locked(Grid& g, const std::string& message);
// Under g.mutex: waits on `cv` until `released()`; a wait that leaves every thread of the block
// waiting is a deadlock and aborts the block. Whoever releases waiters takes them off g.blocked.
void wait_locked(Grid& g, std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 const std::function<bool()>& released, const char* what);
std::string where(const Grid& g, unsigned thread);

}  // namespace lattn_emu::detail

// The state of one emulated launch that its threads share: which block runs, the block barrier,
// the warps' rendezvous, the block's shared memory, and the first error. One mutex guards all of
// it: the threads of a block meet only through these calls, so the emulation's own bookkeeping
// never races, and whatever ThreadSanitizer reports is a race in the emulated kernel. A thread that
// waits for the others (at a barrier, a warp call, the next block) sleeps on a Signal, not on a
// condition variable: released, it goes on without taking the mutex again, so a barrier of 128
// threads costs one wake-up each rather than a convoy of 128 through the mutex.
// Internal to tests/cuda_emulation (block_runner.cpp, warp_sync.cpp).
#pragma once

#include <atomic>
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

// A counter threads wait on to change (C++20 atomic wait: a futex on Linux). Bumped with release
// order and read with acquire: what the bumping thread saw happens before what each released
// waiter does next (ThreadSanitizer sees the same edge).
struct Signal {
  std::atomic<std::uint32_t> value{0};
  std::uint32_t read() const { return value.load(std::memory_order_acquire); }
  void bump() {
    value.fetch_add(1, std::memory_order_release);
    value.notify_all();
  }
};

// A lane's WMMA calls since its block started (lattn_emu::note_wmma_call): how many, and a hash of
// which, in order.
struct WmmaCalls {
  std::uint64_t count = 0, hash = 0;
  bool operator==(const WmmaCalls&) const = default;
};

struct WarpRound {  // the lanes of one mask meeting at one warp-synchronous operation
  unsigned arrived = 0;
  WmmaCalls wmma[32];  // each lane's, as it arrived
  Signal done;  // bumped when every lane of the mask has arrived
  const char* what = nullptr;
  std::uint64_t values[2][32] = {};  // by generation parity: a lane may deposit for the next round
};                                   // while the others still read this one's

struct Warp {
  std::map<unsigned, WarpRound> rounds;  // by mask (nodes stay put: waiters hold references)
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
  Signal next_block;  // bumped when the next block starts (or the launch is aborted)
  Signal barrier;     // bumped when every thread has arrived at __syncthreads
  unsigned arrived = 0;  // at the block barrier
  unsigned exited = 0;   // threads that returned from the kernel in this block
  std::vector<WmmaCalls> wmma;  // per thread, as it arrived at the barrier or returned
  unsigned blocked = 0;  // threads waiting for others that have not arrived yet
  std::vector<std::unique_ptr<Warp>> warps;

  void* dynamic_allocation = nullptr;
  void* dynamic_shared = nullptr;  // dynamic_allocation + 128: 128-byte aligned, not 256
  std::map<const void*, SharedSite> sites;
  std::size_t static_shared_bytes = 0;

  std::atomic<bool> aborted{false};  // set under the mutex; read by released waiters without it
  std::string error;
};

// The grid and thread index of the calling host thread while it runs a kernel.
Grid* current_grid();
unsigned current_thread();

// Under g.mutex: records the first error (with where it happened) and wakes every waiting thread.
void abort_locked(Grid& g, const std::string& message);
// Waits (without g.mutex) until `signal` has moved on from `seen`: sleeping on it where each CUDA
// thread is a host thread, handing the host thread to the block's other CUDA threads where they
// are fibers (block_runner.cpp).
void wait_for_change(Signal& signal, std::uint32_t seen);
// Under g.mutex (which it releases): waits until `signal` has moved on from `seen`; a wait that
// leaves every thread of the block waiting is a deadlock and aborts the block. Whoever releases
// waiters takes them off g.blocked. Throws Aborted when the launch was aborted meanwhile.
void wait_unlocking(Grid& g, std::unique_lock<std::mutex>& lock, Signal& signal, std::uint32_t seen, const char* what);
std::string where(const Grid& g, unsigned thread);

// The calling thread's WMMA calls, and their reset when it starts a block.
WmmaCalls wmma_calls();
void wmma_reset();
void wmma_swap(WmmaCalls& other);  // with the calling host thread's (the fiber runner's turns)
// Under g.mutex: aborts the block (and returns false) unless the lanes of `mask` in warp `warp`
// agree on their WMMA calls (by_lane: indexed by lane).
bool wmma_agree(Grid& g, unsigned warp, unsigned mask, const WmmaCalls* by_lane);

}  // namespace lattn_emu::detail

// The execution model of the emulation: every CUDA thread of a block runs the kernel on its own
// stack, the blocks of a grid one after another, so that a missing barrier, or a thread reading
// what another has not written yet, changes the result (shared memory starts as NaN). Two runners:
//   threads  one host thread per CUDA thread, from a pool that lives as long as the process (a
//            launch does not pay for creating hundreds of threads), all of a block's running
//            concurrently: a race shows as a race under ThreadSanitizer. The default in builds
//            with a sanitizer (ThreadSanitizer and AddressSanitizer know nothing of fibers).
//   fibers   the CUDA threads of a block as fibers on the launching host thread (x86-64), each
//            running until it waits (a barrier, a warp call, the next block) and then handing on
//            to the next, in thread order: no system calls and no scheduler between them, several
//            times faster for kernels with many barriers; deterministic, so a thread that reads
//            what a later thread has not written yet always reads NaN. The default otherwise.
// LATTN_EMU_RUNNER=threads|fibers chooses. Here too: the block barrier, the block's shared
// memory, and what happens when a thread fails or returns.
#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <thread>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include "block_state.hpp"
#include "device_state.hpp"
#include "lattn_emu/device.hpp"
#include "pipeline_state.hpp"

// switch_stack(save, to): pushes the callee-saved registers and the SSE and x87 control words,
// stores the stack pointer in *save, takes `to` as the stack pointer and pops what a switch away
// from it pushed (System V x86-64: everything else is the caller's to save).
#if defined(__x86_64__)
#define LATTN_EMU_FIBERS 1
extern "C" void lattn_emu_switch_stack(void** save, void* to);
asm(R"(
  .text
  .globl lattn_emu_switch_stack
  .type lattn_emu_switch_stack, @function
lattn_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size lattn_emu_switch_stack, .-lattn_emu_switch_stack
)");
#endif

namespace lattn_emu {
namespace detail {
namespace {

thread_local Grid* t_grid = nullptr;
thread_local unsigned t_thread = 0;

constexpr std::size_t kDynamicAlign = 128;
constexpr unsigned char kNaNByte = 0xFF;  // 0xFF.. is a NaN as float, double and bf16 alike

// Host threads that run the CUDA threads of each block. Worker i always plays thread i.
class Pool {
 public:
  ~Pool() {
    for (auto& w : workers_) {
      {
        std::lock_guard lock(w->mutex);
        w->stop = true;
      }
      w->cv.notify_one();
      w->thread.join();
    }
  }

  // Runs job(i) for i = 0..n-1 on workers 0..n-1 and returns when all have finished.
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    while (workers_.size() < n) {
      auto w = std::make_unique<Worker>();
      Worker* raw = w.get();
      const unsigned index = unsigned(workers_.size());
      w->thread = std::thread([this, raw, index] { loop(*raw, index); });
      workers_.push_back(std::move(w));
    }
    {
      std::lock_guard lock(done_mutex_);
      remaining_ = n;
    }
    for (unsigned i = 0; i < n; ++i) {
      Worker& w = *workers_[i];
      {
        std::lock_guard lock(w.mutex);
        w.job = &job;
        ++w.posted;
      }
      w.cv.notify_one();
    }
    std::unique_lock lock(done_mutex_);
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex mutex;
    std::condition_variable cv;
    const std::function<void(unsigned)>* job = nullptr;
    std::uint64_t posted = 0;
    bool stop = false;
  };

  void loop(Worker& w, unsigned index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(unsigned)>* job = nullptr;
      {
        std::unique_lock lock(w.mutex);
        w.cv.wait(lock, [&] { return w.stop || w.posted != seen; });
        if (w.stop) return;
        seen = w.posted;
        job = w.job;
      }
      (*job)(index);
      std::lock_guard lock(done_mutex_);
      if (--remaining_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  unsigned remaining_ = 0;
};

Pool& pool() {
  static Pool p;
  return p;
}

// What each CUDA thread keeps thread_local (its registers, as it were), carried by a fiber between
// its turns on the one host thread.
struct LaneLocals {
  Grid* grid = nullptr;
  unsigned thread = 0;
  uint3 thread_idx{0, 0, 0}, block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  WmmaCalls wmma;
  Pipeline pipeline;
};

void swap_lane_locals(LaneLocals& l) {
  std::swap(t_grid, l.grid);
  std::swap(t_thread, l.thread);
  std::swap(threadIdx, l.thread_idx);
  std::swap(blockIdx, l.block_idx);
  std::swap(blockDim, l.block_dim);
  std::swap(gridDim, l.grid_dim);
  wmma_swap(l.wmma);
  pipeline_swap(l.pipeline);
}

#ifdef LATTN_EMU_FIBERS
// The CUDA threads of a launch as fibers on the launching host thread. Stacks (a guard page below
// each) are mapped once per lane index and kept for the process, like the pool's threads; their
// pages are committed only as a kernel touches them. A switch saves the callee-saved registers and
// the floating-point control words on the old stack and takes the new one (switch_stack, below):
// swapcontext would also save and restore the signal mask, a system call per switch, which cost
// more than the kernels themselves.
class Fibers {
 public:
  static constexpr std::size_t kStackBytes = std::size_t(2) << 20;  // a host thread's default is 8 MiB

  // Runs job(i) for i = 0..n-1, each on its own fiber, until all have returned.
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    while (lanes_.size() < n) lanes_.push_back(std::make_unique<Lane>(map_stack()));
    job_ = &job;
    for (unsigned i = 0; i < n; ++i) start(*lanes_[i]);
    Fibers* outer = std::exchange(t_fibers, this);
    for (unsigned live = n; live > 0;)
      for (unsigned i = 0; i < n; ++i) {
        Lane& l = *lanes_[i];
        if (l.done) continue;
        current_ = i;
        swap_lane_locals(l.locals);
        lattn_emu_switch_stack(&scheduler_sp_, l.sp);
        swap_lane_locals(l.locals);
        if (l.done) --live;
      }
    t_fibers = outer;
  }

  // From a fiber: back to the scheduler, which runs the others once before this one again.
  void yield() { lattn_emu_switch_stack(&lanes_[current_]->sp, scheduler_sp_); }

  // The runner of the calling host thread's fibers, while one of them runs (else null).
  static Fibers* running() { return t_fibers; }

 private:
  struct Lane {
    explicit Lane(unsigned char* s) : stack(s) {}
    unsigned char* stack;  // guard page, then kStackBytes
    void* sp = nullptr;    // where the fiber's registers were saved when it last switched away
    bool done = false;
    LaneLocals locals;
  };

  static std::size_t page() { return std::size_t(::sysconf(_SC_PAGESIZE)); }
  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "lattn_emu: %s failed in the fiber runner\n", what);
    std::abort();
  }
  static unsigned char* map_stack() {
    void* p = ::mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) fail("mmap of a fiber stack");
    if (::mprotect(p, page(), PROT_NONE) != 0) fail("mprotect of a fiber stack's guard page");
    return static_cast<unsigned char*>(p);
  }
  // The frame switch_stack pops on its first switch to the lane: the control words (the host
  // thread's current ones), six zeroed callee-saved registers, `entry` as the return address, and a
  // null return address above it that ends a backtrace. The top is 16-byte aligned; entry starts
  // 24 bytes below it, with the stack as a call leaves it (8 past a multiple of 16).
  void start(Lane& l) {
    l.done = false;
    auto* top = reinterpret_cast<std::uint64_t*>(l.stack + page() + kStackBytes);
    std::uint64_t* sp = top - 11;  // control words, 6 registers, entry, null, 2 words of padding
    std::uint32_t mxcsr;
    std::uint16_t fpu_cw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu_cw));
    sp[0] = mxcsr | (std::uint64_t(fpu_cw) << 32);
    for (int r = 1; r <= 6; ++r) sp[r] = 0;
    sp[7] = reinterpret_cast<std::uint64_t>(&Fibers::entry);
    sp[8] = sp[9] = sp[10] = 0;
    l.sp = sp;
  }
  // A fiber's first frame: run_thread catches what the kernel throws; nothing may unwind past here.
  [[noreturn]] static void entry() noexcept {
    Fibers& f = *t_fibers;
    (*f.job_)(f.current_);
    Lane& l = *f.lanes_[f.current_];
    l.done = true;
    lattn_emu_switch_stack(&l.sp, f.scheduler_sp_);
    fail("a finished fiber resumed");
  }

  static thread_local Fibers* t_fibers;
  std::vector<std::unique_ptr<Lane>> lanes_;
  void* scheduler_sp_ = nullptr;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned current_ = 0;
};

thread_local Fibers* Fibers::t_fibers = nullptr;
#endif

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

bool use_fibers() {
  static const bool fibers = [] {
    const char* chosen = std::getenv("LATTN_EMU_RUNNER");
    const std::string_view runner = chosen ? chosen : "";
#ifndef LATTN_EMU_FIBERS
    return false;  // the fiber switch is written for x86-64
#endif
    if (runner == "threads") return false;
    if (runner == "fibers") return true;
    if (!runner.empty()) std::fprintf(stderr, "lattn_emu: LATTN_EMU_RUNNER=%s is neither threads nor fibers; ignored\n", chosen);
    return !kSanitized;
  }();
  return fibers;
}

void run_lanes(unsigned n, const std::function<void(unsigned)>& job) {
#ifdef LATTN_EMU_FIBERS
  if (use_fibers()) {
    thread_local Fibers fibers;  // one runner per launching host thread (launches are serialised anyway)
    fibers.run(n, job);
    return;
  }
#endif
  pool().run(n, job);
}

uint3 index_of(std::size_t linear, dim3 extent) {
  const unsigned x = unsigned(linear % extent.x);
  linear /= extent.x;
  return uint3{x, unsigned(linear % extent.y), unsigned(linear / extent.y)};
}

void free_sites(Grid& g) {
  for (auto& [site, s] : g.sites) ::operator delete(s.allocation, std::align_val_t(2 * s.align));
  g.sites.clear();
  g.static_shared_bytes = 0;
}

// Under g.mutex: the state a block starts from. Shared memory is NaN bytes, so that a value read
// before any thread of this block wrote it shows in the result (nothing survives from the
// previous block, as nothing does on a GPU).
void start_block(Grid& g) {
  g.exited = 0;
  g.arrived = 0;
  for (auto& w : g.warps) {
    w->exited = 0;
    w->rounds.clear();
  }
  free_sites(g);
  if (g.dynamic_shared) std::memset(g.dynamic_shared, kNaNByte, g.config->shared);
}

// Under g.mutex: the calling thread has returned from the kernel in this block.
void leave_block(Grid& g, unsigned thread) {
  ++g.exited;
  g.wmma[thread] = wmma_calls();
  if (g.arrived > 0)
    abort_locked(g, "returned from the kernel while " + std::to_string(g.arrived) +
                        " threads of its block wait at __syncthreads (a barrier not every thread reaches)");
  Warp& w = *g.warps[thread / 32];
  const unsigned bit = 1u << (thread % 32);
  w.exited |= bit;
  if (w.exited == w.lanes && !wmma_agree(g, thread / 32, w.lanes, &g.wmma[thread / 32 * 32])) return;
  for (auto& [mask, round] : w.rounds)
    if (round.arrived != 0 && (mask & bit))
      abort_locked(g, "returned from the kernel while lanes of its warp wait for it at " + std::string(round.what));
}

void run_thread(Grid& g, unsigned thread) {
  t_grid = &g;
  t_thread = thread;
  const LaunchConfig& c = *g.config;
  blockDim = c.block;
  gridDim = c.grid;
  threadIdx = index_of(thread, c.block);
  std::unique_lock lock(g.mutex);
  while (!g.aborted && g.block < g.blocks) {
    const std::size_t block = g.block;
    blockIdx = index_of(block, c.grid);
    lock.unlock();
    try {
      pipeline_reset();
      wmma_reset();
      (*g.body)();
      if (const std::size_t pending = pipeline_pending())
        throw Error("returned from the kernel with " + std::to_string(pending) +
                    " cp.async copies it never waited for (__pipeline_wait_prior)");
      lock.lock();
    } catch (const Aborted&) {
      lock.lock();
    } catch (const std::exception& e) {
      lock.lock();
      abort_locked(g, e.what());
    } catch (...) {
      lock.lock();
      abort_locked(g, "an exception that is not a std::exception");
    }
    if (g.aborted) break;
    leave_block(g, thread);
    if (g.aborted) break;
    if (g.exited == g.threads) {
      ++g.block;
      if (g.block < g.blocks) start_block(g);
      g.next_block.bump();
    } else {
      const std::uint32_t seen = g.next_block.read();
      lock.unlock();
      wait_for_change(g.next_block, seen);
      lock.lock();
    }
  }
  t_grid = nullptr;
}

std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Grid* current_grid() { return t_grid; }
unsigned current_thread() { return t_thread; }

std::string where(const Grid& g, unsigned thread) {
  const uint3 b = index_of(g.block, g.config->grid), t = index_of(thread, g.config->block);
  return std::string(g.config->name) + " block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
         std::to_string(b.z) + ") thread (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," +
         std::to_string(t.z) + ")";
}

void abort_locked(Grid& g, const std::string& message) {
  if (!g.aborted) {
    g.error = where(g, t_thread) + ": " + message;
    g.aborted.store(true, std::memory_order_release);
  }
  // Every waiter wakes, sees the abort and unwinds.
  g.next_block.bump();
  g.barrier.bump();
  for (auto& w : g.warps)
    for (auto& [mask, round] : w->rounds) round.done.bump();
}

void wait_unlocking(Grid& g, std::unique_lock<std::mutex>& lock, Signal& signal, std::uint32_t seen, const char* what) {
  ++g.blocked;
  if (g.blocked + g.exited == g.threads) {
    abort_locked(g, std::string("deadlock at ") + what + ": every thread of the block waits (" +
                        std::to_string(g.arrived) + " at __syncthreads, " + std::to_string(g.exited) +
                        " returned, the others at warp-synchronous calls)");
    throw Aborted{};
  }
  lock.unlock();
  wait_for_change(signal, seen);
  if (g.aborted.load(std::memory_order_acquire)) throw Aborted{};
}

void wait_for_change(Signal& signal, std::uint32_t seen) {
#ifdef LATTN_EMU_FIBERS
  if (Fibers* fibers = Fibers::running()) {
    while (signal.read() == seen) fibers->yield();
    return;
  }
#endif
  while (signal.read() == seen) signal.value.wait(seen, std::memory_order_acquire);
}

}  // namespace detail

using detail::Grid;

void run_grid(const LaunchConfig& config, const std::function<void()>& thread_body) {
  detail::check_launch(config);
  const std::size_t blocks = std::size_t(config.grid.x) * config.grid.y * config.grid.z;
  const unsigned threads = config.block.x * config.block.y * config.block.z;
  std::lock_guard one_launch_at_a_time(detail::launch_mutex());
  Grid g;
  g.config = &config;
  g.body = &thread_body;
  g.threads = threads;
  g.blocks = blocks;
  g.wmma.resize(threads);
  for (unsigned w = 0; w * 32 < threads; ++w) {
    g.warps.push_back(std::make_unique<detail::Warp>());
    const unsigned lanes = std::min(32u, threads - w * 32);
    g.warps.back()->lanes = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  // The allocation ends where the launch's bytes end, so AddressSanitizer sees an access past them.
  if (config.shared) {
    g.dynamic_allocation = ::operator new(config.shared + detail::kDynamicAlign,
                                          std::align_val_t(2 * detail::kDynamicAlign));
    g.dynamic_shared = static_cast<unsigned char*>(g.dynamic_allocation) + detail::kDynamicAlign;
  }
  {
    std::lock_guard lock(g.mutex);
    detail::start_block(g);
  }
  detail::run_lanes(threads, [&](unsigned thread) { detail::run_thread(g, thread); });
  detail::free_sites(g);
  if (g.dynamic_allocation) ::operator delete(g.dynamic_allocation, std::align_val_t(2 * detail::kDynamicAlign));
  if (g.aborted) throw Error(g.error);
}

void device_fail(const std::string& message) { throw Error(message); }

unsigned lane_id() { return detail::current_thread() % 32; }

unsigned warp_lanes() {
  Grid* g = detail::current_grid();
  if (!g) throw Error("warp_lanes() outside a kernel");
  return g->warps[detail::current_thread() / 32]->lanes;
}

void sync_block() {
  Grid* g = detail::current_grid();
  if (!g) throw Error("__syncthreads() outside a kernel");
  std::unique_lock lock(g->mutex);
  if (g->aborted) throw detail::Aborted{};
  if (g->exited > 0) {
    detail::abort_locked(*g, "__syncthreads after " + std::to_string(g->exited) +
                                 " threads of the block returned from the kernel (a barrier not every thread reaches)");
    throw detail::Aborted{};
  }
  g->wmma[detail::current_thread()] = detail::wmma_calls();
  if (++g->arrived == g->threads) {
    for (unsigned w = 0; w < g->warps.size(); ++w)
      if (!detail::wmma_agree(*g, w, g->warps[w]->lanes, &g->wmma[w * 32])) throw detail::Aborted{};
    g->arrived = 0;
    g->blocked -= g->threads - 1;
    g->barrier.bump();
    return;
  }
  detail::wait_unlocking(*g, lock, g->barrier, g->barrier.read(), "__syncthreads");
}

void* dynamic_shared_memory(std::size_t align) {
  Grid* g = detail::current_grid();
  if (!g) throw Error("extern __shared__ memory outside a kernel");
  if (align > detail::kDynamicAlign)
    device_fail("extern __shared__ __align__(" + std::to_string(align) + "): the emulation provides 128");
  return g->dynamic_shared;  // null when the launch asked for none, as reading it is then an error
}

void* static_shared_site(const void* site, std::size_t bytes, std::size_t align) {
  Grid* g = detail::current_grid();
  if (!g) throw Error("__shared__ memory outside a kernel");
  std::lock_guard lock(g->mutex);
  auto it = g->sites.find(site);
  if (it == g->sites.end()) {
    const std::size_t total = g->static_shared_bytes + bytes;
    if (total > kDefaultSharedPerBlock || total + g->config->shared > shared_optin_limit()) {
      detail::abort_locked(*g, "static __shared__ memory of " + std::to_string(total) + " bytes (with " +
                                   std::to_string(g->config->shared) +
                                   " dynamic) is over the limits (48 KiB static, " +
                                   std::to_string(shared_optin_limit()) + " in all)");
      throw detail::Aborted{};
    }
    // Aligned to `align` but not to 2 * align; the allocation ends where the declaration's bytes
    // end, so AddressSanitizer sees an access past them.
    void* allocation = ::operator new(bytes + align, std::align_val_t(2 * align));
    void* storage = static_cast<unsigned char*>(allocation) + align;
    std::memset(storage, detail::kNaNByte, bytes);
    it = g->sites.emplace(site, detail::SharedSite{align, allocation, storage}).first;
    g->static_shared_bytes = total;
  }
  return it->second.storage;
}

}  // namespace lattn_emu

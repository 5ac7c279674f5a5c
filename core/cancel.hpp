// A request to stop the run (SIGINT or SIGTERM; src/run/interrupt.cpp's handler records it) that any
// long loop can poll without knowing where it came from: the harness between warm-up calls and
// samples, the float64 references between tokens and row blocks. It lives in core/ so that
// kernels/ can poll it without including src/. A loop that sees it ends early and its caller
// throws Interrupted, so a stop is answered within a fraction of a second wherever the run is.
#pragma once

#include <atomic>
#include <stdexcept>

namespace lattn {
namespace detail {
inline std::atomic<int> stop_signal{0};
// A lock-free atomic store is async-signal-safe, so the signal handler may set it.
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace detail

// Records that `signal` asked the run to stop (async-signal-safe).
inline void request_stop(int signal) noexcept { detail::stop_signal.store(signal, std::memory_order_relaxed); }
// The signal that asked to stop, or 0.
inline int stop_signal() noexcept { return detail::stop_signal.load(std::memory_order_relaxed); }
inline bool stop_requested() noexcept { return stop_signal() != 0; }
// For tests: forget a recorded request.
inline void clear_stop_request() noexcept { request_stop(0); }

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Throws Interrupted when a stop was asked for. Not inside an OpenMP region (an exception may not
// leave one): there a loop breaks on stop_requested() and the code after the region calls this.
inline void throw_if_stop_requested() {
  if (stop_requested()) throw Interrupted();
}

}  // namespace lattn

// The attainable rates of this machine that every CPU result is held against (docs/performance.md):
// OpenBLAS sgemm GFLOP/s and a streaming (triad) memory bandwidth, measured once per process
// with the run's threads, then cached.
#pragma once

#include <cstddef>

namespace lattn {

struct Roofline {
  int threads = 0;
  int sgemm_n = 0;                  // each thread multiplies its own n x n matrices
  double sgemm_gflops = 0;          // all threads together, best of the repetitions
  std::size_t stream_bytes = 0;     // bytes one triad pass moves (3 arrays), all threads
  double stream_gbytes_per_s = 0;   // best of the repetitions
};

// Measures on the first call (about a second), returns the cached figures after. `threads` is
// the OpenMP thread count of the run; OpenBLAS stays single-threaded inside each thread.
const Roofline& cpu_roofline(int threads);

}  // namespace lattn

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

// A short re-measurement of the same sgemm rate: the best of `products` products (each ~2 ms at
// n = 512). The runner takes one on each side of a case so that a record's rate can also be held
// against the peak of the same seconds: on a shared host the attainable rate moves by tens of
// percent from one minute to the next, and the start-up best-of-100 is its quietest moment.
double cpu_sgemm_check(int threads, int products);

}  // namespace lattn

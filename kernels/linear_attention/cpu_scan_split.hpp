// How the scan kernels share a problem's work among the OpenMP threads: items are (head, block of
// W state columns), since the columns of a state are independent in every pass of both rules.
#pragma once

#include <omp.h>

#include <algorithm>
#include <utility>

#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

struct Split {
  int dim;
  int width;   // columns per item
  int blocks;  // items per head
  long items;
  int threads;
};

// Items of `width` state columns.
inline Split scan_split(const Problem& p, int width) {
  Split s;
  s.dim = p.dim;
  s.width = width;
  s.blocks = (p.dim + s.width - 1) / s.width;
  s.items = long(p.heads_total()) * s.blocks;
  s.threads = int(std::max(1L, std::min<long>(omp_get_max_threads(), s.items)));
  return s;
}

// This thread's contiguous share of [0, n).
inline std::pair<long, long> share(long n) {
  const long nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

// Calls f(head, c0, c1) for each run of consecutive items in [first, last) that share a head.
template <class F>
void for_each_head_range(const Split& split, long first, long last, F&& f) {
  for (long item = first; item < last;) {
    const long bh = item / split.blocks;
    const long end = std::min(last, (bh + 1) * split.blocks);
    const int c0 = int(item % split.blocks) * split.width;
    const int c1 = std::min(int(end - bh * split.blocks) * split.width, split.dim);
    f(bh, c0, c1);
    item = end;
  }
}

// Runs f(head, c0, c1) over this thread's work inside a parallel region. With at least as many
// heads as threads, whole heads are handed out one at a time (dynamic: on a machine shared with
// other jobs, a thread that is descheduled for a time slice does not hold the others at the
// end); otherwise each thread takes a contiguous share of the (head, column block) items.
template <class F>
void for_each_share(const Split& split, F&& f) {
  const long heads = split.items / split.blocks;
  if (heads >= split.threads) {
#pragma omp for schedule(dynamic, 1) nowait
    for (long bh = 0; bh < heads; ++bh) for_each_head_range(split, bh * split.blocks, (bh + 1) * split.blocks, f);
  } else {
    const auto [first, last] = share(split.items);
    for_each_head_range(split, first, last, f);
  }
}

}  // namespace lattn::cpu

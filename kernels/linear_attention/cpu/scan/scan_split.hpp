// How the scan kernels share a problem's work among the OpenMP threads. A unit is a run of
// `members` consecutive slices of the problem (Problem::slice): one (sequence, value head) pair, or
// a group, the value heads of one sequence that share a q/k head, which one thread walks one after
// another so that it alone writes that q/k head's dq and dk. Items are (unit, block of state
// columns), since the columns of a state are independent in every pass of both rules.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

struct Split {
  long units = 0;
  int members = 1;  // slices per unit
  int blocks = 1;   // items per unit
  long items = 0;
  int threads = 1;
};

// `blocks` items in each unit of `members` slices.
inline Split scan_split(const Problem& p, int members, int blocks) {
  Split s;
  s.members = members;
  s.blocks = blocks;
  s.units = long(p.slices()) / members;
  s.items = s.units * blocks;
  s.threads = int(std::max(1L, std::min<long>(omp_get_max_threads(), s.items)));
  return s;
}

// Blocks of `width` columns over `columns`: how many.
inline int column_blocks(int columns, int width) { return (columns + width - 1) / width; }

// The columns [first, last) of blocks [b0, b1) of `width` columns, cut at `columns`.
struct Columns {
  int first, last;
};
inline Columns block_columns(int b0, int b1, int width, int columns) {
  return {std::min(b0 * width, columns), std::min(b1 * width, columns)};
}

// Calls f(unit, b0, b1) for each run of consecutive items in [first, last) that share a unit.
template <class F>
void for_each_unit_range(const Split& split, long first, long last, F&& f) {
  for (long item = first; item < last;) {
    const long unit = item / split.blocks;
    const long end = std::min(last, (unit + 1) * split.blocks);
    f(unit, int(item - unit * split.blocks), int(end - unit * split.blocks));
    item = end;
  }
}

// Runs f(unit, b0, b1) over this thread's work inside a parallel region. With at least as many
// units as threads, whole units are handed out one at a time (dynamic: on a machine shared with
// other jobs, a thread that is descheduled for a time slice does not hold the others at the
// end, and packed documents of unequal lengths even out); otherwise each thread takes a
// contiguous range of the (unit, column block) items holding its share of the tokens, so that
// one unit's columns are split and a long document's items are spread over more threads than a
// short one's.
template <class F>
void for_each_share(const Problem& p, const Split& split, F&& f) {
  if (split.units >= split.threads) {
#pragma omp for schedule(dynamic, 1) nowait
    for (long unit = 0; unit < split.units; ++unit) f(unit, 0, split.blocks);
    return;
  }
  // An item belongs to the thread whose share of the total holds the item's midpoint.
  const auto tokens = [&](long unit) { return std::int64_t(p.slice(std::size_t(unit) * split.members).seq); };
  std::int64_t total = 0;
  for (long unit = 0; unit < split.units; ++unit) total += tokens(unit) * split.blocks;
  const std::int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  long first = split.items, last = split.items;
  std::int64_t before = 0;
  for (long item = 0; item < split.items; ++item) {
    const std::int64_t w = tokens(item / split.blocks), mid = (2 * before + w) * nt;
    if (first == split.items && mid >= 2 * total * id) first = item;
    if (mid >= 2 * total * (id + 1)) {
      last = item;
      break;
    }
    before += w;
  }
  for_each_unit_range(split, std::min(first, last), last, f);
}

// A scan pass on `split`'s threads: each carves its own `per_thread` floats of one workspace
// (carve(floats) gives the pass's scratch) and runs f(scratch, unit, b0, b1) over its shares.
template <class Carve, class F>
void run_split(const Problem& p, const Split& split, std::size_t per_thread, Allocator& allocator, Carve&& carve,
               F&& f) {
  Workspace<float> floats(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
  {
    const auto scratch = carve(floats.data() + omp_get_thread_num() * per_thread);
    for_each_share(p, split, [&](long unit, int b0, int b1) { f(scratch, unit, b0, b1); });
  }
}

}  // namespace lattn::cpu

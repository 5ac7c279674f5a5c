// Sliding-window causal softmax attention on the CPU, float32, forward and backward (docs/spec.md section 2):
//   o_t = sum_{tau = max(0, t-W+1)}^{t} p_{t,tau} v_tau,   p_t = softmax(s q_t . k_tau),  s = D^-1/2
//
// Work is split into query blocks of Bq = 32 rows. The keys a block can see are one contiguous
// range of at most Bq + W - 1 rows, so a block's scores fit one Bq x (Bq + W - 1) tile: time and scratch
// are O(T * (W + Bq)), never T x T. A whole row's window is in the tile at once, so each row takes
// its exact maximum before the exponentials (no overflow) and keeps only its log-sum-exp for the
// backward, which recomputes P = exp(S - lse) instead of storing it.
//
// Backward, per block (dS = P . (dP - delta), delta_t = do_t . o_t):
//   dP = dO V^T,  dQ = s dS K,  dK += s dS^T Q,  dV += P^T dO
// dK and dV of a key gather from the W queries after it, which may lie in another thread's block.
// Each head is cut into segments of consecutive blocks (only as many as the threads need); a
// segment owns the dK/dV rows of its own queries and writes the rows before its start (at most
// W - 1) to a private spill, added in segment order once every segment is done: no atomics, and
// the sums' order depends on the segment count only, not on which thread ran what.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/sliding_window/cpu.hpp"
#include "kernels/cpu/tile_gemm.hpp"

namespace lattn::cpu {
namespace {

int query_block(const Problem& p) { return std::min(kWindowQueryBlock, p.seq); }
int blocks_per_head(const Problem& p) { return (p.seq + query_block(p) - 1) / query_block(p); }
// The widest key range of a block, so the score tile's leading dimension.
int max_keys(const Problem& p, int window) { return int(std::min<long>(p.seq, long(query_block(p)) + window - 1)); }

int threads_for(std::size_t tasks) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), std::max<std::size_t>(tasks, 1)));
}

// Segments per head in the backward: one unless there are fewer heads than threads.
int backward_segments(const Problem& p) {
  const std::size_t threads = std::size_t(omp_get_max_threads());
  const std::size_t wanted = (threads + p.heads_total() - 1) / p.heads_total();
  return int(std::clamp<std::size_t>(wanted, 1, std::size_t(blocks_per_head(p))));
}

// Keys before a segment's first query that it can reach.
std::size_t spill_rows(const Problem& p, int window) { return std::size_t(std::min<long>(long(window) - 1, p.seq)); }

// The row loops, kept as plain counted loops over a contiguous span so that they vectorise.
float row_max(const float* __restrict x, int n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; ++j) m = m > x[j] ? m : x[j];  // std::max here stays scalar (GCC 12)
  return m;
}

// x <- exp(x - shift); returns the sum.
float exp_shifted(float* __restrict x, int n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    x[j] = exp_nonpositive(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

void scale(float* __restrict x, int n, float factor) {
#pragma omp simd
  for (int j = 0; j < n; ++j) x[j] *= factor;
}

// P <- exp(S - lse), dS <- s P (dP - delta), over one row's window.
void softmax_backward_row(float* __restrict p, float* __restrict d, int n, float lse, float delta, float s) {
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    p[j] = exp_nonpositive(p[j] - lse);
    d[j] = s * p[j] * (d[j] - delta);  // s: the score scale, for both dQ and dK
  }
}

struct Block {
  int q0, n;  // query rows q0 .. q0 + n - 1
  int k0, L;  // key rows k0 .. k0 + L - 1 (all the block's rows can see)
};

Block block_at(const Problem& p, int window, int index) {
  Block b;
  b.q0 = index * query_block(p);
  b.n = std::min(query_block(p), p.seq - b.q0);
  b.k0 = std::max(0, b.q0 - window + 1);
  b.L = b.q0 + b.n - b.k0;
  return b;
}

// Row i of the block sees tile columns [first, last]: keys max(0, t - W + 1) .. t, t = q0 + i.
inline int first_column(const Block& b, int window, int i) { return std::max(0, b.q0 + i - window + 1) - b.k0; }
int last_column(const Block& b, int i) { return b.q0 + i - b.k0; }

#if defined(__AVX512F__)
// Where AVX-512 is compiled, the window's score products run on the register-tiled kernel of the
// chunked form (tile_gemm.hpp): a block's products are 32 x L x D and 32 x D x L (L <= 32 + W - 1),
// small enough that OpenBLAS's per-call packing of both operands and its small-matrix path ran
// them at ~0.4 of the sgemm peak (D = 64, W = 128). Every score element is the same FMA chain over
// d = 0 .. D-1 wherever its key sits in a tile, so the backward's exp(S - lse) here sees the very
// scores whose lse the forward kept (its blocks are not aligned as the forward's are).
// P = s Q K^T for the block's n queries (rows Q) against its L keys, K^T given as panels.
void panel_scores(const float* Q, const float* Ktp, const Block& b, int D, float s, float* P, int ld) {
  tile::Product scores;
  scores.M = b.n;
  scores.N = b.L;
  scores.c = P;
  scores.ldc = ld;
  scores.s1.range = tile::Range::full;
  scores.s1.K = D;
  scores.s1.a = Q;
  scores.s1.ars = D;
  scores.s1.acs = 1;
  scores.s1.b = Ktp;
  scores.alpha = s;
  tile::run(scores);
}

// The same from K's rows (packed into Ktp first), or dP = dO V^T with the same shapes.
void tiled_scores(const float* Q, const float* K, const Block& b, int D, float s, float* P, int ld, float* Ktp) {
  tile::pack(K, D, true, D, b.L, nullptr, Ktp);
  panel_scores(Q, Ktp, b, D, s, P, ld);
}
#else
// Never called: tiles_active() is false where AVX-512 is not compiled in.
void tiled_scores(const float*, const float*, const Block&, int, float, float*, int, float*) {
  throw std::logic_error("tiled_scores: built without AVX-512");
}
#endif

}  // namespace

// The tiled forward walks a head in groups of kGroupBlocks query blocks: K^T of the keys a group
// sees is packed once (the blocks' key ranges overlap by W - 1 rows, so packing per block moved
// each key ~5 times at W = 128 and the packing took a quarter of the kernel's time), and each
// block's key range starts at a multiple of 32 so that its K^T is whole panels of the group's
// (at most 31 extra, fully masked, score columns).
constexpr int kGroupBlocks = 8;
int group_count(const Problem& p) { return (blocks_per_head(p) + kGroupBlocks - 1) / kGroupBlocks; }
int align_down(int x) { return x / tile::kNR * tile::kNR; }
// The widest key range of an aligned block, and of a group.
int max_aligned_keys(const Problem& p, int window) { return std::min(p.seq, query_block(p) + window - 1 + tile::kNR - 1); }
int max_group_keys(const Problem& p, int window) {
  return std::min(p.seq, kGroupBlocks * query_block(p) + window - 1 + tile::kNR - 1);
}
// V is read in place when its rows are whole panels; otherwise the group's rows are copied to a
// row-major buffer with the width padded to a panel.
bool values_in_place(int D) { return D % tile::kNR == 0; }

// Per thread in the forward: the block's score tile, and with the register-tiled products also
// the rows' 1 / sum (applied to P V's rows rather than to P), the group's keys as panels of K^T and,
// unless V is read in place, its value rows.
std::size_t forward_thread_floats(const Problem& p, int window) {
  if (!tiles_active()) return std::size_t(query_block(p)) * max_keys(p, window);
  const std::size_t G = max_group_keys(p, window), PD = tile::panel_cols(p.dim);
  return std::size_t(query_block(p)) * (max_aligned_keys(p, window) + 1) +
         std::size_t(p.dim) * tile::panel_cols(int(G)) + (values_in_place(p.dim) ? 0 : G * PD);
}

std::size_t sliding_window_forward_workspace_bytes(const Problem& p, int window) {
  const std::size_t tasks = p.heads_total() * std::size_t(tiles_active() ? group_count(p) : blocks_per_head(p));
  return std::size_t(threads_for(tasks)) * forward_thread_floats(p, window) * sizeof(float);
}

// Per thread in the backward: the P and dS tiles, and with the register-tiled score products
// the panels of K^T (then V^T).
std::size_t backward_thread_floats(const Problem& p, int window) {
  const std::size_t L = max_keys(p, window), tiles = 2 * std::size_t(query_block(p)) * L;
  return tiles + (tiles_active() ? std::size_t(p.dim) * tile::panel_cols(int(L)) : 0);
}

std::size_t sliding_window_backward_workspace_bytes(const Problem& p, int window) {
  const int segments = backward_segments(p);
  const std::size_t tasks = p.heads_total() * std::size_t(segments);
  const std::size_t tiles = std::size_t(threads_for(tasks)) * backward_thread_floats(p, window);
  const std::size_t spills = segments > 1 ? tasks * 2 * spill_rows(p, window) * p.dim : 0;
  return (tiles + spills) * sizeof(float);
}

namespace {

// Row i of block b's score tile P (ld floats per row) -> its softmax, zero outside the window;
// keeps the row's log-sum-exp when `lse` is given. With `inv_sums`, the rows are left unnormalised
// (exp(s - max)) and their 1 / sum go there.
void softmax_rows(float* P, int ld, const Block& b, int window, float* lse, float* inv_sums = nullptr) {
  for (int i = 0; i < b.n; ++i) {
    float* row = P + std::size_t(i) * ld;
    const int lo = first_column(b, window, i), n = last_column(b, i) - lo + 1;
    const float m = row_max(row + lo, n);
    const float sum = exp_shifted(row + lo, n, m);
    if (inv_sums) inv_sums[i] = 1.0f / sum;
    else scale(row + lo, n, 1.0f / sum);
    std::fill(row, row + lo, 0.0f);
    std::fill(row + lo + n, row + b.L, 0.0f);
    if (lse) lse[b.q0 + i] = m + std::log(sum);
  }
}

void forward_blas(const Problem& p, int window, const SlidingWindowForwardArgs& a, Allocator& allocator) {
  const int D = p.dim, ld = max_keys(p, window), nb = blocks_per_head(p);
  const float s = float(attention_scale(D));
  const long tasks = long(p.heads_total()) * nb;
#pragma omp parallel num_threads(threads_for(std::size_t(tasks)))
  {
    Workspace<float> scratch(allocator, forward_thread_floats(p, window));
    float* P = scratch.data();
    // Dynamic: blocks are small and equal, and a thread that loses its core to other work then
    // delays only the blocks it holds.
#pragma omp for schedule(dynamic, 4)
    for (long task = 0; task < tasks; ++task) {
      const long bh = task / nb;
      const Block b = block_at(p, window, int(task % nb));
      const std::size_t head = std::size_t(bh) * p.head_token_elems();
      const float* Q = a.q + head + std::size_t(b.q0) * D;
      const float* K = a.k + head + std::size_t(b.k0) * D;
      const float* V = a.v + head + std::size_t(b.k0) * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b.n, b.L, D, s, Q, D, K, D, 0.0f, P, ld);
      softmax_rows(P, ld, b, window, a.lse ? a.lse + std::size_t(bh) * p.seq : nullptr);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b.n, D, b.L, 1.0f, P, ld, V, D, 0.0f,
                  a.o + head + std::size_t(b.q0) * D, D);
    }
  }
}

#if defined(__AVX512F__)
void forward_tiled(const Problem& p, int window, const SlidingWindowForwardArgs& a, Allocator& allocator) {
  const int D = p.dim, ld = max_aligned_keys(p, window), nb = blocks_per_head(p), groups = group_count(p);
  const int PD = tile::panel_cols(D);
  const bool in_place = values_in_place(D);
  const float s = float(attention_scale(D));
  const long tasks = long(p.heads_total()) * groups;
#pragma omp parallel num_threads(threads_for(std::size_t(tasks)))
  {
    Workspace<float> scratch(allocator, forward_thread_floats(p, window));
    float* P = scratch.data();
    float* inv_sums = P + std::size_t(query_block(p)) * ld;
    float* Ktp = inv_sums + query_block(p);
    float* Vrows = Ktp + std::size_t(D) * tile::panel_cols(max_group_keys(p, window));  // unless in place
#pragma omp for schedule(dynamic)  // as in forward_blas
    for (long task = 0; task < tasks; ++task) {
      const long bh = task / groups;
      const int first = int(task % groups) * kGroupBlocks, last = std::min(nb, first + kGroupBlocks);
      const std::size_t head = std::size_t(bh) * p.head_token_elems();
      // The group's keys: from the first block's aligned start to the last block's last query.
      const int g0 = align_down(block_at(p, window, first).k0);
      const Block end = block_at(p, window, last - 1);
      const int keys = end.q0 + end.n - g0;
      tile::pack(a.k + head + std::size_t(g0) * D, D, true, D, keys, nullptr, Ktp);
      const float* V = a.v + head;
      long vrs = D;
      int v0 = 0;  // V's row index of the operand's row 0
      if (!in_place) {
        for (int r = 0; r < keys; ++r) {
          std::copy_n(a.v + head + std::size_t(g0 + r) * D, D, Vrows + std::size_t(r) * PD);
          std::fill(Vrows + std::size_t(r) * PD + D, Vrows + std::size_t(r + 1) * PD, 0.0f);
        }
        V = Vrows;
        vrs = PD;
        v0 = g0;
      }
      for (int index = first; index < last; ++index) {
        Block b = block_at(p, window, index);
        b.k0 = align_down(b.k0);
        b.L = b.q0 + b.n - b.k0;
        panel_scores(a.q + head + std::size_t(b.q0) * D, Ktp + std::size_t((b.k0 - g0) / tile::kNR) * D * tile::kNR, b,
                     D, s, P, ld);
        softmax_rows(P, ld, b, window, a.lse ? a.lse + std::size_t(bh) * p.seq : nullptr, inv_sums);
        // O = diag(1 / sum) exp(S - max) V, each micro-tile's k range cut to its rows' windows
        // (keys q0 + i - W + 1 .. q0 + i, tile columns less k0): 135 of a block's 160 at W 128.
        tile::Product out;
        out.M = b.n;
        out.N = D;
        out.c = a.o + head + std::size_t(b.q0) * D;
        out.ldc = D;
        out.s1.range = tile::Range::band;
        out.s1.band_lo = b.q0 - window + 1 - b.k0;
        out.s1.band_hi = b.q0 - b.k0;
        out.s1.K = b.L;
        out.rs = inv_sums;
        out.s1.a = P;
        out.s1.ars = ld;
        out.s1.acs = 1;
        out.s1.b = V + std::size_t(b.k0 - v0) * vrs;
        out.s1.brs = vrs;
        tile::run(out);
      }
    }
  }
}
#else
void forward_tiled(const Problem&, int, const SlidingWindowForwardArgs&, Allocator&) {
  throw std::logic_error("forward_tiled: built without AVX-512");
}
#endif

}  // namespace

void sliding_window_forward(const Problem& p, int window, const SlidingWindowForwardArgs& a, Allocator& allocator) {
  if (tiles_active()) forward_tiled(p, window, a, allocator);
  else forward_blas(p, window, a, allocator);
}

void sliding_window_backward(const Problem& p, int window, const SlidingWindowBackwardArgs& a, Allocator& allocator) {
  const int D = p.dim, ld = max_keys(p, window), nb = blocks_per_head(p), segments = backward_segments(p);
  const bool tiled = tiles_active();
  const float s = float(attention_scale(D));
  const long tasks = long(p.heads_total()) * segments;
  const std::size_t spill = spill_rows(p, window), spill_elems = spill * D;
  Workspace<float> spills(allocator, segments > 1 ? std::size_t(tasks) * 2 * spill_elems : 0);
  // The first block of segment `seg` (blocks split as evenly as integers allow).
  auto segment_begin = [&](int seg) { return int(long(seg) * nb / segments); };

#pragma omp parallel num_threads(threads_for(std::size_t(tasks)))
  {
    Workspace<float> tiles(allocator, backward_thread_floats(p, window));
    float* P = tiles.data();
    float* dS = tiles.data() + std::size_t(query_block(p)) * ld;
    float* panels = dS + std::size_t(query_block(p)) * ld;  // tiled products only
#pragma omp for schedule(dynamic)
    for (long task = 0; task < tasks; ++task) {
      const long bh = task / segments;
      const int seg = int(task % segments);
      const std::size_t head = std::size_t(bh) * p.head_token_elems();
      const float *q = a.q + head, *k = a.k + head, *v = a.v + head, *o = a.o + head, *dO = a.dO + head;
      const float* lse = a.lse + std::size_t(bh) * p.seq;
      float *dq = a.dq + head, *dk = a.dk + head, *dv = a.dv + head;
      const int s0 = block_at(p, window, segment_begin(seg)).q0;
      const int s1 = seg + 1 < segments ? block_at(p, window, segment_begin(seg + 1)).q0 : p.seq;
      // Keys before s0 land in this task's spill, row (key - spill_base).
      const long spill_base = long(s0) - long(spill);
      float* spill_k = segments > 1 ? spills.data() + std::size_t(task) * 2 * spill_elems : nullptr;
      float* spill_v = spill_k ? spill_k + spill_elems : nullptr;
      if (spill_k) std::fill_n(spill_k, 2 * spill_elems, 0.0f);
      if (!a.accumulate) {
        std::fill(dk + std::size_t(s0) * D, dk + std::size_t(s1) * D, 0.0f);
        std::fill(dv + std::size_t(s0) * D, dv + std::size_t(s1) * D, 0.0f);
      }

      for (int index = segment_begin(seg); index < (seg + 1 < segments ? segment_begin(seg + 1) : nb); ++index) {
        const Block b = block_at(p, window, index);
        const float* Q = q + std::size_t(b.q0) * D;
        const float* dOb = dO + std::size_t(b.q0) * D;
        const float* K = k + std::size_t(b.k0) * D;
        const float* V = v + std::size_t(b.k0) * D;
        if (tiled) {
          tiled_scores(Q, K, b, D, s, P, ld, panels);
          tiled_scores(dOb, V, b, D, 1.0f, dS, ld, panels);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b.n, b.L, D, s, Q, D, K, D, 0.0f, P, ld);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b.n, b.L, D, 1.0f, dOb, D, V, D, 0.0f, dS, ld);
        }
        for (int i = 0; i < b.n; ++i) {
          float* __restrict prow = P + std::size_t(i) * ld;
          float* __restrict drow = dS + std::size_t(i) * ld;
          const int lo = first_column(b, window, i), n = last_column(b, i) - lo + 1;
          const float *oi = o + std::size_t(b.q0 + i) * D, *doi = dOb + std::size_t(i) * D;
          float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
          for (int j = 0; j < D; ++j) delta += oi[j] * doi[j];
          softmax_backward_row(prow + lo, drow + lo, n, lse[b.q0 + i], delta, s);
          std::fill(prow, prow + lo, 0.0f);
          std::fill(drow, drow + lo, 0.0f);
          std::fill(prow + lo + n, prow + b.L, 0.0f);
          std::fill(drow + lo + n, drow + b.L, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b.n, D, b.L, 1.0f, dS, ld, K, D,
                    a.accumulate ? 1.0f : 0.0f, dq + std::size_t(b.q0) * D, D);
        // Tile columns [0, split) are keys before the segment (the spill), [split, L) its own.
        const int split = std::clamp(s0 - b.k0, 0, b.L);
        if (split < b.L) {
          const std::size_t key = std::size_t(b.k0 + split) * D;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b.L - split, D, b.n, 1.0f, dS + split, ld, Q, D, 1.0f,
                      dk + key, D);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b.L - split, D, b.n, 1.0f, P + split, ld, dOb, D, 1.0f,
                      dv + key, D);
        }
        if (split > 0) {
          const std::size_t row = std::size_t(long(b.k0) - spill_base) * D;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, split, D, b.n, 1.0f, dS, ld, Q, D, 1.0f, spill_k + row, D);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, split, D, b.n, 1.0f, P, ld, dOb, D, 1.0f, spill_v + row, D);
        }
      }
    }

    if (segments > 1) {
#pragma omp for schedule(static)
      for (long bh = 0; bh < long(p.heads_total()); ++bh) {
        const std::size_t head = std::size_t(bh) * p.head_token_elems();
        for (int seg = 1; seg < segments; ++seg) {
          const long s0 = block_at(p, window, segment_begin(seg)).q0, base = s0 - long(spill);
          const float* spill_k = spills.data() + (std::size_t(bh) * segments + seg) * 2 * spill_elems;
          const float* spill_v = spill_k + spill_elems;
          for (long key = std::max(0L, base); key < s0; ++key)
            for (int j = 0; j < D; ++j) {
              a.dk[head + std::size_t(key) * D + j] += spill_k[std::size_t(key - base) * D + j];
              a.dv[head + std::size_t(key) * D + j] += spill_v[std::size_t(key - base) * D + j];
            }
        }
      }
    }
  }
}

}  // namespace lattn::cpu

// What the tiled chunked kernel's forward (cpu/chunked/chunked_tiled_forward.cpp) and backward
// (cpu/chunked/chunked_tiled_backward.cpp) share: how items or chunks split over threads, a sequence's
// chunk rows, the products' operands and state products, and the prefix over chunk states. Internal
// to those two files; inline, so that each file's inner loops inline them as before.
//
// Shapes (docs/spec.md section 1c): an item is one (sequence, value head) pair (Problem::slice);
// its q/k rows (Dk wide) are the value head's q/k head's, read in place, and its state is Dk x Dv,
// so Q K^T is n x Dk by Dk x n, Q S n x Dk by Dk x Dv, K^T V Dk x n by n x Dv, P V n x n by n x Dv.
// A packed document is its own sequence: its chunks start at its first token, and its last chunk
// is short (len - (chunks - 1) C rows) rather than padded, so a chunk never straddles two
// documents. That chunk's products take n rows as they are (the micro-tiles' tail rows and the
// panels' zero columns cover the remainder), so the cost of a short chunk is one chunk's fixed work
// (packing, the state transpose, tiles rounded up to 8 rows and 32 columns) per document, no
// padded tokens. Threads take whole items (a dense problem with fewer items than threads splits
// each item's chunks over them instead). Each thread's scratch is one contiguous block (closed form
// in chunked_tiled_*_floats, held by tests/run/test_memory.cpp and tests/kernels/test_chunked_shapes.cpp).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu::tiled {

using tile::panel_cols;

// Fewer items than threads in a dense problem: all threads work on one item at a time, split over
// its chunks (below). Otherwise each thread takes whole items and walks their chunks in order
// (packed documents always: theirs are many and short).
inline bool split_chunks(const Problem& p) {
  return !p.packed() && long(p.slices()) < omp_get_max_threads() && p.chunks() > 1;
}

inline int item_threads(const Problem& p) { return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())); }

// Grouped q/k heads, items over whole sequences: the forward's items are GradParts' (sequence, q/k
// head, part), each part's value heads walking the chunks side by side on one Q K^T.
inline bool shares_scores(const Problem& p) { return p.group() > 1 && !split_chunks(p); }

// The forward's shared items: as many value heads to an item as keeps every thread busy (more
// heads on one Q K^T ran faster: heads_k 1, heads 8, D 128, 2 threads, 8 heads to an item against
// 4 and 1: 0.90x and 0.78x the time in alternating runs).
inline GradParts forward_parts(const Problem& p) { return GradParts(p, omp_get_max_threads()); }

inline std::size_t forward_item_count(const Problem& p) {
  return shares_scores(p) ? forward_parts(p).items : p.slices();
}

inline int tiled_threads(const Problem& p) {
  if (split_chunks(p)) return std::min(omp_get_max_threads(), p.chunks());
  return shares_scores(p) ? int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), forward_item_count(p)))
                          : item_threads(p);
}

#if defined(__AVX512F__)
using tile::Product;
using tile::Range;
using tile::seg;

// Carves one thread's block into named buffers.
struct Carver {
  float* next;
  float* take(std::size_t n) {
    float* out = next;
    next += n;
    return out;
  }
};

// Powers gamma^0..gamma^C and the causal decay table M[i][j] = gamma^(i-j), 0 above the diagonal.
inline void decay_tables(float gamma, int C, float* pw, float* mask) {
  pw[0] = 1.0f;
  for (int i = 1; i <= C; ++i) pw[i] = float(std::pow(double(gamma), double(i)));
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) mask[std::size_t(i) * C + j] = j <= i ? pw[i - j] : 0.0f;
}

// Row-major n x D chunk rows are a B operand in place when D is exactly one 32-wide panel (rows
// 128 bytes apart: the panel is contiguous). Wider, a panel's rows are D * 4 bytes apart and
// crowd L1 sets; packed was faster already at D = 64 (one core: ~85 against ~70 GFLOP/s).
inline bool rows_in_place(int D) { return D == tile::kNR; }

// A B operand of the products: packed panels (brs = 0) or row-major rows in place (brs their stride).
struct Operand {
  const float* b;
  long brs;
};

// B = the n x D rows X: in place, or packed into Xp.
inline Operand rows_operand(const float* X, int n, int D, float* Xp) {
  if (rows_in_place(D)) return {X, D};
  tile::pack(X, D, false, n, D, nullptr, Xp);
  return {Xp, 0};
}

// The next chunk's rows of q, k (qk_floats long), v and dO (v_floats long), for this chunk's
// products to prefetch while they compute: a chunk's products are compute-bound and its first
// reads of its rows memory-bound, and the hardware prefetchers did not overlap the two (seq 8192,
// 2 threads: chunked fwd 8% faster at D 128, 20% at D 64, alternating runs). In the backward's
// reverse walk (the chunk before): 2 threads 1.03-1.18x in two A/B runs of 5 and 6 rounds, 1
// thread 0.91-1.10x, within the noise there.
struct NextRows {
  const float *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  std::size_t qk_floats = 0, v_floats = 0;
};

inline void prefetch_into(Product& u, const float* rows, std::size_t floats) {
  u.prefetch = rows;
  u.prefetch_floats = rows ? floats : 0;
}

// The widths of one problem: key (q, k) rows Dk, value (v, o, dO) rows Dv.
struct Dims {
  int Dk, Dv, C;
};

inline Dims dims_of(const Problem& p) { return {p.dim, p.value_dim(), effective_chunk(p)}; }

// Y = beta Y + alpha X^T Z for chunk rows X (n x Dk) and Z (an operand of n x Dv rows), Y a packed
// Dk x Dv state: the chunk's contribution to S (X = K, Z = V) or to dS (X = Q, Z = dO); prefetches
// `next` (floats long) if given.
inline void state_product(float* Yp, const Dims& d, int n, const float* X, Operand Z, float alpha, float beta,
                          const float* next = nullptr, std::size_t next_floats = 0) {
  Product u;
  prefetch_into(u, next, next_floats);
  u.M = d.Dk;
  u.N = d.Dv;
  u.c = Yp;
  u.ldc = tile::kNR;
  u.cps = long(d.Dk) * tile::kNR;
  u.beta = beta;
  u.alpha = alpha;
  u.s1 = seg(Range::full, n, X, 1, d.Dk, Z.b, Z.brs);
  tile::run(u);
}

// The same with Z's rows weighted by w (diag(w) Z) when w is given; Zp: scratch panels of n x Dv.
inline void state_product(float* Yp, const Dims& d, int n, const float* X, const float* Z, const float* w, float alpha,
                          float beta, float* Zp, const float* next = nullptr, std::size_t next_floats = 0) {
  Operand B{Zp, 0};
  if (w) tile::pack(Z, d.Dv, false, n, d.Dv, w, Zp);
  else B = rows_operand(Z, n, d.Dv, Zp);
  state_product(Yp, d, n, X, B, alpha, beta, next, next_floats);
}

// A chunk of one item: its rows and where they start in the item's key (q, k) and value (v, o)
// rows. Chunk c of a sequence of len rows starts at c C; the last has len - c C <= C rows.
struct ChunkRows {
  int n;
  std::size_t rk, rv;
};

inline ChunkRows chunk_rows(const Dims& d, int len, int c) {
  const int c0 = c * d.C;
  return {std::min(d.C, len - c0), std::size_t(c0) * d.Dk, std::size_t(c0) * d.Dv};
}

// An item's value head: its slice and gamma, and whether it decays; fills the powers of gamma and
// the decay mask (decay_tables) into pw and mask.
struct ItemHead {
  HeadSlice sl;
  float gamma;
  bool decay;
};

inline ItemHead item_head(const Problem& p, std::size_t item, const Dims& d, float* pw, float* mask) {
  const HeadSlice sl = p.slice(item);
  const float gamma = float(decay_gamma(p.decay, sl.head));
  decay_tables(gamma, d.C, pw, mask);
  return {sl, gamma, gamma != 1.0f};
}

// A split over chunks' shared blocks from `base` on: the running state, the states entering the
// chunks when not kept (own), then the threads' blocks.
struct SplitBlocks {
  float *run, *own_states, *threads;
};

inline SplitBlocks split_blocks(float* base, int chunks, std::size_t SF, bool kept) {
  float* own_states = kept ? nullptr : base + SF;
  return {base, own_states, kept ? base + SF : own_states + chunks * SF};
}

// lam_i = scale gamma^(i+1), gam_j = gamma^(n-1-j) for a chunk of n rows.
inline void chunk_weights(const float* pw, int n, float scale, float* lam, float* gam) {
  for (int i = 0; i < n; ++i) {
    lam[i] = scale * pw[i + 1];
    gam[i] = pw[n - 1 - i];
  }
}

// Walks elements [e0, e1) of the packed chunk states in order (reverse: last chunk first):
// each holds a chunk's own contribution on entry and the running state entering it (leaving it,
// in reverse) on exit; run starts as the initial state and ends as the final one.
inline void prefix_states(const Problem& p, float gamma, float* chunk_states, float* run, std::size_t e0, std::size_t e1,
                          bool reverse) {
  const std::size_t stride = key_state_floats(p);
  const Dims d = dims_of(p);
  const int chunks = p.chunks();
  for (int step = 0; step < chunks; ++step) {
    const int c = reverse ? chunks - 1 - step : step;
    const float decay = float(std::pow(double(gamma), double(chunk_rows(d, p.seq, c).n)));
    float* own = chunk_states + c * stride;
    for (std::size_t e = e0; e < e1; ++e) {
      const float u = own[e];
      own[e] = run[e];
      run[e] = decay * run[e] + u;
    }
  }
}

// This thread's share of [0, n).
inline std::pair<std::size_t, std::size_t> share(std::size_t n) {
  const std::size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

// The order list (packed problems) sits at the workspace's end.
inline int* order_list(float* scratch, std::size_t total, std::size_t floats) {
  return floats ? reinterpret_cast<int*>(scratch + (total - floats)) : nullptr;
}
#endif

}  // namespace lattn::cpu::tiled

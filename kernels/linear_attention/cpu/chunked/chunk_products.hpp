// Helpers the chunked forms with gates and with the delta rule share: products on the tile kernels
// (tile_gemm.hpp) in the shapes a chunk needs, and the elementwise loops on the gates' factors.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu {

// The rows of a full chunk: a chunk longer than the sequence is one chunk of seq rows.
inline int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }

// Floats of one packed D x P(D) state.
inline std::size_t state_floats(const Problem& p) { return std::size_t(p.dim) * tile::panel_cols(p.dim); }

// ---- The shapes of docs/spec.md section 1c for the additive rule's chunked kernels ----
// Items are (sequence, value head) pairs (Problem::slice). A sequence (a packed document) of len
// rows has ceil(len / C) chunks, the last of len - (chunks - 1) C rows; nothing is padded.

// Floats of one packed Dk x Dv state (S, dS: Dk rows, panels of Dv columns) and of its transpose.
inline std::size_t key_state_floats(const Problem& p) { return std::size_t(p.dim) * tile::panel_cols(p.value_dim()); }
inline std::size_t value_state_floats(const Problem& p) { return std::size_t(p.value_dim()) * tile::panel_cols(p.dim); }

inline int chunks_of(const Problem& p, int len) {
  const int C = effective_chunk(p);
  return (len + C - 1) / C;
}

inline int sequence_length(const Problem& p, int n) {
  return p.packed() ? p.cu_seqlens[std::size_t(n) + 1] - p.cu_seqlens[std::size_t(n)] : p.seq;
}

// Chunks of the longest sequence: what a per-thread buffer of one item's chunk states holds.
inline int max_chunks(const Problem& p) {
  int most = 0;
  for (int n = 0; n < p.sequences(); ++n) most = std::max(most, chunks_of(p, sequence_length(p, n)));
  return most;
}

// The chunk states of every item, item-major (the kept states' count), and where item i's begin.
inline std::size_t item_chunks(const Problem& p) {
  std::size_t total = 0;
  for (int n = 0; n < p.sequences(); ++n) total += std::size_t(chunks_of(p, sequence_length(p, n)));
  return total * p.heads;
}
inline std::size_t item_chunk_offset(const Problem& p, std::size_t item) {
  const int n = int(item / p.heads), h = int(item % p.heads);
  if (!p.packed()) return item * chunks_of(p, p.seq);
  std::size_t before = 0;
  for (int m = 0; m < n; ++m) before += std::size_t(chunks_of(p, sequence_length(p, m)));
  return before * p.heads + std::size_t(h) * chunks_of(p, sequence_length(p, n));
}

// The order threads take a packed problem's items in: longest documents first, so that no long
// document is taken last and runs alone at the end (in document order, a long last document's
// items started when the rest were nearly done: up to 1.25x the equal-length batch's time at
// varlen 32768 64 8192). Item i belongs to sequence i / per_sequence. Dense problems take their
// items in index order and need no list: order_floats is 0 for them.
inline std::size_t order_floats(const Problem& p, std::size_t items) {
  static_assert(sizeof(int) == sizeof(float), "the order list lives in float scratch");
  return p.packed() ? items : 0;
}
inline void longest_first(const Problem& p, std::size_t items, std::size_t per_sequence, int* order) {
  if (!p.packed()) return;
  for (std::size_t i = 0; i < items; ++i) order[i] = int(i);
  std::sort(order, order + items, [&](int a, int b) {
    const int la = sequence_length(p, int(std::size_t(a) / per_sequence));
    const int lb = sequence_length(p, int(std::size_t(b) / per_sequence));
    return la != lb ? la > lb : a < b;
  });
}
// The item a thread's i-th pick stands for.
inline std::size_t item_at(const int* order, long i) { return order ? std::size_t(order[i]) : std::size_t(i); }

// The backward's dq and dk of a q/k head sum over the group's value heads. Its items are (sequence,
// q/k head, part): a part's value heads run in order on one thread, the first writing the rows and
// the rest adding to them. With fewer (sequence, q/k head) pairs than threads, each group splits
// into `parts` parts so that every thread has one: part 0 writes dq and dk, part j > 0 its own
// partial copy of both (2 (parts - 1) key tensors of scratch), which a last pass adds in.
struct GradParts {
  int parts = 1;
  std::size_t items = 0;  // sequences x q/k heads x parts

  GradParts(const Problem& p, int threads) {
    const std::size_t pairs = std::size_t(p.sequences()) * p.qk_heads();
    if (p.group() > 1 && pairs < std::size_t(threads))
      parts = int(std::min<std::size_t>(std::size_t(p.group()), (std::size_t(threads) + pairs - 1) / pairs));
    items = pairs * parts;
  }
  std::size_t partial_floats(const Problem& p) const { return 2 * std::size_t(parts - 1) * p.key_elems(); }
  std::size_t per_sequence(const Problem& p) const { return std::size_t(p.qk_heads()) * parts; }
  // Item i's sequence, q/k head and value heads [h0, h1).
  void of(const Problem& p, std::size_t item, int& sequence, int& h0, int& h1) const {
    const int part = int(item % parts), pair = int(item / parts), G = p.group();
    sequence = pair / p.qk_heads();
    const int hk = pair % p.qk_heads();
    h0 = hk * G + part * G / parts;
    h1 = hk * G + (part + 1) * G / parts;
  }
  // Runs heads(sequence, h0, h1) on this thread's items, taken in `order` (item_at) one at a time
  // as threads free up. Called inside a parallel region, by every thread.
  template <class Heads>
  void for_items(const Problem& p, const int* order, Heads heads) const {
#pragma omp for schedule(dynamic, 1)
    for (long pick = 0; pick < long(items); ++pick) {
      int sequence, h0, h1;
      of(p, item_at(order, pick), sequence, h0, h1);
      heads(sequence, h0, h1);
    }
  }
  // A backward item: its sequence, its value heads [h0, h1), and the dq and dk they write: the
  // outputs for part 0, the part's partial copies (dq's, then dk's, each key_elems) otherwise.
  struct Item {
    int sequence = 0, h0 = 0, h1 = 0;
    float *dq = nullptr, *dk = nullptr;
  };
  Item item(const Problem& p, std::size_t i, float* dq, float* dk, float* partials) const {
    Item it;
    of(p, i, it.sequence, it.h0, it.h1);
    const int part = int(i % parts);
    it.dq = part == 0 ? dq : partials + 2 * std::size_t(part - 1) * p.key_elems();
    it.dk = part == 0 ? dk : partials + (2 * std::size_t(part - 1) + 1) * p.key_elems();
    return it;
  }
  // Adds the partial copies into dq and dk: called inside a parallel region, by every thread.
  void reduce(const Problem& p, float* dq, float* dk, const float* partials) const {
    if (parts == 1) return;
    const std::size_t E = p.key_elems();
#pragma omp for schedule(static)
    for (long e = 0; e < long(E); ++e) {
      float x = dq[e], y = dk[e];
      for (int j = 1; j < parts; ++j) {
        x += partials[2 * std::size_t(j - 1) * E + e];
        y += partials[(2 * std::size_t(j - 1) + 1) * E + e];
      }
      dq[e] = x;
      dk[e] = y;
    }
  }
};

// Lays one thread's buffers out one after another from base; with base null it only counts. The
// thread's block is floats() long: rounded up to a cache line (16 floats), so that each thread's
// block starts on one and its doubles stay aligned.
struct BlockCarver {
  float* base = nullptr;
  std::size_t used = 0;
  float* take(std::size_t n) {
    float* out = base ? base + used : nullptr;
    used += n;
    return out;
  }
  double* take_doubles(std::size_t n) { return reinterpret_cast<double*>(take(2 * n)); }
  std::size_t floats() const { return (used + 15) / 16 * 16; }
};

// The leading dimension of a chunk's C x C score tiles, as the tiled kernel's: transposes read
// down columns.
inline int score_ld(int C) { return C + 16; }

// The 0/1 lower-triangular C x C mask (ld score_ld(C)) that products apply where no decay weighs
// the scores.
inline void fill_lower_ones(float* ones, int C) {
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) ones[std::size_t(i) * score_ld(C) + j] = j <= i ? 1.0f : 0.0f;
}

// An M x N row-major product into c (ld ldc).
inline tile::Product rows_product(float* c, long ldc, int M, int N, tile::Segment s1, float alpha = 1.0f) {
  tile::Product u;
  u.M = M;
  u.N = N;
  u.c = c;
  u.ldc = ldc;
  u.s1 = s1;
  u.alpha = alpha;
  return u;
}

// Y = beta Y + alpha X^T Z for a packed Dk x Dv state Y, X (n x Dk rows), Z packed n x Dv panels.
inline void state_product(float* Yp, int Dk, int Dv, int n, const float* X, const float* Zp, float alpha, float beta) {
  tile::Product u = rows_product(Yp, tile::kNR, Dk, Dv, tile::seg(tile::Range::full, n, X, 1, Dk, Zp), alpha);
  u.cps = long(Dk) * tile::kNR;
  u.beta = beta;
  tile::run(u);
}
inline void state_product(float* Yp, int D, int n, const float* X, const float* Zp, float alpha, float beta) {
  state_product(Yp, D, D, n, X, Zp, alpha, beta);
}

// Row d of a packed Dk x Dv state times w[d].
inline void scale_state_rows(float* Yp, int Dk, int Dv, const float* w) {
  for (int panel = 0; panel < tile::panel_cols(Dv) / tile::kNR; ++panel)
    for (int d = 0; d < Dk; ++d) {
      float* row = Yp + (std::size_t(panel) * Dk + d) * tile::kNR;
#pragma omp simd
      for (int j = 0; j < tile::kNR; ++j) row[j] *= w[d];
    }
}
inline void scale_state_rows(float* Yp, int D, const float* w) { scale_state_rows(Yp, D, D, w); }

// The loops below keep to forms GCC vectorises: one statement kind per loop, contiguous floats.
// x[d] = exp(x[d]) for x <= 0.
inline void exp_in_place(float* __restrict x, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) x[d] = exp_nonpositive(x[d]);
}

// Scalar gates' row factors and mask for a chunk of n rows from their cumulative log-gates b (last:
// b[n - 1]): EQ_i = exp(b_i), EK_i = exp(last - b_i), and mask row i (ld L) exp(b_i - b_m) for
// m <= i, zero on to column C.
inline void scalar_gate_rows(const double* b, double last, int n, int C, int L, float* EQ, float* EK, float* mask) {
  for (int i = 0; i < n; ++i) {
    EQ[i] = exp_nonpositive(float(b[i]));
    EK[i] = exp_nonpositive(float(last - b[i]));
    float* row = mask + std::size_t(i) * L;
    const double bi = b[i];
#pragma omp simd
    for (int m = 0; m <= i; ++m) row[m] = float(bi - b[m]);
    exp_in_place(row, i + 1);
    std::fill(row + i + 1, row + C, 0.0f);
  }
}

// out[d] = exp(a[d] - b[d]) (b null: exp(a[d])), the difference taken in double.
inline void exp_of_difference(float* __restrict out, const double* a, const double* b, int n) {
  if (b) {
#pragma omp simd
    for (int d = 0; d < n; ++d) out[d] = float(a[d] - b[d]);
  } else {
#pragma omp simd
    for (int d = 0; d < n; ++d) out[d] = float(a[d]);
  }
  exp_in_place(out, n);
}

// Rows a lane_scores call takes at once: two zmm (four ymm) of sums per source.
constexpr int kLaneRows = 32;

// A gated chunk's scores with the rows in the lanes. For rows [i0, i1) (at most kLaneRows) and the
// columns m from i1 - 1 down to m0, with m <= i:
//   out[s][i][m] = alpha[s] sum_d x[s]_id k_md prod_{l = m+1 .. i} a_ld
// for each source s (q for A_qk; k too for the delta rule's A_kk). lanes[s][d][i - i0] holds
// x[s]_id times the product of a_d down to the column being made, so a column is D multiply-adds of
// a broadcast k_md for all the rows at once: no horizontal sum per pair (summing each pair's dot
// product by hand needs one, and that bounded the by-hand scores). Row m joins the lanes at column
// m; lanes of rows above the diagonal are computed and not stored. a holds exp(g) per row and
// channel, each factor <= 1, so the running products only shrink. lanes: S x D x kLaneRows floats.
template <int S>
void lane_scores(int D, int i0, int i1, int m0, const float* k, const float* a, const float* const (&x)[S],
                 const float (&alpha)[S], float* const (&out)[S], long ld, float* lanes) {
  constexpr int R = kLaneRows;
  std::fill_n(lanes, std::size_t(S) * D * R, 0.0f);
  for (int m = i1 - 1; m >= m0; --m) {
    if (m >= i0)
      for (int s = 0; s < S; ++s)
        for (int d = 0; d < D; ++d) lanes[(std::size_t(s) * D + d) * R + (m - i0)] = x[s][std::size_t(m) * D + d];
    const float* km = k + std::size_t(m) * D;
    const float* am = a + std::size_t(m) * D;
    alignas(64) float acc[S][R] = {};
    for (int d = 0; d < D; ++d) {
      const float kd = km[d], ad = am[d];
      for (int s = 0; s < S; ++s) {
        float* __restrict row = lanes + (std::size_t(s) * D + d) * R;
        float* __restrict sum = acc[s];
#pragma omp simd
        for (int r = 0; r < R; ++r) sum[r] += row[r] * kd;
#pragma omp simd
        for (int r = 0; r < R; ++r) row[r] *= ad;
      }
    }
    for (int s = 0; s < S; ++s)
      for (int i = std::max(m, i0); i < i1; ++i) out[s][std::size_t(i) * ld + m] = alpha[s] * acc[s][i - i0];
  }
}

// Vector gates' scores between sub-chunks (the gated form's secondary chunking): for each sub-chunk
// I > 0 of kGateSubChunk rows (rows i0 .. i1 - 1 of n), with r_I = b at row i0 - 1 and e_J = b at
// sub-chunk J's last row, the packed Kb^T of every J < I scaled by f_IJ = exp(r_I - e_J) (a factor
// <= 1), then out[s] rows i0 .. i1 - 1, columns < i0, = alpha[s] x[s] (Kb f)^T, one tile product
// per source sharing the packing. x[s] = X . exp(b - r_I) and Kb = K . exp(e_J - b) row by row, so
// every factor of exp(b_i - b_m) stays <= 1. b: the cumulative gates, n x D doubles; f: D floats;
// Bp: D x P(n) floats of panels.
template <int S>
void subchunk_scores(int D, int n, const double* b, const float* Kb, const float* const (&x)[S],
                     const float (&alpha)[S], float* const (&out)[S], long ld, float* f, float* Bp) {
  static_assert(kGateSubChunk == tile::kNR);  // sub-chunk J is panel J of Bp
  constexpr int c0 = kGateSubChunk;
  for (int I = 1; I * c0 < n; ++I) {
    const int i0 = I * c0, i1 = std::min(n, i0 + c0);
    const double* r = b + std::size_t(i0 - 1) * D;
    for (int J = 0; J < I; ++J) {
      exp_of_difference(f, r, b + std::size_t(J * c0 + c0 - 1) * D, D);
      tile::pack(Kb + std::size_t(J) * c0 * D, D, true, D, c0, f, Bp + std::size_t(J) * D * tile::kNR);
    }
    for (int s = 0; s < S; ++s)
      tile::run(rows_product(out[s] + std::size_t(i0) * ld, ld, i1 - i0, i0,
                             tile::seg(tile::Range::full, D, x[s] + std::size_t(i0) * D, D, 1, Bp), alpha[s]));
  }
}

inline float dot(const float* __restrict x, const float* __restrict y, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int d = 0; d < n; ++d) sum += x[d] * y[d];
  return sum;
}

inline void multiply(float* __restrict x, const float* __restrict y, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) x[d] *= y[d];
}

// out = x . y elementwise.
inline void multiply_into(float* __restrict out, const float* __restrict x, const float* __restrict y, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) out[d] = x[d] * y[d];
}

// out = a x.
inline void scale_into(float* __restrict out, float a, const float* __restrict x, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) out[d] = a * x[d];
}

}  // namespace lattn::cpu

// What the delta rule's chunked WY form shares between its forward (cpu/chunked/chunked_delta_forward.cpp)
// and its backward (cpu/chunked/chunked_delta_backward.cpp): the sizes, one thread's buffers, a chunk's
// rows and gates, where an item's kept states lie, the order items are taken in, and the forward
// chunk's steps, which the backward runs again on each chunk (defined in the forward's file).
// Internal to those two files.
//
// A document's chunks start at its first token, every p.chunk tokens: a chunk never straddles two
// documents, and a document whose length is not a multiple of the chunk ends in a short chunk of
// n < C rows, run as it is (nothing is padded, no rows are masked). Its scores and T are n x n and
// its products n rows deep (the tile products still work in tiles of 8 rows and panels of 32
// columns); what does not shrink with n is the chunk's state work: the O(Dk Dv) copies (the kept
// state, and in the backward the transposes of S and dS) and the state update's full Dk x Dv
// output. So over the same tokens unpacked, a packed batch pays at most one extra chunk of state
// work per document and value head (its short chunk), plus its h0 and hT.
//
// The states entering the chunks are kept by the forward (packed S, per item at the item's offset)
// or recomputed by the backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>

#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn::cpu::delta {

using tile::kNR;
using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::seg;

inline std::size_t lines(std::size_t floats) { return (floats + 15) / 16 * 16; }

// The sizes every item of a problem shares.
struct Shape {
  int Dk = 0, Dv = 0;  // key channels, value columns
  int C = 0;           // rows of the buffers' chunk: p.chunk, or the longest sequence when shorter
  int L = 0;           // score_ld(C)
  int chunks = 0;      // the most chunks an item has
  std::size_t SF = 0;  // floats of one packed Dk x P(Dv) state
};

inline int longest_sequence(const Problem& p) {
  if (!p.packed()) return p.seq;
  int most = 0;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) most = std::max(most, p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  return most;
}

inline int chunks_of(int seq, int chunk) { return (seq + chunk - 1) / chunk; }

inline Shape shape_of(const Problem& p) {
  Shape s;
  s.Dk = p.dim;
  s.Dv = p.value_dim();
  const int longest = longest_sequence(p);
  s.C = std::max(1, std::min(p.chunk, longest));
  s.L = score_ld(s.C);
  s.chunks = chunks_of(longest, p.chunk);
  s.SF = std::size_t(s.Dk) * panel_cols(s.Dv);
  return s;
}

// One thread's buffers (carve, cpu/chunked/chunked_delta_forward.cpp, lays them out in its block).
struct Buffers {
  double *b, *sums;                    // cumulative log-gates, C x gw; dg's sums, Dk
  float *a, *EQ, *EK, *decay, *row;    // exp(g), exp(b), exp(b_{n-1} - b): C x gw; Dk; Dk (vector gates' pair factors)
  float *mask, *ones, *Aqk, *Akk, *T;  // C x score_ld
  float *Qx, *Kx, *Ke;                 // vector gates: Q . G, K . G, K . exp(b_{n-1} - b), C x Dk
  float *Qh, *Kh, *Kb;                 // vector gates' sub-chunk operands (scores), C x Dk
  float *X, *R, *Wm;                   // C x Dv: (K . G) S then E; R; W
  float *Bp, *WTp;                     // K^T panels Dk x P(C), W^T panels Dv x P(C)
  float *Rp, *Wp, *Wep;                // C x P(Dv) panels
  float *Sp;                           // packed state, Dk x P(Dv)
  float *lanes;                        // vector gates: 2 x Dk x kLaneRows, the scores' rows in lanes
  // backward
  float *dPqk, *dPkk;                  // C x score_ld
  float *dW, *dKr, *dKw;               // C x Dv; C x Dk; C x Dk
  float *Kp, *Qp, *dOp, *Zp;           // C x P(Dk); C x P(Dk); C x P(Dv); C x P(Dv)
  float *STp, *dSp, *dSTp, *states;    // Dv x P(Dk), Dk x P(Dv), Dv x P(Dk); states: chunks of them, when recomputed
  float *dQ;                           // C x Dk: a group member's own dq, when members add into a shared dq
  float *Xq, *Xk, *Y;                  // vector gates: rows scaled for packing, and a product, C x Dk each
  std::size_t used = 0;  // floats of the thread's block
};

// One thread's buffers, carved from its block; with base null, carve only counts.
Buffers carve(const Problem& p, float* base, bool backward, bool own_states, bool own_dq);

inline std::size_t thread_floats(const Problem& p, bool backward, bool own_states, bool own_dq) {
  return carve(p, nullptr, backward, own_states, own_dq).used;
}

// One chunk of one item: its tokens' rows and gates.
struct Chunk {
  int n;
  const float *q, *k, *v, *beta, *g;  // g: the chunk's log-gates (scalar or vector decays), else null
  float log_gamma;                    // retnet's log gamma (0 for none)
};

// Chunk `index` of an item (its tokens index * p.chunk on, at most p.chunk of them).
inline Chunk chunk_of(const Problem& p, const HeadSlice& h, int index, const float* q, const float* k, const float* v,
                      const float* beta, const float* g) {
  const int c0 = index * p.chunk;
  Chunk c;
  c.n = std::min(p.chunk, h.seq - c0);
  c.q = q + h.key + std::size_t(c0) * p.dim;
  c.k = k + h.key + std::size_t(c0) * p.dim;
  c.v = v + h.value + std::size_t(c0) * p.value_dim();
  c.beta = beta + h.beta + c0;
  c.g = gated(p.decay) ? g + h.gate + std::size_t(c0) * p.gate_width() : nullptr;
  c.log_gamma = float(std::log(decay_gamma(p.decay, h.head)));
  return c;
}

// Where item `index`'s kept chunk states start, in states: items in slice order, each with its
// own sequence's chunks.
inline std::size_t kept_offset(const Problem& p, std::size_t index) {
  const int n = int(index / p.heads), head = int(index % p.heads);
  if (!p.packed()) return index * std::size_t(chunks_of(p.seq, p.chunk));
  std::size_t before = 0;
  for (int m = 0; m < n; ++m) before += std::size_t(chunks_of(p.cu_seqlens[m + 1] - p.cu_seqlens[m], p.chunk));
  return std::size_t(p.heads) * before + std::size_t(head) * chunks_of(p.cu_seqlens[n + 1] - p.cu_seqlens[n], p.chunk);
}

// A packed batch's documents longest first (the order the items are taken in); a dense batch's
// sequences are all as long and are taken in order, without the table.
inline std::size_t order_ints(const Problem& p) { return p.packed() ? lines(std::size_t(p.sequences())) : 0; }

inline void fill_order(const Problem& p, int* order) {
  if (!p.packed()) return;
  const auto length = [&](int n) { return p.cu_seqlens[std::size_t(n) + 1] - p.cu_seqlens[std::size_t(n)]; };
  std::iota(order, order + p.sequences(), 0);
  // std::sort (in place, unlike stable_sort's buffer), ties in document order.
  std::sort(order, order + p.sequences(),
            [&](int x, int y) { return length(x) != length(y) ? length(x) > length(y) : x < y; });
}

inline int sequence_at(const int* order, const Problem& p, long rank) { return p.packed() ? order[rank] : int(rank); }

// The forward chunk's steps (cpu/chunked/chunked_delta_forward.cpp), which the backward runs again on the
// chunk before its own products: the gates' operands, the scores, T and the solve for W.
void gate_operands(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c);
void scores(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float alpha);
void invert(const Buffers& B, const Shape& s, const Chunk& c);
void solve(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c);
// One chunk forward from the state in Sp (left as the state leaving it); o null: the state only.
void forward_chunk(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float* o);

}  // namespace lattn::cpu::delta

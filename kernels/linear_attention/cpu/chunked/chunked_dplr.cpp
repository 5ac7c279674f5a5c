// The diagonal-plus-low-rank rule's chunked form on the CPU, float32, forward and backward (docs/spec.md
// section 1f), every decay and the shapes of section 1c, in the form of flash-linear-attention's
// dplr_chunkwise, on the tile products of tile_gemm.hpp (AVX-512 or AVX2 micro-tiles, or their
// portable form). Reference: kernels/linear_attention/reference_dplr.cpp; the scan:
// cpu/scan/scan_dplr.cpp.
//
// Per chunk of n rows r = 0..n-1 with S the Dk x Dv state entering it, G_r the cumulative log-gates
// from the chunk's start (double, per key channel for vector gates; G_{-1} = 0; none and retnet
// are scalar gates 0 and log gamma), the four gated intra-chunk products (q and b read the state,
// k and a write it):
//   A_qk[r][m] = sum_i q_r k_m exp(G_r - G_m),      A_qa[r][m] = sum_i q_r a_m exp(G_r - G_m)      (m <= r)
//   A_bk[r][m] = sum_i b_r k_m exp(G_{r-1} - G_m),  A_ba[r][m] = sum_i b_r a_m exp(G_{r-1} - G_m)  (m < r)
// (FLA's naive form calls them q.k, q.b, a.k and a.b: its a is our b.) u_r = S_{r-1}^T b_r gives the
// unit lower-triangular system (I - A_ba) U = A_bk V + B^ S, B^_r = exp(G_{r-1}) b_r; with
// T = (I - A_ba)^-1 (forward substitution, once per chunk) the WY factors W = T B^ and
// U = T A_bk V + W S, then
//   O      = s (Q^ S + A_qa U + A_qk V),               Q^_r = exp(G_r) q_r
//   S_next = exp(G_{n-1}) S + A~^T U + K~^T V,         A~_r = exp(G_{n-1} - G_r) a_r, K~ likewise
// Every gate factor is exp of a difference <= 0 within the chunk, the difference formed in double,
// so strong gates (gate_norm 1: cumulative log-gates of -50 and below over a chunk) neither overflow
// nor lose the small factors to exp(G) exp(-G). The four products are tile products:
//   scalar gates: exp(G_r - G_m) is a mask M (A_qk = (Q K^T) . M), and exp(G_{r-1} - G_m) is M one
//     row down (row r of it is row r - 1 of M, zero on and above the diagonal): one buffer of
//     C + 1 rows whose first row is zero holds both.
//   vector gates: the factor is per channel inside the sum, so the rows go in sub-chunks of c = 32
//     (kGateSubChunk, the gated form's secondary chunking, cpu/chunked/chunked_gated.cpp). Between
//     sub-chunks I > J, with R_I = G at the row before I and E_J = G at J's last row,
//     exp(G_r - G_m) = exp(G_r - R_I) exp(R_I - E_J) exp(E_J - G_m) (and G_{r-1} for b's rows), three
//     factors <= 1: the row operands Q' = q . exp(G_r - R_I), B' = b . exp(G_{r-1} - R_I), the column
//     operands K' = k . exp(E_J - G_m), A' = a . exp(E_J - G_m), and f_IJ = exp(R_I - E_J) on the
//     packed K'^T and A'^T rows (one panel per sub-chunk J): one product per row block and product.
//     Within a sub-chunk, lane_scores (cpu/chunked/chunk_products.hpp: a running product of exp(g),
//     the rows in the vector lanes, no exp per pair), b's rows fed one row up (row r - 1's running
//     product is exp(G_{r-1} - G_m)).
// c = 32 is the tile's panel width, so that sub-chunk J is panel J of the packed column operands.
//
// The backward walks the chunks in reverse with dS, the gradient of the state leaving the chunk, and
// S the state entering it (the backward runs the forward first and keeps every chunk's entering
// state; the forward keeps none):
//   dU = s A_qa^T dO + A~ dS,  dY = T^T dU,  dV = s A_qk^T dO + K~ dS + A_bk^T dY
//   dA_qa = s dO U^T, dA_qk = s dO V^T (m <= r); dA_bk = dY V^T, dA_ba = dY U^T (m < r)
//   dQ^ = s dO S^T, dB^ = dY S^T, dA~ = U dS^T, dK~ = V dS^T
//   dS <- exp(G_{n-1}) dS + Q^^T (s dO) + B^^T dY
// and the products' and operands' gradients reach q, k, a, b and the log-gates G through their
// factors; dg_r is the sum of dG over the chunk's rows from r on. The products' gradients reach
// q, k, a, b by tile products of the same shapes (with vector gates, the same sub-chunks, pair by
// pair with a running product within one). Every pair's share of dG is, channel by channel, its
// share of q_r dq_r (at G_r), of b_r db_r (at G_{r-1}) and minus those of k_m dk_m and a_m da_m (at
// G_m): between sub-chunks R_I and E_J cancel in each pair. So the products' whole share of dG is
// q . dq' - k . dk' - a . da' at G_r and b . db' at G_{r-1}, dq' .. db' the products' parts of the
// gradients, and needs no pair of its own. (Its rounding is then that of the float products
// dq' .. db', not a double sum per pair: at gate_norm 1 dg's error against the float64 reference
// is 1-2e-6 where the other gradients' is 1-6e-7, as in the gated form, which takes dg from
// q . dq - k . dk too.)
//
// The chunk size is the case's `chunk` key, so it defaults to the kernel suite's 128, every rule's
// default. With vector gates the pairs within a sub-chunk take lane_scores in the forward (a whole
// c x c block of lanes per sub-chunk and product) and go pair by pair in the backward; those between
// sub-chunks are tile products (O(C) per token, at tile speed), against the state products'
// O(Dk Dv). A chunk of at most c (FLA runs DPLR at 16) is one sub-chunk, with no score products
// between sub-chunks. The kernel takes any C; which one is fastest on a CPU is a measurement.
//
// Items: the forward's are (sequence, value head) pairs; the backward's whole groups (the value
// heads of one sequence sharing a q/k head), the first writing dq and dk, the later adding theirs.
// Over 500 lines, and past 650 with the vector gates' sub-chunk operands built and taken apart in
// both directions (the scalar gates' masks beside them): the forward chunk's steps are the
// backward's first, and its gradient lines follow them one for one; the two are read together.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/chunked/unit_lower_inverse.hpp"
#include "kernels/linear_attention/cpu/dplr.hpp"

namespace lattn::cpu {
namespace {

using tile::kNR;
using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::seg;

constexpr int kSub = kGateSubChunk;
static_assert(kSub == kNR && kSub == kLaneRows, "sub-chunk J is panel J, and lane_scores takes a sub-chunk");

struct Dims {
  int Dk, Dv, C;  // C: rows of the buffers (the chunk, or the longest sequence when shorter)
  int L;          // score_ld(C): the C x C buffers' leading dimension
  int gw;         // log-gates per token kept: Dk for vector gates, 1 otherwise
  int chunks;     // the most chunks a slice has
  std::size_t SF; // floats of one packed Dk x P(Dv) state
  float s;
};

Dims dims_of(const Problem& p) {
  int longest = 0;
  for (int n = 0; n < p.sequences(); ++n) longest = std::max(longest, p.slice(std::size_t(n) * p.heads).seq);
  Dims d;
  d.Dk = p.dim;
  d.Dv = p.value_dim();
  d.C = std::max(1, std::min(p.chunk, longest));
  d.L = score_ld(d.C);
  d.gw = p.decay == Decay::vector ? p.dim : 1;
  d.chunks = (longest + p.chunk - 1) / p.chunk;
  d.SF = std::size_t(d.Dk) * panel_cols(d.Dv);
  d.s = float(attention_scale(p.dim));
  return d;
}

// One thread's buffers (base null: only counted).
struct Buffers {
  double *G, *dG, *sums;              // (C + 1) x gw: row 0 is G_{-1} = 0, row r + 1 is G_r; its gradient; Dk
  float *eg, *eGr, *eGp, *tail;       // exp(g_r), exp(G_r), exp(G_{r-1}), exp(G_{n-1} - G_r): C x gw each
  float *eL, *f, *f2, *minus;         // exp(G_{n-1}), two rows' factors: Dk; -1: C (T's system)
  float *Qh, *Bh, *At, *Kt;           // Q^, B^, A~, K~: C x Dk each
  float *mask;                        // scalar gates: (C + 1) x L, row 0 zero, row r + 1 exp(G_r - G_m)
  float *Qs, *Bs, *Ks, *As, *Bup;     // vector gates: Q', B', K', A' (the header); b one row up: C x Dk
  float *lanes;                       // vector gates: 2 x Dk x kLaneRows
  float *Aqk, *Aqa, *T;               // C x L
  float *Abk, *Aba;                   // (C + 1) x L (lane_scores writes b's rows one row down)
  float *Y, *U;                       // C x Dv
  float *Kp, *Ap;                     // K^T, A^T panels (or K'^T, A'^T per sub-chunk): Dk x P(C)
  float *Vp, *Yp, *Up;                // C x P(Dv) panels
  float *Sp;                          // the packed state, Dk x P(Dv)
  // backward
  float *dAqk, *dAqa, *dAbk, *dAba;   // C x L
  float *dU, *dY, *sdO;               // C x Dv (sdO: s dO)
  float *dUp, *dYp, *dOp;             // C x P(Dv) panels
  float *UTp, *VTp;                   // U^T, V^T panels: Dv x P(C)
  float *STp, *dSTp;                  // S^T, dS^T panels: Dv x P(Dk)
  float *Qr, *Br, *Kr, *Ar;           // row panels of q, b, k, a (or their sub-chunk operands): C x P(Dk)
  float *dQh, *dBh, *dAt, *dKt;       // C x Dk
  float *dq, *dk, *da, *db;           // C x Dk: the chunk's rows
  float *sq, *sk, *sa, *sb;           // C x Dk: the products' parts of dq, dk, da, db
  float *X1, *X2, *Z;                 // vector gates: C x Dk of scaled operands, and a product's rows
  float *dSp;                         // the packed state's gradient
  float *states;                      // chunks x SF: the states entering the chunks
  std::size_t used = 0;
};

Buffers carve(const Dims& d, float* base, bool backward) {
  Buffers b{};
  auto take = [&](std::size_t n) {
    float* out = base ? base + b.used : nullptr;
    b.used += (n + 15) / 16 * 16;  // each buffer on its own cache line
    return out;
  };
  const std::size_t C = d.C, L = d.L, Dk = d.Dk, Dv = d.Dv, gw = d.gw;
  const std::size_t PK = panel_cols(d.Dk), PV = panel_cols(d.Dv), PC = panel_cols(d.C);
  const std::size_t vec = gw == 1 ? 0 : 1, bw = backward ? 1 : 0;
  b.G = reinterpret_cast<double*>(take(2 * (C + 1) * gw));
  b.dG = reinterpret_cast<double*>(take(bw * 2 * (C + 1) * gw));
  b.sums = reinterpret_cast<double*>(take(bw * 2 * Dk));
  for (float** x : {&b.eg, &b.eGr, &b.eGp, &b.tail}) *x = take(C * gw);
  for (float** x : {&b.eL, &b.f, &b.f2}) *x = take(Dk);
  b.minus = take(C);
  for (float** x : {&b.Qh, &b.Bh, &b.At, &b.Kt}) *x = take(C * Dk);
  b.mask = take((1 - vec) * (C + 1) * L);
  for (float** x : {&b.Qs, &b.Bs, &b.Ks, &b.As, &b.Bup}) *x = take(vec * C * Dk);
  b.lanes = take(vec * 2 * Dk * kLaneRows);
  for (float** x : {&b.Aqk, &b.Aqa, &b.T}) *x = take(C * L);
  for (float** x : {&b.Abk, &b.Aba}) *x = take((C + 1) * L);
  for (float** x : {&b.Y, &b.U}) *x = take(C * Dv);
  for (float** x : {&b.Kp, &b.Ap}) *x = take(Dk * PC);
  for (float** x : {&b.Vp, &b.Yp, &b.Up}) *x = take(C * PV);
  b.Sp = take(d.SF);
  for (float** x : {&b.dAqk, &b.dAqa, &b.dAbk, &b.dAba}) *x = take(bw * C * L);
  for (float** x : {&b.dU, &b.dY, &b.sdO, &b.dUp, &b.dYp, &b.dOp}) *x = take(bw * C * PV);
  for (float** x : {&b.UTp, &b.VTp}) *x = take(bw * Dv * PC);
  for (float** x : {&b.STp, &b.dSTp}) *x = take(bw * Dv * PK);
  for (float** x : {&b.Qr, &b.Br, &b.Kr, &b.Ar}) *x = take(bw * C * PK);
  for (float** x : {&b.dQh, &b.dBh, &b.dAt, &b.dKt, &b.dq, &b.dk, &b.da, &b.db, &b.sq, &b.sk, &b.sa, &b.sb})
    *x = take(bw * C * Dk);
  for (float** x : {&b.X1, &b.X2, &b.Z}) *x = take(bw * vec * C * Dk);
  b.dSp = take(bw * d.SF);
  b.states = take(bw * std::size_t(d.chunks) * d.SF);
  return b;
}

// One chunk's rows.
struct Chunk {
  int n;
  const float *q, *k, *v, *a, *b, *g;  // g: the chunk's log-gates (scalar or vector), else null
  double log_gamma;                    // retnet's (0 for none)
};

Chunk chunk_of(const Problem& p, const HeadSlice& h, int index, const float* q, const float* k, const float* v,
               const float* a, const float* b, const float* g) {
  const int c0 = index * p.chunk;
  const std::size_t low = p.low_rank_offset(h) + std::size_t(c0) * p.dim;
  Chunk c;
  c.n = std::min(p.chunk, h.seq - c0);
  c.q = q + h.key + std::size_t(c0) * p.dim;
  c.k = k + h.key + std::size_t(c0) * p.dim;
  c.v = v + h.value + std::size_t(c0) * p.value_dim();
  c.a = a + low;
  c.b = b + low;
  c.g = gated(p.decay) ? g + h.gate + std::size_t(c0) * p.gate_width() : nullptr;
  c.log_gamma = std::log(decay_gamma(p.decay, h.head));
  return c;
}

// Row r + 1 of G (G_r), row 0 (G_{-1} = 0).
const double* G_row(const Buffers& B, const Dims& d, int r) { return B.G + std::size_t(r + 1) * d.gw; }

// G_r, exp(g_r), the gated operands Q^, B^, A~, K~ and exp(G_{n-1}); the scalar gates' mask, or the
// vector gates' sub-chunk operands Q', B', K', A' and b one row up.
void gate_operands(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, gw = d.gw, C = d.C, L = d.L;
  std::fill_n(B.G, gw, 0.0);
  if (c.g) {
    for (int r = 0; r < n; ++r) {
      double* __restrict Gr = B.G + std::size_t(r + 1) * gw;
      const double* __restrict Gp = Gr - gw;
      const float* __restrict g = c.g + std::size_t(r) * gw;
#pragma omp simd
      for (int i = 0; i < gw; ++i) Gr[i] = Gp[i] + double(g[i]);
    }
    std::copy_n(c.g, std::size_t(n) * gw, B.eg);
  } else {
    for (int r = 0; r < n; ++r) B.G[r + 1] = B.G[r] + c.log_gamma;
    std::fill_n(B.eg, n, float(c.log_gamma));
  }
  exp_in_place(B.eg, n * gw);
  // exp(G_{r-1}) is row r - 1's exp(G_r), and 1 at row 0.
  const double* last = G_row(B, d, n - 1);
  std::fill_n(B.eGp, gw, 1.0f);
  for (int r = 0; r < n; ++r) {
    const std::size_t at = std::size_t(r) * gw;
    exp_of_difference(B.eGr + at, G_row(B, d, r), nullptr, gw);
    if (r + 1 < n) std::copy_n(B.eGr + at, gw, B.eGp + at + gw);
    exp_of_difference(B.tail + at, last, G_row(B, d, r), gw);
  }
  if (gw == 1) std::fill_n(B.eL, Dk, exp_nonpositive(float(last[0])));
  else exp_of_difference(B.eL, last, nullptr, Dk);
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk, gr = std::size_t(r) * gw;
    if (gw == 1) {
      scale_into(B.Qh + row, B.eGr[r], c.q + row, Dk);
      scale_into(B.Bh + row, B.eGp[r], c.b + row, Dk);
      scale_into(B.At + row, B.tail[r], c.a + row, Dk);
      scale_into(B.Kt + row, B.tail[r], c.k + row, Dk);
    } else {
      multiply_into(B.Qh + row, c.q + row, B.eGr + gr, Dk);
      multiply_into(B.Bh + row, c.b + row, B.eGp + gr, Dk);
      multiply_into(B.At + row, c.a + row, B.tail + gr, Dk);
      multiply_into(B.Kt + row, c.k + row, B.tail + gr, Dk);
    }
  }
  if (gw == 1) {
    // Row r + 1: exp(G_r - G_m) for m <= r, zero on to column C; row 0 zero (b's row 0 reads nothing).
    std::fill_n(B.mask, C, 0.0f);
    for (int r = 0; r < n; ++r) {
      float* row = B.mask + std::size_t(r + 1) * L;
      const double Gr = G_row(B, d, r)[0];
      for (int m = 0; m <= r; ++m) row[m] = float(Gr - G_row(B, d, m)[0]);
      exp_in_place(row, r + 1);
      std::fill(row + r + 1, row + C, 0.0f);
    }
    return;
  }
  // The sub-chunk operands: Q' and B' of every sub-chunk but the first (R_I: G at row i0 - 1),
  // K' and A' of every whole sub-chunk but the last (E_J: G at its last row); b one row up.
  // B's factor exp(G_{r-1} - R_I) is row r - 1's Q factor, and 1 at the sub-chunk's first row.
  float *f = B.f, *before = B.f2;
  const int blocks = (n + kSub - 1) / kSub;
  for (int r = kSub; r < n; ++r) {
    const std::size_t o = std::size_t(r) * Dk;
    if (r % kSub == 0) std::fill_n(before, Dk, 1.0f);
    multiply_into(B.Bs + o, c.b + o, before, Dk);
    exp_of_difference(f, G_row(B, d, r), G_row(B, d, r / kSub * kSub - 1), Dk);
    multiply_into(B.Qs + o, c.q + o, f, Dk);
    std::swap(f, before);
  }
  for (int m = 0; m < (blocks - 1) * kSub; ++m) {
    const std::size_t o = std::size_t(m) * Dk;
    exp_of_difference(f, G_row(B, d, m / kSub * kSub + kSub - 1), G_row(B, d, m), Dk);
    multiply_into(B.Ks + o, c.k + o, f, Dk);
    multiply_into(B.As + o, c.a + o, f, Dk);
  }
  std::copy_n(c.b + Dk, std::size_t(n - 1) * Dk, B.Bup);
  std::fill_n(B.Bup + std::size_t(n - 1) * Dk, Dk, 0.0f);
}

// Zeroes row r of a product from column `from` (r + 1, or r for a strictly lower one) to C.
void zero_above(float* A, const Dims& d, int n, bool strict) {
  for (int r = 0; r < n; ++r) std::fill(A + std::size_t(r) * d.L + r + (strict ? 0 : 1), A + std::size_t(r) * d.L + d.C, 0.0f);
}

// The four gated products (zero above their diagonals up to column C) and T = (I - A_ba)^-1.
void chunk_scores(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, L = d.L;
  if (d.gw == 1) {
    tile::pack(c.k, Dk, true, Dk, n, nullptr, B.Kp);
    tile::pack(c.a, Dk, true, Dk, n, nullptr, B.Ap);
    const float *Mq = B.mask + L, *Mb = B.mask;
    for (const auto& [out, x, cols, mask] : {std::tuple{B.Aqk, c.q, B.Kp, Mq}, std::tuple{B.Aqa, c.q, B.Ap, Mq},
                                            std::tuple{B.Abk, c.b, B.Kp, Mb}, std::tuple{B.Aba, c.b, B.Ap, Mb}}) {
      Product u = rows_product(out, L, n, n, seg(Range::full, Dk, x, Dk, 1, cols));
      u.mask = mask;
      u.ldm = L;
      u.mask_all = true;
      u.lower = true;
      tile::run(u);
    }
  } else {
    // Between sub-chunks: the packed K'^T and A'^T of every J < I, rows scaled by f_IJ, then one
    // product per output over the columns before I.
    const int blocks = (n + kSub - 1) / kSub;
    for (int I = 1; I < blocks; ++I) {
      const int i0 = I * kSub, i1 = std::min(n, i0 + kSub);
      const double* R = G_row(B, d, i0 - 1);
      for (int J = 0; J < I; ++J) {
        exp_of_difference(B.f, R, G_row(B, d, J * kSub + kSub - 1), Dk);
        const std::size_t from = std::size_t(J) * kSub * Dk, panel = std::size_t(J) * Dk * kNR;
        tile::pack(B.Ks + from, Dk, true, Dk, kSub, B.f, B.Kp + panel);
        tile::pack(B.As + from, Dk, true, Dk, kSub, B.f, B.Ap + panel);
      }
      for (const auto& [out, x, cols] : {std::tuple{B.Aqk, B.Qs, B.Kp}, std::tuple{B.Aqa, B.Qs, B.Ap},
                                         std::tuple{B.Abk, B.Bs, B.Kp}, std::tuple{B.Aba, B.Bs, B.Ap}})
        tile::run(rows_product(out + std::size_t(i0) * L, L, i1 - i0, i0,
                               seg(Range::full, Dk, x + std::size_t(i0) * Dk, Dk, 1, cols)));
    }
    // Within a sub-chunk: q's rows, and b's one row up (row r - 1's running product, fed b_r,
    // written to row r).
    for (int I = 0; I < blocks; ++I) {
      const int i0 = I * kSub, i1 = std::min(n, i0 + kSub);
      lane_scores<2>(Dk, i0, i1, i0, c.k, B.eg, {c.q, B.Bup}, {1.0f, 1.0f}, {B.Aqk, B.Abk + L}, L, B.lanes);
      lane_scores<2>(Dk, i0, i1, i0, c.a, B.eg, {c.q, B.Bup}, {1.0f, 1.0f}, {B.Aqa, B.Aba + L}, L, B.lanes);
    }
  }
  zero_above(B.Aqk, d, n, false);
  zero_above(B.Aqa, d, n, false);
  zero_above(B.Abk, d, n, true);
  zero_above(B.Aba, d, n, true);
  invert_unit_lower(B.Aba, L, B.minus, n, d.C, B.T, L);
}

// Y = A_bk V + B^ S, U = T Y, and the panels of V, Y and U.
void chunk_u(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, L = d.L;
  tile::pack(c.v, Dv, false, n, Dv, nullptr, B.Vp);
  Product y = rows_product(B.Y, Dv, n, Dv, seg(Range::full, Dk, B.Bh, Dk, 1, B.Sp));
  y.s2 = seg(Range::lower, n, B.Abk, L, 1, B.Vp);
  tile::run(y);
  tile::pack(B.Y, Dv, false, n, Dv, nullptr, B.Yp);
  tile::run(rows_product(B.U, Dv, n, Dv, seg(Range::lower, n, B.T, L, 1, B.Yp)));
  tile::pack(B.U, Dv, false, n, Dv, nullptr, B.Up);
}

// One chunk forward from B.Sp, left as the state leaving it; o (the chunk's rows) when given.
void forward_chunk(const Buffers& B, const Dims& d, const Chunk& c, float* o) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, L = d.L;
  gate_operands(B, d, c);
  chunk_scores(B, d, c);
  chunk_u(B, d, c);
  if (o) {
    Product out = rows_product(o, Dv, n, Dv, seg(Range::full, Dk, B.Qh, Dk, 1, B.Sp), d.s);
    out.s2 = seg(Range::lower, n, B.Aqa, L, 1, B.Up);
    tile::run(out);
    Product more = rows_product(o, Dv, n, Dv, seg(Range::lower, n, B.Aqk, L, 1, B.Vp), d.s);
    more.beta = 1.0f;
    tile::run(more);
  }
  scale_state_rows(B.Sp, Dk, Dv, B.eL);
  state_product(B.Sp, Dk, Dv, n, B.At, B.Up, 1.0f, 1.0f);
  state_product(B.Sp, Dk, Dv, n, B.Kt, B.Vp, 1.0f, 1.0f);
}

int slice_chunks(const Problem& p, const HeadSlice& h) { return (h.seq + p.chunk - 1) / p.chunk; }

// out[r] += exp(G_r' - R) . Z[r - i0] for rows [i0, i1), r' = r + shift (0 for q's rows, -1 for b's).
void add_row_side(const Buffers& B, const Dims& d, float* out, int i0, int i1, int shift, const double* R) {
  for (int r = i0; r < i1; ++r) {
    exp_of_difference(B.f, G_row(B, d, r + shift), R, d.Dk);
    float* __restrict x = out + std::size_t(r) * d.Dk;
    const float *__restrict f = B.f, *__restrict z = B.Z + std::size_t(r - i0) * d.Dk;
#pragma omp simd
    for (int i = 0; i < d.Dk; ++i) x[i] += f[i] * z[i];
  }
}

// out[m] += exp(E - G_m) . Z[m - j0] for rows [j0, j1).
void add_column_side(const Buffers& B, const Dims& d, float* out, int j0, int j1, const double* E) {
  for (int m = j0; m < j1; ++m) {
    exp_of_difference(B.f, E, G_row(B, d, m), d.Dk);
    float* __restrict x = out + std::size_t(m) * d.Dk;
    const float *__restrict f = B.f, *__restrict z = B.Z + std::size_t(m - j0) * d.Dk;
#pragma omp simd
    for (int i = 0; i < d.Dk; ++i) x[i] += f[i] * z[i];
  }
}

// The products' parts of dq, db, dk and da (into sq, sb, sk, sa), from dA_qk, dA_qa, dA_bk, dA_ba
// (their causal parts; scalar gates: already times the mask):
//   sq_r = sum_m w_rm . (dA_qk[r][m] k_m + dA_qa[r][m] a_m),  sb_r likewise with w'_rm, dA_bk, dA_ba
//   sk_m = sum_r w_rm . dA_qk[r][m] q_r + w'_rm . dA_bk[r][m] b_r,  sa_m likewise with dA_qa, dA_ba
// with w_rm = exp(G_r - G_m) and w'_rm = exp(G_{r-1} - G_m) per channel.
void score_gradients(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, L = d.L;
  if (d.gw == 1) {
    for (const auto& [x, panels] : {std::pair{c.q, B.Qr}, std::pair{c.b, B.Br}, std::pair{c.k, B.Kr},
                                    std::pair{c.a, B.Ar}})
      tile::pack(x, Dk, false, n, Dk, nullptr, panels);
    for (const auto& [out, dA1, P1, dA2, P2] :
         {std::tuple{B.sq, B.dAqk, B.Kr, B.dAqa, B.Ar}, std::tuple{B.sb, B.dAbk, B.Kr, B.dAba, B.Ar}}) {
      Product u = rows_product(out, Dk, n, Dk, seg(Range::lower, n, dA1, L, 1, P1));
      u.s2 = seg(Range::lower, n, dA2, L, 1, P2);
      tile::run(u);
    }
    for (const auto& [out, dA1, P1, dA2, P2] :
         {std::tuple{B.sk, B.dAqk, B.Qr, B.dAbk, B.Br}, std::tuple{B.sa, B.dAqa, B.Qr, B.dAba, B.Br}}) {
      Product u = rows_product(out, Dk, n, Dk, seg(Range::upper, n, dA1, 1, L, P1));
      u.s2 = seg(Range::upper, n, dA2, 1, L, P2);
      tile::run(u);
    }
    return;
  }
  for (float* x : {B.sq, B.sk, B.sa, B.sb}) std::fill_n(x, std::size_t(n) * Dk, 0.0f);
  const int blocks = (n + kSub - 1) / kSub;
  // Rows of sub-chunk I against the columns of every J < I: Z = dA[I][< i0] (K' . f_IJ), then the
  // rows' own factors exp(G_r - R_I) (q) and exp(G_{r-1} - R_I) (b).
  for (int I = 1; I < blocks; ++I) {
    const int i0 = I * kSub, i1 = std::min(n, i0 + kSub);
    const double* R = G_row(B, d, i0 - 1);
    for (int J = 0; J < I; ++J) {
      exp_of_difference(B.f, R, G_row(B, d, J * kSub + kSub - 1), Dk);
      for (int m = J * kSub; m < J * kSub + kSub; ++m) {
        const std::size_t o = std::size_t(m) * Dk;
        multiply_into(B.X1 + o, B.Ks + o, B.f, Dk);
        multiply_into(B.X2 + o, B.As + o, B.f, Dk);
      }
    }
    tile::pack(B.X1, Dk, false, i0, Dk, nullptr, B.Kr);
    tile::pack(B.X2, Dk, false, i0, Dk, nullptr, B.Ar);
    for (const auto& [out, dA1, dA2, shift] : {std::tuple{B.sq, B.dAqk, B.dAqa, 0}, std::tuple{B.sb, B.dAbk, B.dAba, -1}}) {
      Product z = rows_product(B.Z, Dk, i1 - i0, Dk, seg(Range::full, i0, dA1 + std::size_t(i0) * L, L, 1, B.Kr));
      z.s2 = seg(Range::full, i0, dA2 + std::size_t(i0) * L, L, 1, B.Ar);
      tile::run(z);
      add_row_side(B, d, out, i0, i1, shift, R);
    }
  }
  // Columns of sub-chunk J against the rows of every I > J: Z = dA[> J][J]^T (Q' . f_IJ), then the
  // columns' own factors exp(E_J - G_m).
  for (int J = 0; J + 1 < blocks; ++J) {
    const int j0 = J * kSub, j1 = j0 + kSub, rows = n - j1;
    const double* E = G_row(B, d, j1 - 1);
    for (int I = J + 1; I < blocks; ++I) {
      const int i0 = I * kSub, i1 = std::min(n, i0 + kSub);
      exp_of_difference(B.f, G_row(B, d, i0 - 1), E, Dk);
      for (int r = i0; r < i1; ++r) {
        const std::size_t o = std::size_t(r) * Dk;
        multiply_into(B.X1 + o, B.Qs + o, B.f, Dk);
        multiply_into(B.X2 + o, B.Bs + o, B.f, Dk);
      }
    }
    tile::pack(B.X1 + std::size_t(j1) * Dk, Dk, false, rows, Dk, nullptr, B.Qr);
    tile::pack(B.X2 + std::size_t(j1) * Dk, Dk, false, rows, Dk, nullptr, B.Br);
    for (const auto& [out, dA1, dA2] : {std::tuple{B.sk, B.dAqk, B.dAbk}, std::tuple{B.sa, B.dAqa, B.dAba}}) {
      Product z = rows_product(B.Z, Dk, kSub, Dk, seg(Range::full, rows, dA1 + std::size_t(j1) * L + j0, 1, L, B.Qr));
      z.s2 = seg(Range::full, rows, dA2 + std::size_t(j1) * L + j0, 1, L, B.Br);
      tile::run(z);
      add_column_side(B, d, out, j0, j1, E);
    }
  }
  // Within a sub-chunk, pair by pair: w' = exp(G_{r-1} - G_m) a running product from m = r - 1
  // down, w = w' exp(g_r).
  float* __restrict w = B.f;
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk;
    const float *__restrict q = c.q + row, *__restrict b = c.b + row, *__restrict egr = B.eg + row;
    float *__restrict sq = B.sq + row, *__restrict sb = B.sb + row;
    {
      const float xqk = B.dAqk[std::size_t(r) * L + r], xqa = B.dAqa[std::size_t(r) * L + r];
      const float *__restrict k = c.k + row, *__restrict a = c.a + row;
      float *__restrict sk = B.sk + row, *__restrict sa = B.sa + row;
#pragma omp simd
      for (int i = 0; i < Dk; ++i) {
        sq[i] += xqk * k[i] + xqa * a[i];
        sk[i] += xqk * q[i];
        sa[i] += xqa * q[i];
      }
    }
    std::fill_n(w, Dk, 1.0f);
    for (int m = r - 1; m >= r / kSub * kSub; --m) {
      const std::size_t mrow = std::size_t(m) * Dk, at = std::size_t(r) * L + m;
      const float xqk = B.dAqk[at], xqa = B.dAqa[at], xbk = B.dAbk[at], xba = B.dAba[at];
      const float *__restrict k = c.k + mrow, *__restrict a = c.a + mrow, *__restrict egm = B.eg + mrow;
      float *__restrict sk = B.sk + mrow, *__restrict sa = B.sa + mrow;
#pragma omp simd
      for (int i = 0; i < Dk; ++i) {
        const float fb = w[i], fq = fb * egr[i];
        sq[i] += fq * (xqk * k[i] + xqa * a[i]);
        sb[i] += fb * (xbk * k[i] + xba * a[i]);
        sk[i] += fq * xqk * q[i] + fb * xbk * b[i];
        sa[i] += fq * xqa * q[i] + fb * xba * b[i];
        w[i] = fb * egm[i];
      }
    }
  }
}

// The gradients of one chunk (the file's header), from dS (B.dSp, the state leaving it) and S (B.Sp,
// the state entering it): B.dSp becomes the entering state's, the chunk's rows' dq, dk, da and db
// go into B.dq, B.dk, B.da, B.db, dv and dg (the chunk's rows, dg when gated) are written.
void backward_chunk(const Buffers& B, const Dims& d, const Chunk& c, const float* dO, float* dv, float* dg) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, L = d.L, gw = d.gw;
  const bool vector = gw != 1;
  gate_operands(B, d, c);
  chunk_scores(B, d, c);
  chunk_u(B, d, c);
  scale_into(B.sdO, d.s, dO, n * Dv);
  tile::pack(B.sdO, Dv, false, n, Dv, nullptr, B.dOp);
  tile::transpose_packed(B.Sp, Dk, Dv, B.STp);
  tile::transpose_packed(B.dSp, Dk, Dv, B.dSTp);
  // dU = A~ dS + A_qa^T (s dO); dY = T^T dU; dV = K~ dS + A_qk^T (s dO) + A_bk^T dY.
  Product du = rows_product(B.dU, Dv, n, Dv, seg(Range::full, Dk, B.At, Dk, 1, B.dSp));
  du.s2 = seg(Range::upper, n, B.Aqa, 1, L, B.dOp);
  tile::run(du);
  tile::pack(B.dU, Dv, false, n, Dv, nullptr, B.dUp);
  tile::run(rows_product(B.dY, Dv, n, Dv, seg(Range::upper, n, B.T, 1, L, B.dUp)));
  tile::pack(B.dY, Dv, false, n, Dv, nullptr, B.dYp);
  Product dvp = rows_product(dv, Dv, n, Dv, seg(Range::full, Dk, B.Kt, Dk, 1, B.dSp));
  dvp.s2 = seg(Range::upper, n, B.Aqk, 1, L, B.dOp);
  tile::run(dvp);
  Product dvb = rows_product(dv, Dv, n, Dv, seg(Range::upper, n, B.Abk, 1, L, B.dYp));
  dvb.beta = 1.0f;
  tile::run(dvb);
  // The products' gradients (their causal parts; scalar gates: times the mask, which the products
  // of score_gradients then read): dA_qa = s dO U^T, dA_qk = s dO V^T, dA_bk = dY V^T, dA_ba = dY U^T.
  tile::pack(B.U, Dv, true, Dv, n, nullptr, B.UTp);
  tile::pack(c.v, Dv, true, Dv, n, nullptr, B.VTp);
  const float *Mq = vector ? nullptr : B.mask + L, *Mb = vector ? nullptr : B.mask;
  for (const auto& [out, x, cols, mask] : {std::tuple{B.dAqa, B.sdO, B.UTp, Mq}, std::tuple{B.dAqk, B.sdO, B.VTp, Mq},
                                          std::tuple{B.dAbk, B.dY, B.VTp, Mb}, std::tuple{B.dAba, B.dY, B.UTp, Mb}}) {
    Product u = rows_product(out, L, n, n, seg(Range::full, Dv, x, Dv, 1, cols));
    u.mask = mask;
    u.ldm = L;
    u.mask_all = mask != nullptr;
    u.lower = true;
    tile::run(u);
  }
  // The gated operands': dQ^ = s dO S^T, dB^ = dY S^T, dA~ = U dS^T, dK~ = V dS^T.
  using Operands = std::tuple<float*, const float*, const float*>;
  for (const auto& [out, x, cols] : {Operands{B.dQh, B.sdO, B.STp}, Operands{B.dBh, B.dY, B.STp},
                                     Operands{B.dAt, B.U, B.dSTp}, Operands{B.dKt, c.v, B.dSTp}})
    tile::run(rows_product(out, Dk, n, Dk, seg(Range::full, Dv, x, Dv, 1, cols)));
  // dG row r + 1 is G_r's gradient (row 0, G_{-1} = 0, is a constant's and is not read);
  // dG_{n-1} += exp(G_{n-1}) rowsum(S . dS), before dS becomes the entering state's:
  // exp(G_{n-1}) dS + Q^^T (s dO) + B^^T dY.
  std::fill_n(B.dG, std::size_t(n + 1) * gw, 0.0);
  double* dGl = B.dG + std::size_t(n) * gw;
  std::fill_n(B.sums, Dk, 0.0);
  for (int panel = 0; panel < panel_cols(Dv) / kNR; ++panel)
    for (int i = 0; i < Dk; ++i) {
      const std::size_t o = (std::size_t(panel) * Dk + i) * kNR;
      double sum = 0;
      for (int j = 0; j < kNR; ++j) sum += double(B.dSp[o + j]) * B.Sp[o + j];
      B.sums[i] += sum;
    }
  for (int i = 0; i < Dk; ++i) dGl[vector ? i : 0] += double(B.eL[i]) * B.sums[i];
  scale_state_rows(B.dSp, Dk, Dv, B.eL);
  state_product(B.dSp, Dk, Dv, n, B.Qh, B.dOp, 1.0f, 1.0f);
  state_product(B.dSp, Dk, Dv, n, B.Bh, B.dYp, 1.0f, 1.0f);
  score_gradients(B, d, c);
  // The operands' factors: Q^ = exp(G_r) q, B^ = exp(G_{r-1}) b, A~ = exp(G_{n-1} - G_r) a, K~
  // likewise; and the products' parts, whose share of dG is q . sq - k . sk - a . sa at G_r and
  // b . sb at G_{r-1} (the header).
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk, gr = std::size_t(r) * gw;
    double *dGr = B.dG + gr + gw, *dGp = B.dG + gr;
    const float *q = c.q + row, *k = c.k + row, *a = c.a + row, *b = c.b + row;
    for (int i = 0; i < Dk; ++i) {
      const std::size_t at = row + i, gi = gr + (vector ? i : 0);
      const int di = vector ? i : 0;
      B.dq[at] = B.eGr[gi] * B.dQh[at] + B.sq[at];
      B.db[at] = B.eGp[gi] * B.dBh[at] + B.sb[at];
      B.da[at] = B.tail[gi] * B.dAt[at] + B.sa[at];
      B.dk[at] = B.tail[gi] * B.dKt[at] + B.sk[at];
      const double written = double(B.At[at]) * B.dAt[at] + double(B.Kt[at]) * B.dKt[at];
      dGr[di] += double(B.Qh[at]) * B.dQh[at] - written + double(q[i]) * B.sq[at] - double(k[i]) * B.sk[at] -
                 double(a[i]) * B.sa[at];
      dGp[di] += double(B.Bh[at]) * B.dBh[at] + double(b[i]) * B.sb[at];
      dGl[di] += written;
    }
  }
  if (!dg) return;
  // G_r = g_0 + .. + g_r: dg_r = sum of dG over rows r .. n-1.
  for (int i = 0; i < gw; ++i) {
    double sum = 0;
    for (int r = n - 1; r >= 0; --r) {
      sum += B.dG[std::size_t(r + 1) * gw + i];
      dg[std::size_t(r) * gw + i] = float(sum);
    }
  }
}

}  // namespace

std::size_t chunked_dplr_forward_floats(const Problem& p) {
  return std::size_t(std::max(1, std::min<int>(omp_get_max_threads(), int(p.slices())))) *
         carve(dims_of(p), nullptr, false).used;
}

std::size_t chunked_dplr_backward_floats(const Problem& p) {
  return std::size_t(std::max(1, std::min<int>(omp_get_max_threads(), int(p.slices() / p.group())))) *
         carve(dims_of(p), nullptr, true).used;
}

void chunked_dplr_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const Dims d = dims_of(p);
  const long slices = long(p.slices());
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int(slices)));
  const std::size_t per_thread = carve(d, nullptr, false).used;
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(d, scratch.data() + omp_get_thread_num() * per_thread, false);
    std::fill_n(B.minus, d.C, -1.0f);
#pragma omp for schedule(dynamic, 1)
    for (long index = 0; index < slices; ++index) {
      const HeadSlice h = p.slice(std::size_t(index));
      tile::pack(a.h0 + h.state, d.Dv, false, d.Dk, d.Dv, nullptr, B.Sp);
      for (int chunk = 0; chunk < slice_chunks(p, h); ++chunk) {
        const Chunk c = chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g);
        forward_chunk(B, d, c, a.o + h.value + std::size_t(chunk) * p.chunk * d.Dv);
      }
      tile::unpack(B.Sp, d.Dk, d.Dv, a.hT + h.state, d.Dv);
    }
  }
}

void chunked_dplr_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const Dims d = dims_of(p);
  const int G = p.group();
  const long groups = long(p.slices()) / G;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int(groups)));
  const std::size_t per_thread = carve(d, nullptr, true).used, SF = d.SF;
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(d, scratch.data() + omp_get_thread_num() * per_thread, true);
    std::fill_n(B.minus, d.C, -1.0f);
#pragma omp for schedule(dynamic, 1)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {
        const HeadSlice h = p.slice(std::size_t(group) * G + member);
        const int chunks = slice_chunks(p, h);
        // The states entering the chunks, by the forward (the last chunk's own is not needed).
        tile::pack(a.h0 + h.state, d.Dv, false, d.Dk, d.Dv, nullptr, B.Sp);
        for (int chunk = 0; chunk < chunks; ++chunk) {
          std::copy_n(B.Sp, SF, B.states + std::size_t(chunk) * SF);
          if (chunk + 1 < chunks) forward_chunk(B, d, chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g), nullptr);
        }
        tile::pack(a.dhT + h.state, d.Dv, false, d.Dk, d.Dv, nullptr, B.dSp);
        const std::size_t low = p.low_rank_offset(h);
        for (int chunk = chunks - 1; chunk >= 0; --chunk) {
          const Chunk c = chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g);
          const std::size_t t0 = std::size_t(chunk) * p.chunk, rows = std::size_t(c.n) * d.Dk;
          std::copy_n(B.states + std::size_t(chunk) * SF, SF, B.Sp);
          backward_chunk(B, d, c, a.dO + h.value + t0 * d.Dv, a.dv + h.value + t0 * d.Dv,
                         a.dg ? a.dg + h.gate + t0 * p.gate_width() : nullptr);
          std::copy_n(B.da, rows, a.da + low + t0 * d.Dk);
          std::copy_n(B.db, rows, a.db + low + t0 * d.Dk);
          float *dq = a.dq + h.key + t0 * d.Dk, *dk = a.dk + h.key + t0 * d.Dk;
          if (member == 0) {
            std::copy_n(B.dq, rows, dq);
            std::copy_n(B.dk, rows, dk);
          } else {
            for (std::size_t i = 0; i < rows; ++i) dq[i] += B.dq[i];
            for (std::size_t i = 0; i < rows; ++i) dk[i] += B.dk[i];
          }
        }
        tile::unpack(B.dSp, d.Dk, d.Dv, a.dh0 + h.state, d.Dv);
      }
  }
}

}  // namespace lattn::cpu

// The diagonal-plus-low-rank rule's chunked form on the CPU, float32, forward and backward (docs/spec.md
// section 1f), every decay and the shapes of section 1c, in the form of flash-linear-attention's
// naive dplr_chunkwise. Reference: kernels/linear_attention/reference_dplr.cpp; the scan:
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
// Every gate factor is exp of a difference <= 0 within the chunk, formed in double: the pairs'
// factors one exp per (pair, channel), exp(G_r - G_m) = exp(g_r) exp(G_{r-1} - G_m) shared by the
// four products, so strong gates (gate_norm 1: cumulative log-gates of -50 and below over a chunk)
// neither overflow nor lose the small factors to exp(G) exp(-G).
//
// The backward walks the chunks in reverse with dS, the gradient of the state leaving the chunk, and
// S the state entering it (the backward runs the forward first and keeps every chunk's entering
// state; the forward keeps none):
//   dU = s A_qa^T dO + A~ dS,  dY = T^T dU,  dV = s A_qk^T dO + K~ dS + A_bk^T dY
//   dA_qa = s dO U^T, dA_qk = s dO V^T (m <= r); dA_bk = dY V^T, dA_ba = dY U^T (m < r)
//   dQ^ = s dO S^T, dB^ = dY S^T, dA~ = U dS^T, dK~ = V dS^T
//   dS <- exp(G_{n-1}) dS + Q^^T (s dO) + B^^T dY
// and the products' and operands' gradients reach q, k, a, b and the log-gates G through their
// factors; dg_r is the sum of dG over the chunk's rows from r on.
//
// The chunk size is the case's `chunk` key, so it defaults to the kernel suite's 128, every rule's
// default. The intra-chunk products cost O(C) per token (and one exp per pair and channel, C / 2 per
// token and channel: 64 at 128, 8 at 16) against the state products' O(Dk Dv), so short chunks suit
// them: flash-linear-attention runs DPLR at 16 for that reason, and `--chunk 16` is the setting to
// start from. The kernel takes any C; which one is fastest on a CPU is a measurement not yet made.
//
// Items: the forward's are (sequence, value head) pairs; the backward's whole groups (the value
// heads of one sequence sharing a q/k head), the first writing dq and dk, the later adding theirs.
// Over 500 lines: the forward chunk's steps are the backward's first, and its gradient lines follow
// them one for one; the two are read together.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu/dplr.hpp"

namespace lattn::cpu {
namespace {

struct Dims {
  int Dk, Dv, C;  // C: rows of the buffers (the chunk, or the longest sequence when shorter)
  int gw;         // log-gates per token kept: Dk for vector gates, 1 otherwise
  int chunks;     // the most chunks a slice has
  float s;
};

Dims dims_of(const Problem& p) {
  int longest = 0;
  for (int n = 0; n < p.sequences(); ++n) longest = std::max(longest, p.slice(std::size_t(n) * p.heads).seq);
  Dims d;
  d.Dk = p.dim;
  d.Dv = p.value_dim();
  d.C = std::max(1, std::min(p.chunk, longest));
  d.gw = p.decay == Decay::vector ? p.dim : 1;
  d.chunks = (longest + p.chunk - 1) / p.chunk;
  d.s = float(attention_scale(p.dim));
  return d;
}

// One thread's buffers (base null: only counted).
struct Buffers {
  double *G, *dG;                     // (C + 1) x gw: row 0 is G_{-1} = 0, row r + 1 is G_r; its gradient
  float *eg, *fb;                     // exp(g_r): C x gw; one pair's factors: Dk
  float *eGr, *eGp, *tail;            // exp(G_r), exp(G_{r-1}), exp(G_{n-1} - G_r): C x gw each
  float *Qh, *Bh, *At, *Kt, *eL;      // C x Dk each; exp(G_{n-1}): Dk
  float *Aqk, *Aqa, *Abk, *Aba, *T;   // C x C each
  float *Y, *U;                       // C x Dv
  // backward
  float *dAqk, *dAqa, *dAbk, *dAba;   // C x C
  float *dU, *dY, *dV, *sdO;          // C x Dv (sdO: s dO)
  float *dQh, *dBh, *dAt, *dKt;       // C x Dk
  float *dq, *dk, *da, *db;           // C x Dk: the chunk's rows
  float *S, *dS, *dSn;                // Dk x Dv: the state; its gradient and the next one's
  float *states;                      // chunks x Dk x Dv: the states entering the chunks
  std::size_t used = 0;
};

Buffers carve(const Dims& d, float* base, bool backward) {
  Buffers b{};
  auto take = [&](std::size_t n) {
    float* out = base ? base + b.used : nullptr;
    b.used += (n + 15) / 16 * 16;  // each buffer on its own cache line
    return out;
  };
  const std::size_t C = d.C, Dk = d.Dk, Dv = d.Dv, gw = d.gw, DD = Dk * Dv;
  b.G = reinterpret_cast<double*>(take(2 * (C + 1) * gw));
  b.dG = reinterpret_cast<double*>(take(backward ? 2 * (C + 1) * gw : 0));
  for (float** x : {&b.eg, &b.eGr, &b.eGp, &b.tail}) *x = take(C * gw);
  b.fb = take(Dk);
  for (float** x : {&b.Qh, &b.Bh, &b.At, &b.Kt}) *x = take(C * Dk);
  b.eL = take(Dk);
  for (float** x : {&b.Aqk, &b.Aqa, &b.Abk, &b.Aba, &b.T}) *x = take(C * C);
  for (float** x : {&b.Y, &b.U}) *x = take(C * Dv);
  const std::size_t bw = backward ? 1 : 0;
  for (float** x : {&b.dAqk, &b.dAqa, &b.dAbk, &b.dAba}) *x = take(bw * C * C);
  for (float** x : {&b.dU, &b.dY, &b.dV, &b.sdO}) *x = take(bw * C * Dv);
  for (float** x : {&b.dQh, &b.dBh, &b.dAt, &b.dKt, &b.dq, &b.dk, &b.da, &b.db}) *x = take(bw * C * Dk);
  b.S = take(DD);
  for (float** x : {&b.dS, &b.dSn}) *x = take(bw * DD);
  b.states = take(bw * std::size_t(d.chunks) * DD);
  return b;
}

// ---- small row-major products (the inner loops run over contiguous columns) ----

// C (m x n) = beta C + A (m x k) B (k x n).
void gemm_nn(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc, bool add) {
  for (int i = 0; i < m; ++i) {
    float* __restrict c = C + std::size_t(i) * ldc;
    if (!add) std::fill_n(c, n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float a = A[std::size_t(i) * lda + p];
      const float* __restrict b = B + std::size_t(p) * ldb;
#pragma omp simd
      for (int j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

// C (m x n) = beta C + A^T B, A (k x m), B (k x n).
void gemm_tn(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc, bool add) {
  if (!add)
    for (int i = 0; i < m; ++i) std::fill_n(C + std::size_t(i) * ldc, n, 0.0f);
  for (int p = 0; p < k; ++p) {
    const float* __restrict b = B + std::size_t(p) * ldb;
    for (int i = 0; i < m; ++i) {
      const float a = A[std::size_t(p) * lda + i];
      float* __restrict c = C + std::size_t(i) * ldc;
#pragma omp simd
      for (int j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

// C (m x n) = beta C + A B^T, A (m x k), B (n x k).
void gemm_nt(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc, bool add) {
  for (int i = 0; i < m; ++i) {
    const float* __restrict a = A + std::size_t(i) * lda;
    for (int j = 0; j < n; ++j) {
      const float* __restrict b = B + std::size_t(j) * ldb;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int p = 0; p < k; ++p) acc += a[p] * b[p];
      float& c = C[std::size_t(i) * ldc + j];
      c = add ? c + acc : acc;
    }
  }
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

// G_r (row r + 1 of B.G), exp(g_r), and the gated operands Q^, B^, A~, K~ and exp(G_{n-1}).
void gate_operands(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, gw = d.gw;
  std::fill_n(B.G, gw, 0.0);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < gw; ++i) {
      const double g = c.g ? double(c.g[std::size_t(r) * gw + i]) : c.log_gamma;
      B.G[std::size_t(r + 1) * gw + i] = B.G[std::size_t(r) * gw + i] + g;
      B.eg[std::size_t(r) * gw + i] = float(std::exp(g));
    }
  const double* last = B.G + std::size_t(n) * gw;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < gw; ++i) {
      const std::size_t at = std::size_t(r) * gw + i;
      const double Gr = B.G[at + gw], Gp = B.G[at];
      B.eGr[at] = float(std::exp(Gr));
      B.eGp[at] = float(std::exp(Gp));
      B.tail[at] = float(std::exp(last[i] - Gr));
    }
  for (int i = 0; i < Dk; ++i) B.eL[i] = float(std::exp(last[gw == 1 ? 0 : i]));
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk, gr = std::size_t(r) * gw;
    for (int i = 0; i < Dk; ++i) {
      const std::size_t gi = gr + (gw == 1 ? 0 : i);
      B.Qh[row + i] = c.q[row + i] * B.eGr[gi];
      B.Bh[row + i] = c.b[row + i] * B.eGp[gi];
      B.At[row + i] = c.a[row + i] * B.tail[gi];
      B.Kt[row + i] = c.k[row + i] * B.tail[gi];
    }
  }
}

// The factors exp(G_{r-1} - G_m) of pair (r, m), m < r, per key channel, into B.fb.
void pair_factors(const Buffers& B, const Dims& d, int r, int m) {
  const int gw = d.gw;
  const double *Gp = B.G + std::size_t(r) * gw, *Gm = B.G + std::size_t(m + 1) * gw;
  if (gw == 1) {
    std::fill_n(B.fb, d.Dk, exp_nonpositive(float(std::min(0.0, Gp[0] - Gm[0]))));
    return;
  }
#pragma omp simd
  for (int i = 0; i < d.Dk; ++i) B.fb[i] = exp_nonpositive(float(std::min(0.0, Gp[i] - Gm[i])));
}

// The four gated products and T = (I - A_ba)^-1.
void chunk_scores(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, C = d.C, gw = d.gw;
  for (float* x : {B.Aqk, B.Aqa, B.Abk, B.Aba}) std::fill_n(x, std::size_t(n) * C, 0.0f);
  for (int r = 0; r < n; ++r) {
    const float *q = c.q + std::size_t(r) * Dk, *b = c.b + std::size_t(r) * Dk, *eg = B.eg + std::size_t(r) * gw;
    for (int m = 0; m < r; ++m) {
      pair_factors(B, d, r, m);
      const float *k = c.k + std::size_t(m) * Dk, *a = c.a + std::size_t(m) * Dk, *f = B.fb;
      float qk = 0, qa = 0, bk = 0, ba = 0;
#pragma omp simd reduction(+ : qk, qa, bk, ba)
      for (int i = 0; i < Dk; ++i) {
        const float fq = f[i] * eg[gw == 1 ? 0 : i];
        qk += q[i] * k[i] * fq;
        qa += q[i] * a[i] * fq;
        bk += b[i] * k[i] * f[i];
        ba += b[i] * a[i] * f[i];
      }
      const std::size_t at = std::size_t(r) * C + m;
      B.Aqk[at] = qk, B.Aqa[at] = qa, B.Abk[at] = bk, B.Aba[at] = ba;
    }
    const float *k = c.k + std::size_t(r) * Dk, *a = c.a + std::size_t(r) * Dk;
    float qk = 0, qa = 0;
#pragma omp simd reduction(+ : qk, qa)
    for (int i = 0; i < Dk; ++i) {
      qk += q[i] * k[i];
      qa += q[i] * a[i];
    }
    B.Aqk[std::size_t(r) * C + r] = qk;
    B.Aqa[std::size_t(r) * C + r] = qa;
  }
  // T = (I - A_ba)^-1 by forward substitution: T[r][m] = sum_{m <= l < r} A_ba[r][l] T[l][m].
  std::fill_n(B.T, std::size_t(n) * C, 0.0f);
  for (int r = 0; r < n; ++r) {
    float* t = B.T + std::size_t(r) * C;
    for (int l = 0; l < r; ++l) {
      const float x = B.Aba[std::size_t(r) * C + l];
      const float* tl = B.T + std::size_t(l) * C;
      for (int m = 0; m <= l; ++m) t[m] += x * tl[m];
    }
    t[r] = 1.0f;
  }
}

// U = T (A_bk V + B^ S) (Y = A_bk V + B^ S kept for the backward).
void chunk_u(const Buffers& B, const Dims& d, const Chunk& c) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, C = d.C;
  gemm_nn(n, Dv, Dk, B.Bh, Dk, B.S, Dv, B.Y, Dv, false);
  gemm_nn(n, Dv, n, B.Abk, C, c.v, Dv, B.Y, Dv, true);
  gemm_nn(n, Dv, n, B.T, C, B.Y, Dv, B.U, Dv, false);
}

// One chunk forward from B.S, left as the state leaving it; o (the chunk's rows) when given.
void forward_chunk(const Buffers& B, const Dims& d, const Chunk& c, float* o) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, C = d.C;
  gate_operands(B, d, c);
  chunk_scores(B, d, c);
  chunk_u(B, d, c);
  if (o) {
    gemm_nn(n, Dv, Dk, B.Qh, Dk, B.S, Dv, o, Dv, false);
    gemm_nn(n, Dv, n, B.Aqa, C, B.U, Dv, o, Dv, true);
    gemm_nn(n, Dv, n, B.Aqk, C, c.v, Dv, o, Dv, true);
    for (std::size_t i = 0; i < std::size_t(n) * Dv; ++i) o[i] *= d.s;
  }
  for (int i = 0; i < Dk; ++i) {
    float* __restrict row = B.S + std::size_t(i) * Dv;
    const float e = B.eL[i];
#pragma omp simd
    for (int j = 0; j < Dv; ++j) row[j] *= e;
  }
  gemm_tn(Dk, Dv, n, B.At, Dk, B.U, Dv, B.S, Dv, true);
  gemm_tn(Dk, Dv, n, B.Kt, Dk, c.v, Dv, B.S, Dv, true);
}

int slice_chunks(const Problem& p, const HeadSlice& h) { return (h.seq + p.chunk - 1) / p.chunk; }

// The gradients of one chunk (the file's header), from dS (B.dS, the state leaving it) and S (B.S,
// the state entering it): the entering state's gradient into B.dSn, the chunk's rows' dq, dk, da
// and db into B.dq, B.dk, B.da, B.db, dv (the chunk's rows) and dg (the chunk's rows, when gated).
void backward_chunk(const Buffers& B, const Dims& d, const Chunk& c, const float* dO, float* dv, float* dg) {
  const int n = c.n, Dk = d.Dk, Dv = d.Dv, C = d.C, gw = d.gw;
  gate_operands(B, d, c);
  chunk_scores(B, d, c);
  chunk_u(B, d, c);
  for (std::size_t i = 0; i < std::size_t(n) * Dv; ++i) B.sdO[i] = d.s * dO[i];
  // dU = A~ dS + A_qa^T (s dO); dV = K~ dS + A_qk^T (s dO) (the products' causal halves).
  gemm_nn(n, Dv, Dk, B.At, Dk, B.dS, Dv, B.dU, Dv, false);
  gemm_nn(n, Dv, Dk, B.Kt, Dk, B.dS, Dv, B.dV, Dv, false);
  for (int r = 0; r < n; ++r)
    for (int m = 0; m <= r; ++m) {
      const float xa = B.Aqa[std::size_t(r) * C + m], xk = B.Aqk[std::size_t(r) * C + m];
      const float* __restrict o = B.sdO + std::size_t(r) * Dv;
      float *__restrict du = B.dU + std::size_t(m) * Dv, *__restrict dvm = B.dV + std::size_t(m) * Dv;
#pragma omp simd
      for (int j = 0; j < Dv; ++j) {
        du[j] += xa * o[j];
        dvm[j] += xk * o[j];
      }
    }
  // dY = T^T dU; dV += A_bk^T dY.
  gemm_tn(n, Dv, n, B.T, C, B.dU, Dv, B.dY, Dv, false);
  gemm_tn(n, Dv, n, B.Abk, C, B.dY, Dv, B.dV, Dv, true);
  std::copy(B.dV, B.dV + std::size_t(n) * Dv, dv);
  // The products' gradients (only their causal parts are read): dA_qa = s dO U^T, dA_qk = s dO V^T,
  // dA_bk = dY V^T, dA_ba = dY U^T.
  gemm_nt(n, n, Dv, B.sdO, Dv, B.U, Dv, B.dAqa, C, false);
  gemm_nt(n, n, Dv, B.sdO, Dv, c.v, Dv, B.dAqk, C, false);
  gemm_nt(n, n, Dv, B.dY, Dv, c.v, Dv, B.dAbk, C, false);
  gemm_nt(n, n, Dv, B.dY, Dv, B.U, Dv, B.dAba, C, false);
  // The gated operands': dQ^ = s dO S^T, dB^ = dY S^T, dA~ = U dS^T, dK~ = V dS^T.
  gemm_nt(n, Dk, Dv, B.sdO, Dv, B.S, Dv, B.dQh, Dk, false);
  gemm_nt(n, Dk, Dv, B.dY, Dv, B.S, Dv, B.dBh, Dk, false);
  gemm_nt(n, Dk, Dv, B.U, Dv, B.dS, Dv, B.dAt, Dk, false);
  gemm_nt(n, Dk, Dv, c.v, Dv, B.dS, Dv, B.dKt, Dk, false);
  // The entering state's: exp(G_{n-1}) dS + Q^^T (s dO) + B^^T dY; and dG_{n-1} += exp(G_{n-1}) rowsum(S . dS).
  // dG row r + 1 is G_r's gradient (row 0, G_{-1} = 0, is a constant's and is not read).
  std::fill_n(B.dG, std::size_t(n + 1) * gw, 0.0);
  double* dGl = B.dG + std::size_t(n) * gw;
  for (int i = 0; i < Dk; ++i) {
    const float *__restrict Si = B.S + std::size_t(i) * Dv, *__restrict dSi = B.dS + std::size_t(i) * Dv;
    float* __restrict out = B.dSn + std::size_t(i) * Dv;
    const float e = B.eL[i];
    float acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int j = 0; j < Dv; ++j) {
      acc += Si[j] * dSi[j];
      out[j] = e * dSi[j];
    }
    dGl[gw == 1 ? 0 : i] += double(e) * acc;
  }
  gemm_tn(Dk, Dv, n, B.Qh, Dk, B.sdO, Dv, B.dSn, Dv, true);
  gemm_tn(Dk, Dv, n, B.Bh, Dk, B.dY, Dv, B.dSn, Dv, true);
  // The operands' factors: Q^ = exp(G_r) q, B^ = exp(G_{r-1}) b, A~ = exp(G_{n-1} - G_r) a, K~ likewise.
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk, gr = std::size_t(r) * gw;
    double *dGr = B.dG + gr + gw, *dGp = B.dG + gr;
    for (int i = 0; i < Dk; ++i) {
      const std::size_t at = row + i, gi = gr + (gw == 1 ? 0 : i);
      const int di = gw == 1 ? 0 : i;
      B.dq[at] = B.eGr[gi] * B.dQh[at];
      B.db[at] = B.eGp[gi] * B.dBh[at];
      B.da[at] = B.tail[gi] * B.dAt[at];
      B.dk[at] = B.tail[gi] * B.dKt[at];
      const double written = double(B.At[at]) * B.dAt[at] + double(B.Kt[at]) * B.dKt[at];
      dGr[di] += double(B.Qh[at]) * B.dQh[at] - written;
      dGp[di] += double(B.Bh[at]) * B.dBh[at];
      dGl[di] += written;
    }
  }
  // The products' pairs: factors exp(G_{r-1} - G_m) (b rows) and exp(G_r - G_m) (q rows), m < r;
  // the diagonal of A_qk and A_qa has factor 1 and no gate gradient.
  for (int r = 0; r < n; ++r) {
    const std::size_t row = std::size_t(r) * Dk;
    const float *q = c.q + row, *b = c.b + row, *eg = B.eg + std::size_t(r) * gw;
    float *dq = B.dq + row, *db = B.db + row;
    double *dGr = B.dG + std::size_t(r + 1) * gw, *dGp = B.dG + std::size_t(r) * gw;
    for (int m = 0; m < r; ++m) {
      pair_factors(B, d, r, m);
      const std::size_t mrow = std::size_t(m) * Dk, at = std::size_t(r) * C + m;
      const float *k = c.k + mrow, *a = c.a + mrow, *f = B.fb;
      float *dk = B.dk + mrow, *da = B.da + mrow;
      double* dGm = B.dG + std::size_t(m + 1) * gw;
      const float xqk = B.dAqk[at], xqa = B.dAqa[at], xbk = B.dAbk[at], xba = B.dAba[at];
      for (int i = 0; i < Dk; ++i) {
        const int di = gw == 1 ? 0 : i;
        const float fb = f[i], fq = fb * eg[di];
        const float pq = xqk * k[i] + xqa * a[i], pb = xbk * k[i] + xba * a[i];
        dq[i] += fq * pq;
        db[i] += fb * pb;
        dk[i] += xqk * q[i] * fq + xbk * b[i] * fb;
        da[i] += xqa * q[i] * fq + xba * b[i] * fb;
        const double gq = double(q[i]) * fq * pq, gb = double(b[i]) * fb * pb;
        dGr[di] += gq;
        dGp[di] += gb;
        dGm[di] -= gq + gb;
      }
    }
    const float xqk = B.dAqk[std::size_t(r) * C + r], xqa = B.dAqa[std::size_t(r) * C + r];
    const float *k = c.k + row, *a = c.a + row;
    float *dk = B.dk + row, *da = B.da + row;
    for (int i = 0; i < Dk; ++i) {
      dq[i] += xqk * k[i] + xqa * a[i];
      dk[i] += xqk * q[i];
      da[i] += xqa * q[i];
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
#pragma omp for schedule(dynamic, 1)
    for (long index = 0; index < slices; ++index) {
      const HeadSlice h = p.slice(std::size_t(index));
      std::copy_n(a.h0 + h.state, p.head_state_elems(), B.S);
      for (int chunk = 0; chunk < slice_chunks(p, h); ++chunk) {
        const Chunk c = chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g);
        forward_chunk(B, d, c, a.o + h.value + std::size_t(chunk) * p.chunk * d.Dv);
      }
      std::copy_n(B.S, p.head_state_elems(), a.hT + h.state);
    }
  }
}

void chunked_dplr_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const Dims d = dims_of(p);
  const int G = p.group();
  const long groups = long(p.slices()) / G;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int(groups)));
  const std::size_t per_thread = carve(d, nullptr, true).used, DD = p.head_state_elems();
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(d, scratch.data() + omp_get_thread_num() * per_thread, true);
#pragma omp for schedule(dynamic, 1)
    for (long group = 0; group < groups; ++group)
      for (int member = 0; member < G; ++member) {
        const HeadSlice h = p.slice(std::size_t(group) * G + member);
        const int chunks = slice_chunks(p, h);
        // The states entering the chunks, by the forward.
        std::copy_n(a.h0 + h.state, DD, B.S);
        for (int chunk = 0; chunk < chunks; ++chunk) {
          std::copy_n(B.S, DD, B.states + std::size_t(chunk) * DD);
          forward_chunk(B, d, chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g), nullptr);
        }
        std::copy_n(a.dhT + h.state, DD, B.dS);
        const std::size_t low = p.low_rank_offset(h);
        for (int chunk = chunks - 1; chunk >= 0; --chunk) {
          const Chunk c = chunk_of(p, h, chunk, a.q, a.k, a.v, a.a, a.b, a.g);
          const std::size_t t0 = std::size_t(chunk) * p.chunk, rows = std::size_t(c.n) * d.Dk;
          std::copy_n(B.states + std::size_t(chunk) * DD, DD, B.S);
          backward_chunk(B, d, c, a.dO + h.value + t0 * d.Dv, a.dv + h.value + t0 * d.Dv,
                         a.dg ? a.dg + h.gate + t0 * p.gate_width() : nullptr);
          std::copy_n(B.dSn, DD, B.dS);
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
        std::copy_n(B.dS, DD, a.dh0 + h.state);
      }
  }
}

}  // namespace lattn::cpu

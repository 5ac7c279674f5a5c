// Chunkwise-parallel form on the CPU with the register-tiled AVX-512 products of tile_gemm.hpp,
// float32, forward and backward (the mathematics is in cpu_chunked_tiled.hpp's header and docs/spec.md section 1).
// Over 500 lines: the forward and backward share the packing, the chunk-state layout and the
// split of heads or chunks over threads, and read best side by side.
//
// Per chunk of n rows, forward (S kept packed in panels for the whole head):
//   A    = (Q K^T) . M                    lower output: tiles above the diagonal are not computed
//   O    = s ( diag(lam) (Q S) + A V )    one accumulator, k of A V cut at the tile's last row
//   S    = gamma^n S + K^T (diag(gam) V)
// Backward, from the state entering each chunk (kept by the forward, or recomputed by a forward
// sweep of the state products alone):
//   P    = s (Q K^T) . M,  dA = s (dO V^T) . M                          (lower outputs)
//   dQ   = diag(s lam) (dO S^T) + dA K                                  (k of dA K: j <= i)
//   dK   = diag(gam) (V dS^T) + dA^T Q,  dV = diag(gam) (K dS) + P^T dO  (k of dA^T Q: j >= i)
//   dS   = gamma^n dS + Q^T (diag(s lam) dO)
// Threads split batch x heads; each thread's scratch is one contiguous block (closed form in
// chunked_tiled_*_floats, held by tests/test_memory.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <utility>

#include "kernels/linear_attention/cpu_chunked_tiled.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/cpu/tile_gemm.hpp"

namespace lattn::cpu {
namespace {
int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }
using tile::panel_cols;

// Fewer heads than threads: all threads work on one head at a time, split over its chunks
// (below). Otherwise each thread takes whole heads and walks their chunks in order.
bool split_chunks(const Problem& p) { return long(p.heads_total()) < omp_get_max_threads() && p.chunks() > 1; }

int tiled_threads(const Problem& p) {
  return split_chunks(p) ? std::min(omp_get_max_threads(), p.chunks()) : head_parallel_threads(p);
}

// Row stride of the backward's score matrices P and dA: their transposes are read down columns
// (dA^T Q, P^T dO), and C = 128 floats (512 bytes) apart the column's lines would crowd 8 of L1's
// 64 sets; 16 floats more spreads them.
int score_ld(int C) { return C + 16; }

std::size_t state_floats(const Problem& p) { return std::size_t(p.dim) * panel_cols(p.dim); }

std::size_t forward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), D = p.dim, PD = panel_cols(p.dim), PC = panel_cols(int(C));
  return 2 * C * C + D * PC + 2 * C * PD + D * PD + 3 * C + 1;
}

std::size_t backward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), D = p.dim, PD = panel_cols(p.dim), PC = panel_cols(int(C));
  return C * C + 2 * C * score_ld(int(C)) + 2 * D * PC + 4 * C * PD + 3 * D * PD + 3 * C + 1;
}

}  // namespace

std::size_t chunked_tiled_kept_states_floats(const Problem& p) {
  return p.heads_total() * std::size_t(p.chunks()) * state_floats(p);
}

// Split over chunks, the forward's chunk states live in the kept block when there is one.
std::size_t chunked_tiled_forward_floats(const Problem& p, bool keep) {
  const std::size_t chunk_states = keep ? 0 : std::size_t(p.chunks()) * state_floats(p);
  const std::size_t shared = split_chunks(p) ? chunk_states + state_floats(p) : 0;
  return shared + std::size_t(tiled_threads(p)) * forward_thread_floats(p);
}

std::size_t chunked_tiled_backward_floats(const Problem& p, bool kept) {
  const std::size_t chunk_states = std::size_t(p.chunks()) * state_floats(p);
  const std::size_t threads = std::size_t(tiled_threads(p)), bt = backward_thread_floats(p);
  if (split_chunks(p)) return (kept ? 1 : 2) * chunk_states + state_floats(p) + threads * bt;
  return threads * ((kept ? 0 : chunk_states) + bt);
}

#if defined(__AVX512F__)
namespace {

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
void decay_tables(float gamma, int C, float* pw, float* mask) {
  pw[0] = 1.0f;
  for (int i = 1; i <= C; ++i) pw[i] = float(std::pow(double(gamma), double(i)));
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) mask[std::size_t(i) * C + j] = j <= i ? pw[i - j] : 0.0f;
}

// Row-major n x D chunk rows are a B operand in place when D is exactly one 32-wide panel (rows
// 128 bytes apart: the panel is contiguous). Wider, a panel's rows are D * 4 bytes apart and
// crowd L1 sets; packed was faster already at D = 64 (one core: ~85 against ~70 GFLOP/s).
bool rows_in_place(int D) { return D == tile::kNR; }

// B = the n x D rows X: in place, or packed into Xp.
const float* rows_operand(const float* X, int n, int D, float* Xp, long& brs) {
  if (rows_in_place(D)) {
    brs = D;
    return X;
  }
  tile::pack(X, D, false, n, D, nullptr, Xp);
  brs = 0;
  return Xp;
}

// Y = beta Y + alpha X^T (diag(w) Z) for chunk rows X, Z (n x D, row-major), Y a packed D x D
// state: the chunk's contribution to S (X = K, Z = V, w = gam) or to dS (X = Q, Z = dO,
// w = lam, alpha = s). Zp: scratch panels of n x D.
// A B operand of the products: packed panels (brs = 0) or row-major rows in place (brs their stride).
struct Operand {
  const float* b;
  long brs;
};

// The next chunk's rows of q, k, v (and dO in the backward; each `floats` long), for this chunk's
// products to prefetch while they compute: a chunk's products are compute-bound and its first
// reads of its rows memory-bound, and the hardware prefetchers did not overlap the two (seq 8192,
// 2 threads: chunked fwd 8% faster at D 128, 20% at D 64, alternating runs). In the backward's
// reverse walk (the chunk before): 2 threads 1.03-1.18x in two A/B runs of 5 and 6 rounds, 1
// thread 0.91-1.10x, within the noise there.
struct NextRows {
  const float *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  std::size_t floats = 0;
};

void prefetch_into(Product& u, const float* rows, std::size_t floats) {
  u.prefetch = rows;
  u.prefetch_floats = rows ? floats : 0;
}

// The state product with Z already an operand (the unweighted rows another product of the same
// chunk has packed); prefetches `next` (floats long) if given.
void state_product(float* Yp, int D, int n, const float* X, Operand Z, float alpha, float beta,
                   const float* next = nullptr, std::size_t next_floats = 0) {
  Product u;
  prefetch_into(u, next, next_floats);
  u.M = D;
  u.N = D;
  u.c = Yp;
  u.ldc = tile::kNR;
  u.cps = long(D) * tile::kNR;
  u.beta = beta;
  u.alpha = alpha;
  u.s1 = seg(Range::full, n, X, 1, D, Z.b, Z.brs);
  tile::run(u);
}

void state_product(float* Yp, int D, int n, const float* X, const float* Z, const float* w, float alpha, float beta,
                   float* Zp, const float* next = nullptr, std::size_t next_floats = 0) {
  Operand B{Zp, 0};
  if (w) tile::pack(Z, D, false, n, D, w, Zp);
  else B.b = rows_operand(Z, n, D, Zp, B.brs);
  state_product(Yp, D, n, X, B, alpha, beta, next, next_floats);
}

struct ChunkRows {
  int n;          // rows of this chunk
  std::size_t r;  // offset of its first row in a head's token tensor
};

ChunkRows chunk_rows(const Problem& p, int c) {
  const int C = effective_chunk(p), c0 = c * C;
  return {std::min(C, p.seq - c0), std::size_t(c0) * p.dim};
}

struct ForwardBuffers {
  float *mask, *A, *Ktp, *Vp, *Vg, *Sp, *pw, *lam, *gam;
};

ForwardBuffers forward_buffers(const Problem& p, float* base) {
  const int C = effective_chunk(p), D = p.dim;
  Carver carve{base};
  ForwardBuffers b;
  b.mask = carve.take(std::size_t(C) * C);
  b.A = carve.take(std::size_t(C) * C);
  b.Ktp = carve.take(std::size_t(D) * panel_cols(C));
  b.Vp = carve.take(std::size_t(C) * panel_cols(D));
  b.Vg = carve.take(std::size_t(C) * panel_cols(D));
  b.Sp = carve.take(state_floats(p));
  b.pw = carve.take(C + 1);
  b.lam = carve.take(C);
  b.gam = carve.take(C);
  return b;
}

// lam_i = scale gamma^(i+1), gam_j = gamma^(n-1-j) for a chunk of n rows.
void chunk_weights(const float* pw, int n, float scale, float* lam, float* gam) {
  for (int i = 0; i < n; ++i) {
    lam[i] = scale * pw[i + 1];
    gam[i] = pw[n - 1 - i];
  }
}

// O_c = s (diag(lam) Q_c S + ((Q_c K_c^T) . M) V_c) for the packed state S entering the chunk.
// Returns V_c as the operand it used, for the state product to reuse.
Operand chunk_output(const ForwardBuffers& b, int D, int C, int n, bool decay, const float* Qc, const float* Kc,
                     const float* Vc, float* Oc, const float* Sp, const NextRows& next = {}) {
  tile::pack(Kc, D, true, D, n, nullptr, b.Ktp);
  long vrs = 0;
  const float* Vb = rows_operand(Vc, n, D, b.Vp, vrs);
  Product scores;
  scores.M = n;
  scores.N = n;
  scores.c = b.A;
  scores.ldc = C;
  scores.s1 = seg(Range::full, D, Qc, D, 1, b.Ktp);
  scores.mask = b.mask;
  scores.ldm = C;
  scores.mask_all = decay;
  scores.lower = true;
  prefetch_into(scores, next.k, next.floats);
  tile::run(scores);

  Product out;
  prefetch_into(out, next.v, next.floats);
  out.M = n;
  out.N = D;
  out.c = Oc;
  out.ldc = D;
  out.s1 = seg(Range::full, D, Qc, D, 1, Sp);
  out.rs = decay ? b.lam : nullptr;
  out.s2 = seg(Range::lower, n, b.A, C, 1, Vb, vrs);
  out.alpha = float(attention_scale(D));
  tile::run(out);
  return {Vb, vrs};
}

// Walks elements [e0, e1) of the packed chunk states in order (reverse: last chunk first):
// each holds a chunk's own contribution on entry and the running state entering it (leaving it,
// in reverse) on exit; run starts as the initial state and ends as the final one.
void prefix_states(const Problem& p, float gamma, float* chunk_states, float* run, std::size_t e0, std::size_t e1,
                   bool reverse) {
  const std::size_t stride = state_floats(p);
  const int chunks = p.chunks();
  for (int step = 0; step < chunks; ++step) {
    const int c = reverse ? chunks - 1 - step : step;
    const float decay = float(std::pow(double(gamma), double(chunk_rows(p, c).n)));
    float* own = chunk_states + c * stride;
    for (std::size_t e = e0; e < e1; ++e) {
      const float u = own[e];
      own[e] = run[e];
      run[e] = decay * run[e] + u;
    }
  }
}

// This thread's share of [0, n).
std::pair<std::size_t, std::size_t> share(std::size_t n) {
  const std::size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

struct BackwardBuffers {
  float *mask, *P, *dA, *Ktp, *Vtp, *Kp, *Qp, *dOp, *dOl, *dSTp, *Sp, *dSp, *pw, *slam, *gam;
};

BackwardBuffers backward_buffers(const Problem& p, float* base) {
  const int C = effective_chunk(p), D = p.dim;
  Carver carve{base};
  BackwardBuffers b;
  b.mask = carve.take(std::size_t(C) * C);
  b.P = carve.take(std::size_t(C) * score_ld(C));
  b.dA = carve.take(std::size_t(C) * score_ld(C));
  b.Ktp = carve.take(std::size_t(D) * panel_cols(C));
  b.Vtp = carve.take(std::size_t(D) * panel_cols(C));
  b.Kp = carve.take(std::size_t(C) * panel_cols(D));
  b.Qp = carve.take(std::size_t(C) * panel_cols(D));
  b.dOp = carve.take(std::size_t(C) * panel_cols(D));
  b.dOl = carve.take(std::size_t(C) * panel_cols(D));
  b.dSTp = carve.take(state_floats(p));
  b.Sp = carve.take(state_floats(p));
  b.dSp = carve.take(state_floats(p));
  b.pw = carve.take(C + 1);
  b.slam = carve.take(C);
  b.gam = carve.take(C);
  return b;
}

// dQ_c, dK_c, dV_c of one chunk from S^T entering it (panels) and dS leaving it (packed).
// Returns dO_c as the operand it used, for the dS product to reuse.
Operand chunk_grads(const BackwardBuffers& b, int D, int C, int n, bool decay, const float* Qc, const float* Kc,
                    const float* Vc, const float* dOc, float* dQc, float* dKc, float* dVc, const float* STp,
                    const float* dSp, const NextRows& next = {}) {
  const float s = float(attention_scale(D));
  tile::pack(Kc, D, true, D, n, nullptr, b.Ktp);
  tile::pack(Vc, D, true, D, n, nullptr, b.Vtp);
  long krs = 0, qrs = 0, drs = 0;
  const float* Kb = rows_operand(Kc, n, D, b.Kp, krs);
  const float* Qb = rows_operand(Qc, n, D, b.Qp, qrs);
  const float* dOb = rows_operand(dOc, n, D, b.dOp, drs);
  tile::transpose_packed(dSp, D, b.dSTp);

  Product scores;
  scores.M = n;
  scores.N = n;
  scores.ldc = score_ld(C);
  scores.mask = b.mask;
  scores.ldm = C;
  scores.mask_all = decay;
  scores.lower = true;
  scores.alpha = s;
  scores.c = b.P;
  scores.s1 = seg(Range::full, D, Qc, D, 1, b.Ktp);
  prefetch_into(scores, next.k, next.floats);
  tile::run(scores);
  scores.c = b.dA;
  scores.s1 = seg(Range::full, D, dOc, D, 1, b.Vtp);
  prefetch_into(scores, next.v, next.floats);
  tile::run(scores);

  Product dq;
  dq.M = n;
  dq.N = D;
  dq.c = dQc;
  dq.ldc = D;
  dq.s1 = seg(Range::full, D, dOc, D, 1, STp);
  dq.rs = b.slam;
  dq.s2 = seg(Range::lower, n, b.dA, score_ld(C), 1, Kb, krs);
  prefetch_into(dq, next.q, next.floats);
  tile::run(dq);

  Product dk = dq;
  dk.c = dKc;
  dk.s1 = seg(Range::full, D, Vc, D, 1, b.dSTp);
  dk.rs = decay ? b.gam : nullptr;
  dk.s2 = seg(Range::upper, n, b.dA, 1, score_ld(C), Qb, qrs);
  prefetch_into(dk, next.dO, next.floats);
  tile::run(dk);

  Product dv = dk;
  prefetch_into(dv, nullptr, 0);
  dv.c = dVc;
  dv.s1 = seg(Range::full, D, Kc, D, 1, dSp);
  dv.s2 = seg(Range::upper, n, b.P, 1, score_ld(C), dOb, drs);
  tile::run(dv);
  return {dOb, drs};
}

// dS = beta dS + s Q_c^T diag(lam) dO_c (dS packed). Without decay lam = 1 and s is the
// product's alpha; with it, dO's rows are packed scaled by s lam.
// dO_packed: dO_c as an operand already (chunk_grads'), used when there is no decay to weight it.
void chunk_dstate(const BackwardBuffers& b, int D, int n, bool decay, const float* Qc, const float* dOc, float* dSp,
                  float beta, const Operand* dO_packed = nullptr) {
  const float s = float(attention_scale(D));
  if (decay) state_product(dSp, D, n, Qc, dOc, b.slam, 1.0f, beta, b.dOl);
  else if (dO_packed) state_product(dSp, D, n, Qc, *dO_packed, s, beta);
  else state_product(dSp, D, n, Qc, dOc, nullptr, s, beta, b.dOl);
}

// keep: where S^T entering each chunk of every head goes (panels, head-major), or null.
void forward_heads(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep) {
  const int D = p.dim, C = effective_chunk(p);
  const std::size_t SF = state_floats(p);
  const long heads_total = long(p.heads_total());
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, scratch + omp_get_thread_num() * forward_thread_floats(p));
// Dynamic: a thread descheduled by another job does not hold the others at the end.
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, b.pw, b.mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      tile::pack(a.h0 + st, D, false, D, D, nullptr, b.Sp);
      for (int c = 0; c < p.chunks(); ++c) {
        const auto [n, r] = chunk_rows(p, c);
        NextRows next;
        if (c + 1 < p.chunks()) {
          const auto [n1, r1] = chunk_rows(p, c + 1);
          next = {a.q + tok + r1, a.k + tok + r1, a.v + tok + r1, nullptr, std::size_t(n1) * D};
        }
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        if (keep) tile::transpose_packed(b.Sp, D, keep + (bh * p.chunks() + c) * SF);
        const Operand V =
            chunk_output(b, D, C, n, decay, a.q + tok + r, a.k + tok + r, a.v + tok + r, a.o + tok + r, b.Sp, next);
        if (decay) state_product(b.Sp, D, n, a.k + tok + r, a.v + tok + r, b.gam, 1.0f, b.pw[n], b.Vg, next.q, next.floats);
        else state_product(b.Sp, D, n, a.k + tok + r, V, 1.0f, b.pw[n], next.q, next.floats);
      }
      tile::unpack(b.Sp, D, D, a.hT + st, D);
    }
  }
}

// One head at a time, chunks split over the threads: the intra-chunk work has no sequential
// dependency, and the states entering the chunks come from a prefix over the chunks' own
// contributions K_c^T diag(gam) V_c, an O(chunks * D^2) walk split over state elements.
// keep: where S entering each chunk of every head goes (packed, head-major), or null; the
// prefix then runs in place there.
void forward_chunk_split(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep) {
  const int D = p.dim, C = effective_chunk(p), chunks = p.chunks();
  const std::size_t SF = state_floats(p);
  float* run = scratch;
  float* own_states = keep ? nullptr : run + SF;
  float* threads_base = keep ? run + SF : own_states + chunks * SF;
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, threads_base + omp_get_thread_num() * forward_thread_floats(p));
    const auto [e0, e1] = share(state_floats(p));
    for (long bh = 0; bh < long(p.heads_total()); ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, b.pw, b.mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      float* chunk_states = keep ? keep + bh * chunks * SF : own_states;
#pragma omp single
      tile::pack(a.h0 + st, D, false, D, D, nullptr, run);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, r] = chunk_rows(p, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        state_product(chunk_states + c * SF, D, n, a.k + tok + r, a.v + tok + r, decay ? b.gam : nullptr,
                      1.0f, 0.0f, b.Vg);
      }
      prefix_states(p, gamma, chunk_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single nowait
      tile::unpack(run, D, D, a.hT + st, D);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, r] = chunk_rows(p, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        chunk_output(b, D, C, n, decay, a.q + tok + r, a.k + tok + r, a.v + tok + r, a.o + tok + r,
                     chunk_states + c * SF);
      }
    }
  }
}

// kept: forward_heads' S^T panels, or null to recompute them per head into this thread's block.
void backward_heads(const Problem& p, const BackwardArgs<float>& a, float* scratch, const float* kept) {
  const int D = p.dim, C = effective_chunk(p), chunks = p.chunks();
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
  const std::size_t SF = state_floats(p);
  const std::size_t own_states = kept ? 0 : std::size_t(chunks) * SF;
  const std::size_t per_thread = own_states + backward_thread_floats(p);
#pragma omp parallel num_threads(tiled_threads(p))
  {
    float* own = scratch + omp_get_thread_num() * per_thread;
    const BackwardBuffers b = backward_buffers(p, own + own_states);
// Dynamic: a thread descheduled by another job does not hold the others at the end.
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, b.pw, b.mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      const float* states = kept ? kept + bh * chunks * SF : own;  // S^T entering each chunk, panels

      if (!kept) {
        tile::pack(a.h0 + st, D, false, D, D, nullptr, b.Sp);
        for (int c = 0; c < chunks; ++c) {
          const auto [n, r] = chunk_rows(p, c);
          tile::transpose_packed(b.Sp, D, own + c * SF);
          if (c + 1 == chunks) break;
          chunk_weights(b.pw, n, s, b.slam, b.gam);
          state_product(b.Sp, D, n, k + r, v + r, decay ? b.gam : nullptr, 1.0f, b.pw[n], b.Kp);
        }
      }

      tile::pack(a.dhT + st, D, false, D, D, nullptr, b.dSp);
      for (int c = chunks - 1; c >= 0; --c) {
        const auto [n, r] = chunk_rows(p, c);
        chunk_weights(b.pw, n, s, b.slam, b.gam);
        NextRows next;  // the chunk before, which this reverse walk reads next
        if (c > 0) {
          const auto [n0, r0] = chunk_rows(p, c - 1);
          next = {q + r0, k + r0, v + r0, dO + r0, std::size_t(n0) * D};
        }
        const Operand dOc = chunk_grads(b, D, C, n, decay, q + r, k + r, v + r, dO + r, a.dq + tok + r,
                                        a.dk + tok + r, a.dv + tok + r, states + c * SF, b.dSp, next);
        chunk_dstate(b, D, n, decay, q + r, dO + r, b.dSp, b.pw[n], &dOc);
      }
      tile::unpack(b.dSp, D, D, a.dh0 + st, D);
    }
  }
}

// The backward of forward_chunk_split: the entering states S_c by a forward prefix, the
// gradients dS leaving each chunk by a reverse prefix over the chunks' own contributions
// s Q_c^T diag(lam) dO_c, then every chunk's dQ, dK, dV independently.
// kept: forward_chunk_split's packed states, or null to recompute them.
void backward_chunk_split(const Problem& p, const BackwardArgs<float>& a, float* scratch, const float* kept) {
  const int D = p.dim, C = effective_chunk(p), chunks = p.chunks();
  const float s = float(attention_scale(D));
  const std::size_t SF = state_floats(p);
  float* dstates = scratch;  // dS leaving each chunk, packed
  float* run = dstates + chunks * SF;
  float* own_states = kept ? nullptr : run + SF;  // S entering each chunk, packed
  float* threads_base = kept ? run + SF : own_states + chunks * SF;
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const BackwardBuffers b = backward_buffers(p, threads_base + omp_get_thread_num() * backward_thread_floats(p));
    const auto [e0, e1] = share(SF);
    for (long bh = 0; bh < long(p.heads_total()); ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, b.pw, b.mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      const float* states = kept ? kept + bh * chunks * SF : own_states;
      if (!kept) {
#pragma omp single
        tile::pack(a.h0 + st, D, false, D, D, nullptr, run);
      }
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, r] = chunk_rows(p, c);
        chunk_weights(b.pw, n, s, b.slam, b.gam);
        if (!kept) state_product(own_states + c * SF, D, n, k + r, v + r, decay ? b.gam : nullptr, 1.0f, 0.0f, b.Kp);
        chunk_dstate(b, D, n, decay, q + r, dO + r, dstates + c * SF, 0.0f);
      }
      if (!kept) prefix_states(p, gamma, own_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single
      tile::pack(a.dhT + st, D, false, D, D, nullptr, run);
      prefix_states(p, gamma, dstates, run, e0, e1, true);
#pragma omp barrier
#pragma omp single nowait
      tile::unpack(run, D, D, a.dh0 + st, D);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, r] = chunk_rows(p, c);
        chunk_weights(b.pw, n, s, b.slam, b.gam);
        tile::transpose_packed(states + c * SF, D, b.Sp);
        chunk_grads(b, D, C, n, decay, q + r, k + r, v + r, dO + r, a.dq + tok + r, a.dk + tok + r, a.dv + tok + r,
                    b.Sp, dstates + c * SF);
      }
    }
  }
}

}  // namespace

void chunked_tiled_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  Workspace<float> scratch(allocator, chunked_tiled_forward_floats(p, keep != nullptr));
  if (split_chunks(p)) forward_chunk_split(p, a, scratch.data(), keep);
  else forward_heads(p, a, scratch.data(), keep);
}

void chunked_tiled_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  Workspace<float> scratch(allocator, chunked_tiled_backward_floats(p, kept != nullptr));
  if (split_chunks(p)) backward_chunk_split(p, a, scratch.data(), kept);
  else backward_heads(p, a, scratch.data(), kept);
}

#else
void chunked_tiled_forward(const Problem&, const ForwardArgs<float>&, Allocator&, float*) {
  throw std::logic_error("chunked_tiled_forward: built without AVX-512");
}
void chunked_tiled_backward(const Problem&, const BackwardArgs<float>&, Allocator&, const float*) {
  throw std::logic_error("chunked_tiled_backward: built without AVX-512");
}
#endif

}  // namespace lattn::cpu

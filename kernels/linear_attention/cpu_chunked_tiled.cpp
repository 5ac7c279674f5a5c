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
// Shapes (docs/spec.md section 1c): an item is one (sequence, value head) pair (Problem::slice);
// its q/k rows (Dk wide) are the value head's q/k head's, read in place, and its state is Dk x Dv,
// so Q K^T is n x Dk by Dk x n, Q S n x Dk by Dk x Dv, K^T V Dk x n by n x Dv, P V n x n by n x Dv.
// A packed document is its own sequence: its chunks start at its first token, and its last chunk
// is short (len - (chunks - 1) C rows) rather than padded, so a chunk never straddles two
// documents. That chunk's products take n rows as they are (the micro-tiles' tail rows and the
// panels' zero columns cover the remainder), so the cost of a short chunk is one chunk's fixed work
// (packing, the state transpose, tiles rounded up to 8 rows and 32 columns) per document, no
// padded tokens. Threads take whole items (a dense problem with fewer items than threads splits
// each item's chunks over them instead). With grouped q/k heads the forward's items are (sequence,
// q/k head, part) (GradParts): the part's value heads walk the chunks side by side, Q K^T made once
// per chunk for all of them (masked once without decay; retnet masks it per head with its gamma),
// and the q/k rows read once. The backward's dq and dk of a q/k head sum over its value
// heads: its items are (sequence, q/k head, part) (GradParts, cpu_chunk_products.hpp), a part's
// heads on one thread, the first writing the rows and the others adding. Each thread's scratch is
// one contiguous block (closed form in chunked_tiled_*_floats, held by tests/test_memory.cpp and
// tests/test_chunked_shapes.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <utility>

#include "kernels/linear_attention/cpu_chunked_tiled.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_chunk_products.hpp"
#include "kernels/cpu/tile_gemm.hpp"

namespace lattn::cpu {
namespace {
using tile::panel_cols;

// Fewer items than threads in a dense problem: all threads work on one item at a time, split over
// its chunks (below). Otherwise each thread takes whole items and walks their chunks in order
// (packed documents always: theirs are many and short).
bool split_chunks(const Problem& p) {
  return !p.packed() && long(p.slices()) < omp_get_max_threads() && p.chunks() > 1;
}

int item_threads(const Problem& p) { return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())); }

int tiled_threads(const Problem& p);

// The backward's items split over whole items (GradParts: sequence, q/k head, part).
int backward_item_threads(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), parts.items));
}

// A kept chunk state: S packed when split over chunks (the prefix runs on it), S^T panels otherwise.
std::size_t kept_state_floats(const Problem& p) {
  return split_chunks(p) ? key_state_floats(p) : value_state_floats(p);
}

// The largest of S, S^T: the backward's Sp holds S recomputing, S^T split over chunks.
std::size_t either_state_floats(const Problem& p) { return std::max(key_state_floats(p), value_state_floats(p)); }

// Grouped q/k heads, items over whole sequences: the forward's items are GradParts' (sequence, q/k
// head, part), each part's value heads walking the chunks side by side on one Q K^T.
bool shares_scores(const Problem& p) { return p.group() > 1 && !split_chunks(p); }

// The forward's shared items: as many value heads to an item as keeps every thread busy (more
// heads on one Q K^T ran faster: heads_k 1, heads 8, D 128, 2 threads, 8 heads to an item against
// 4 and 1: 0.90x and 0.78x the time in alternating runs).
GradParts forward_parts(const Problem& p) { return GradParts(p, omp_get_max_threads()); }

std::size_t forward_item_count(const Problem& p) {
  return shares_scores(p) ? forward_parts(p).items : p.slices();
}

// The value heads of the largest part (1 when unshared).
int shared_heads(const Problem& p) {
  if (!shares_scores(p)) return 1;
  const int parts = forward_parts(p).parts;
  return (p.group() + parts - 1) / parts;
}

// Shared: also the unmasked Q K^T (C x C), and per further value head a state and powers of gamma.
std::size_t forward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, PV = panel_cols(p.value_dim()), PC = panel_cols(int(C));
  const std::size_t more = std::size_t(shared_heads(p) - 1), shared = shares_scores(p) ? C * C : 0;
  return 2 * C * C + Dk * PC + 2 * C * PV + key_state_floats(p) + 3 * C + 1 + shared +
         more * (key_state_floats(p) + C + 1);
}

std::size_t backward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, Dv = p.value_dim(), PC = panel_cols(int(C));
  const std::size_t PK = panel_cols(p.dim), PV = panel_cols(p.value_dim());
  return C * C + 2 * C * score_ld(int(C)) + (Dk + Dv) * PC + 2 * C * PK + 2 * C * PV + value_state_floats(p) +
         either_state_floats(p) + key_state_floats(p) + 3 * C + 1;
}

int tiled_threads(const Problem& p) {
  if (split_chunks(p)) return std::min(omp_get_max_threads(), p.chunks());
  return shares_scores(p) ? int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), forward_item_count(p)))
                          : item_threads(p);
}

}  // namespace

std::size_t chunked_tiled_kept_states_floats(const Problem& p) { return item_chunks(p) * kept_state_floats(p); }

// Split over chunks, the forward's chunk states live in the kept block when there is one.
std::size_t chunked_tiled_forward_floats(const Problem& p, bool keep) {
  const std::size_t SF = key_state_floats(p);
  const std::size_t chunk_states = keep ? 0 : std::size_t(p.chunks()) * SF;
  const std::size_t shared = split_chunks(p) ? chunk_states + SF : 0;
  return shared + std::size_t(tiled_threads(p)) * forward_thread_floats(p) + order_floats(p, forward_item_count(p));
}

std::size_t chunked_tiled_backward_floats(const Problem& p, bool kept) {
  const std::size_t bt = backward_thread_floats(p);
  if (split_chunks(p)) {
    const std::size_t SF = key_state_floats(p), chunk_states = std::size_t(p.chunks()) * SF;
    return (kept ? 1 : 2) * chunk_states + SF + std::size_t(tiled_threads(p)) * bt;
  }
  const std::size_t own = kept ? 0 : std::size_t(max_chunks(p)) * value_state_floats(p);
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(backward_item_threads(p)) * (own + bt) + order_floats(p, parts.items);
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

// A B operand of the products: packed panels (brs = 0) or row-major rows in place (brs their stride).
struct Operand {
  const float* b;
  long brs;
};

// B = the n x D rows X: in place, or packed into Xp.
Operand rows_operand(const float* X, int n, int D, float* Xp) {
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

void prefetch_into(Product& u, const float* rows, std::size_t floats) {
  u.prefetch = rows;
  u.prefetch_floats = rows ? floats : 0;
}

// The widths of one problem: key (q, k) rows Dk, value (v, o, dO) rows Dv.
struct Dims {
  int Dk, Dv, C;
};

Dims dims_of(const Problem& p) { return {p.dim, p.value_dim(), effective_chunk(p)}; }

// Y = beta Y + alpha X^T Z for chunk rows X (n x Dk) and Z (an operand of n x Dv rows), Y a packed
// Dk x Dv state: the chunk's contribution to S (X = K, Z = V) or to dS (X = Q, Z = dO); prefetches
// `next` (floats long) if given.
void state_product(float* Yp, const Dims& d, int n, const float* X, Operand Z, float alpha, float beta,
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
void state_product(float* Yp, const Dims& d, int n, const float* X, const float* Z, const float* w, float alpha,
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

ChunkRows chunk_rows(const Dims& d, int len, int c) {
  const int c0 = c * d.C;
  return {std::min(d.C, len - c0), std::size_t(c0) * d.Dk, std::size_t(c0) * d.Dv};
}

struct ForwardBuffers {
  float *mask, *A, *Ktp, *Vp, *Vg, *Sp, *pw, *lam, *gam;
  // Shared items: Q K^T unmasked, and the further value heads' states and powers of gamma.
  float *R = nullptr, *more_states = nullptr, *more_pw = nullptr;
};

ForwardBuffers forward_buffers(const Problem& p, float* base) {
  const int C = effective_chunk(p);
  Carver carve{base};
  ForwardBuffers b;
  b.mask = carve.take(std::size_t(C) * C);
  b.A = carve.take(std::size_t(C) * C);
  b.Ktp = carve.take(std::size_t(p.dim) * panel_cols(C));
  b.Vp = carve.take(std::size_t(C) * panel_cols(p.value_dim()));
  b.Vg = carve.take(std::size_t(C) * panel_cols(p.value_dim()));
  b.Sp = carve.take(key_state_floats(p));
  b.pw = carve.take(C + 1);
  b.lam = carve.take(C);
  b.gam = carve.take(C);
  if (shares_scores(p)) {
    const std::size_t more = std::size_t(shared_heads(p) - 1);
    b.R = carve.take(std::size_t(C) * C);
    b.more_states = carve.take(more * key_state_floats(p));
    b.more_pw = carve.take(more * (C + 1));
  }
  return b;
}

// lam_i = scale gamma^(i+1), gam_j = gamma^(n-1-j) for a chunk of n rows.
void chunk_weights(const float* pw, int n, float scale, float* lam, float* gam) {
  for (int i = 0; i < n; ++i) {
    lam[i] = scale * pw[i + 1];
    gam[i] = pw[n - 1 - i];
  }
}

// O_c = s (diag(lam) Q_c S + ((Q_c K_c^T) . M) V_c) for the packed state S entering the chunk:
// Q K^T is n x Dk by Dk x n, Q S n x Dk by Dk x Dv, A V n x n by n x Dv. Returns V_c as the
// operand it used, for the state product to reuse.
// The scores into A, or (A null) Q K^T unmasked into R for a group's value heads to mask.
void chunk_scores(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Kc,
                  const NextRows& next, bool unmasked = false) {
  tile::pack(Kc, d.Dk, true, d.Dk, n, nullptr, b.Ktp);
  Product scores;
  scores.M = n;
  scores.N = n;
  scores.c = unmasked ? b.R : b.A;
  scores.ldc = d.C;
  scores.s1 = seg(Range::full, d.Dk, Qc, d.Dk, 1, b.Ktp);
  scores.mask = unmasked ? nullptr : b.mask;
  scores.ldm = d.C;
  scores.mask_all = decay;
  scores.lower = true;
  prefetch_into(scores, next.k, next.qk_floats);
  tile::run(scores);
}

// O_c from the scores A; returns V_c as the operand it used, for the state product to reuse.
Operand chunk_out(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Vc,
                  float* Oc, const float* Sp, const NextRows& next) {
  const Operand V = rows_operand(Vc, n, d.Dv, b.Vp);
  Product out;
  prefetch_into(out, next.v, next.v_floats);
  out.M = n;
  out.N = d.Dv;
  out.c = Oc;
  out.ldc = d.Dv;
  out.s1 = seg(Range::full, d.Dk, Qc, d.Dk, 1, Sp);
  out.rs = decay ? b.lam : nullptr;
  out.s2 = seg(Range::lower, n, b.A, d.C, 1, V.b, V.brs);
  out.alpha = float(attention_scale(d.Dk));
  tile::run(out);
  return V;
}

Operand chunk_output(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Kc,
                     const float* Vc, float* Oc, const float* Sp, const NextRows& next = {}) {
  chunk_scores(b, d, n, decay, Qc, Kc, next);
  return chunk_out(b, d, n, decay, Qc, Vc, Oc, Sp, next);
}

// A = R . M for a value head with powers pw of its gamma: M_ij = gamma^(i-j) on and below the
// diagonal, zero above it to the 8-row tile's end (the A V product reads that far; R's entries
// there may be unwritten).
void mask_scores(const ForwardBuffers& b, const Dims& d, int n, const float* pw) {
  for (int i = 0; i < n; ++i) {
    const float* __restrict r = b.R + std::size_t(i) * d.C;
    float* __restrict a = b.A + std::size_t(i) * d.C;
    for (int j = 0; j <= i; ++j) a[j] = r[j] * pw[i - j];
    std::fill(a + i + 1, a + std::min(n, i / tile::kMR * tile::kMR + tile::kMR), 0.0f);
  }
}

// Walks elements [e0, e1) of the packed chunk states in order (reverse: last chunk first):
// each holds a chunk's own contribution on entry and the running state entering it (leaving it,
// in reverse) on exit; run starts as the initial state and ends as the final one.
void prefix_states(const Problem& p, float gamma, float* chunk_states, float* run, std::size_t e0, std::size_t e1,
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
std::pair<std::size_t, std::size_t> share(std::size_t n) {
  const std::size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

struct BackwardBuffers {
  float *mask, *P, *dA, *Ktp, *Vtp, *Kp, *Qp, *dOp, *dOl, *dSTp, *Sp, *dSp, *pw, *slam, *gam;
};

BackwardBuffers backward_buffers(const Problem& p, float* base) {
  const int C = effective_chunk(p), Dk = p.dim, Dv = p.value_dim();
  Carver carve{base};
  BackwardBuffers b;
  b.mask = carve.take(std::size_t(C) * C);
  b.P = carve.take(std::size_t(C) * score_ld(C));
  b.dA = carve.take(std::size_t(C) * score_ld(C));
  b.Ktp = carve.take(std::size_t(Dk) * panel_cols(C));
  b.Vtp = carve.take(std::size_t(Dv) * panel_cols(C));
  b.Kp = carve.take(std::size_t(C) * panel_cols(Dk));
  b.Qp = carve.take(std::size_t(C) * panel_cols(Dk));
  b.dOp = carve.take(std::size_t(C) * panel_cols(Dv));
  b.dOl = carve.take(std::size_t(C) * panel_cols(Dv));
  b.dSTp = carve.take(value_state_floats(p));
  b.Sp = carve.take(either_state_floats(p));
  b.dSp = carve.take(key_state_floats(p));
  b.pw = carve.take(C + 1);
  b.slam = carve.take(C);
  b.gam = carve.take(C);
  return b;
}

// dQ_c, dK_c, dV_c of one chunk from S^T entering it (Dv x Dk panels) and dS leaving it (packed
// Dk x Dv): P and dA are n x Dk by Dk x n and n x Dv by Dv x n; dQ = dO S^T + dA K and dK = V dS^T +
// dA^T Q are n x Dk, dV = K dS + P^T dO n x Dv. accumulate: dQ and dK add to the rows (another
// value head of the group wrote them). Returns dO_c as the operand it used, for the dS product.
Operand chunk_grads(const BackwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Kc,
                    const float* Vc, const float* dOc, float* dQc, float* dKc, float* dVc, const float* STp,
                    const float* dSp, bool accumulate, const NextRows& next = {}) {
  const float s = float(attention_scale(d.Dk));
  const long L = score_ld(d.C);
  tile::pack(Kc, d.Dk, true, d.Dk, n, nullptr, b.Ktp);
  tile::pack(Vc, d.Dv, true, d.Dv, n, nullptr, b.Vtp);
  const Operand K = rows_operand(Kc, n, d.Dk, b.Kp), Q = rows_operand(Qc, n, d.Dk, b.Qp);
  const Operand dO = rows_operand(dOc, n, d.Dv, b.dOp);
  tile::transpose_packed(dSp, d.Dk, d.Dv, b.dSTp);

  Product scores;
  scores.M = n;
  scores.N = n;
  scores.ldc = L;
  scores.mask = b.mask;
  scores.ldm = d.C;
  scores.mask_all = decay;
  scores.lower = true;
  scores.alpha = s;
  scores.c = b.P;
  scores.s1 = seg(Range::full, d.Dk, Qc, d.Dk, 1, b.Ktp);
  prefetch_into(scores, next.k, next.qk_floats);
  tile::run(scores);
  scores.c = b.dA;
  scores.s1 = seg(Range::full, d.Dv, dOc, d.Dv, 1, b.Vtp);
  prefetch_into(scores, next.v, next.v_floats);
  tile::run(scores);

  Product dq;
  dq.M = n;
  dq.N = d.Dk;
  dq.c = dQc;
  dq.ldc = d.Dk;
  dq.beta = accumulate ? 1.0f : 0.0f;
  dq.s1 = seg(Range::full, d.Dv, dOc, d.Dv, 1, STp);
  dq.rs = b.slam;
  dq.s2 = seg(Range::lower, n, b.dA, L, 1, K.b, K.brs);
  prefetch_into(dq, next.q, next.qk_floats);
  tile::run(dq);

  Product dk = dq;
  dk.c = dKc;
  dk.s1 = seg(Range::full, d.Dv, Vc, d.Dv, 1, b.dSTp);
  dk.rs = decay ? b.gam : nullptr;
  dk.s2 = seg(Range::upper, n, b.dA, 1, L, Q.b, Q.brs);
  prefetch_into(dk, next.dO, next.v_floats);
  tile::run(dk);

  Product dv = dk;
  prefetch_into(dv, nullptr, 0);
  dv.N = d.Dv;
  dv.c = dVc;
  dv.ldc = d.Dv;
  dv.beta = 0.0f;
  dv.s1 = seg(Range::full, d.Dk, Kc, d.Dk, 1, dSp);
  dv.s2 = seg(Range::upper, n, b.P, 1, L, dO.b, dO.brs);
  tile::run(dv);
  return dO;
}

// dS = beta dS + s Q_c^T diag(lam) dO_c (dS packed). Without decay lam = 1 and s is the
// product's alpha; with it, dO's rows are packed scaled by s lam.
// dO_packed: dO_c as an operand already (chunk_grads'), used when there is no decay to weight it.
void chunk_dstate(const BackwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* dOc,
                  float* dSp, float beta, const Operand* dO_packed = nullptr) {
  const float s = float(attention_scale(d.Dk));
  if (decay) state_product(dSp, d, n, Qc, dOc, b.slam, 1.0f, beta, b.dOl);
  else if (dO_packed) state_product(dSp, d, n, Qc, *dO_packed, s, beta);
  else state_product(dSp, d, n, Qc, dOc, nullptr, s, beta, b.dOl);
}

// keep: where S^T entering each chunk of every item goes (panels, item-major), or null.
// One shared item: value heads [h0, h1) of one sequence on their q/k head's rows, chunk by chunk:
// Q K^T once (masked once without decay, where every head's A is the same), then each head's
// output and state update. keep: as forward_items'.
void forward_shared_item(const Problem& p, const ForwardArgs<float>& a, const ForwardBuffers& b, float* keep,
                         int sequence, int h0, int h1) {
  const Dims d = dims_of(p);
  const std::size_t SF = value_state_floats(p), KSF = key_state_floats(p);
  const bool decay = p.decay == Decay::retnet;
  const auto state = [&](int h) { return h == h0 ? b.Sp : b.more_states + std::size_t(h - h0 - 1) * KSF; };
  const auto powers = [&](int h) { return h == h0 ? b.pw : b.more_pw + std::size_t(h - h0 - 1) * (d.C + 1); };
  const HeadSlice first = p.slice(std::size_t(sequence) * p.heads + h0);
  const float *q = a.q + first.key, *k = a.k + first.key;
  for (int h = h0; h < h1; ++h) {
    decay_tables(float(decay_gamma(p.decay, h)), d.C, powers(h), b.mask);  // mask: ones without decay
    tile::pack(a.h0 + p.slice(std::size_t(sequence) * p.heads + h).state, d.Dv, false, d.Dk, d.Dv, nullptr, state(h));
  }
  const int chunks = chunks_of(p, first.seq);
  for (int c = 0; c < chunks; ++c) {
    const auto [n, rk, rv] = chunk_rows(d, first.seq, c);
    NextRows next;
    if (c + 1 < chunks) {
      const auto [n1, rk1, rv1] = chunk_rows(d, first.seq, c + 1);
      next = {q + rk1, k + rk1, nullptr, nullptr, std::size_t(n1) * d.Dk, 0};
    }
    chunk_scores(b, d, n, false, q + rk, k + rk, next, decay);
    for (int h = h0; h < h1; ++h) {
      const std::size_t index = std::size_t(sequence) * p.heads + h;
      const HeadSlice sl = p.slice(index);
      const float* pw = powers(h);
      float* Sp = state(h);
      if (decay) mask_scores(b, d, n, pw);
      chunk_weights(pw, n, 1.0f, b.lam, b.gam);
      if (keep) tile::transpose_packed(Sp, d.Dk, d.Dv, keep + (item_chunk_offset(p, index) + c) * SF);
      // What this thread reads next: the next head's v rows of this chunk, or after the last head
      // the next chunk's q rows (its k rows went with the scores) and first head's v rows.
      const std::size_t head_rows = std::size_t(p.seq) * d.Dv;  // v's rows of one head
      NextRows after;
      if (h + 1 < h1) {
        after.v = a.v + sl.value + head_rows + rv;
        after.v_floats = std::size_t(n) * d.Dv;
      } else if (next.q) {
        after.q = next.q;
        after.qk_floats = next.qk_floats;
        after.v = a.v + first.value + rv + std::size_t(n) * d.Dv;
        after.v_floats = std::size_t(chunk_rows(d, first.seq, c + 1).n) * d.Dv;
      }
      const float* v = a.v + sl.value + rv;
      const Operand V = chunk_out(b, d, n, decay, q + rk, v, a.o + sl.value + rv, Sp, after);
      if (decay) state_product(Sp, d, n, k + rk, v, b.gam, 1.0f, pw[n], b.Vg, after.q, after.qk_floats);
      else state_product(Sp, d, n, k + rk, V, 1.0f, 1.0f, after.q, after.qk_floats);
    }
  }
  for (int h = h0; h < h1; ++h)
    tile::unpack(state(h), d.Dk, d.Dv, a.hT + p.slice(std::size_t(sequence) * p.heads + h).state, d.Dv);
}

// order: longest_first's list for a packed problem, or null.
void forward_items(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep, const int* order) {
  const Dims d = dims_of(p);
  const std::size_t SF = value_state_floats(p);
  const long items = long(p.slices());
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, scratch + omp_get_thread_num() * forward_thread_floats(p));
    if (shares_scores(p)) {
      const GradParts parts = forward_parts(p);
#pragma omp for schedule(dynamic, 1)
      for (long pick = 0; pick < long(parts.items); ++pick) {
        int sequence, h0, h1;
        parts.of(p, item_at(order, pick), sequence, h0, h1);
        forward_shared_item(p, a, b, keep, sequence, h0, h1);
      }
    } else {
// Dynamic: a thread descheduled by another job does not hold the others at the end.
#pragma omp for schedule(dynamic, 1)
      for (long pick = 0; pick < items; ++pick) {
        const std::size_t item = item_at(order, pick);
        const HeadSlice sl = p.slice(item);
        const float gamma = float(decay_gamma(p.decay, sl.head));
        const bool decay = gamma != 1.0f;
        decay_tables(gamma, d.C, b.pw, b.mask);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value;
        float* o = a.o + sl.value;
        const int chunks = chunks_of(p, sl.seq);
        float* kept = keep ? keep + item_chunk_offset(p, item) * SF : nullptr;
        tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, b.Sp);
        for (int c = 0; c < chunks; ++c) {
          const auto [n, rk, rv] = chunk_rows(d, sl.seq, c);
          NextRows next;
          if (c + 1 < chunks) {
            const auto [n1, rk1, rv1] = chunk_rows(d, sl.seq, c + 1);
            next = {q + rk1, k + rk1, v + rv1, nullptr, std::size_t(n1) * d.Dk, std::size_t(n1) * d.Dv};
          }
          chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
          if (kept) tile::transpose_packed(b.Sp, d.Dk, d.Dv, kept + c * SF);
          const Operand V = chunk_output(b, d, n, decay, q + rk, k + rk, v + rv, o + rv, b.Sp, next);
          if (decay) state_product(b.Sp, d, n, k + rk, v + rv, b.gam, 1.0f, b.pw[n], b.Vg, next.q, next.qk_floats);
          else state_product(b.Sp, d, n, k + rk, V, 1.0f, b.pw[n], next.q, next.qk_floats);
        }
        tile::unpack(b.Sp, d.Dk, d.Dv, a.hT + sl.state, d.Dv);
      }
    }
  }
}

// One item at a time (dense problems only), chunks split over the threads: the intra-chunk work
// has no sequential dependency, and the states entering the chunks come from a prefix over the
// chunks' own contributions K_c^T diag(gam) V_c, an O(chunks * Dk * Dv) walk split over state
// elements. keep: where S entering each chunk of every item goes (packed, item-major), or null;
// the prefix then runs in place there.
void forward_chunk_split(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep) {
  const Dims d = dims_of(p);
  const int chunks = p.chunks();
  const std::size_t SF = key_state_floats(p);
  float* run = scratch;
  float* own_states = keep ? nullptr : run + SF;
  float* threads_base = keep ? run + SF : own_states + chunks * SF;
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, threads_base + omp_get_thread_num() * forward_thread_floats(p));
    const auto [e0, e1] = share(SF);
    for (std::size_t item = 0; item < p.slices(); ++item) {
      const HeadSlice sl = p.slice(item);
      const float gamma = float(decay_gamma(p.decay, sl.head));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, d.C, b.pw, b.mask);
      const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value;
      float* o = a.o + sl.value;
      float* chunk_states = keep ? keep + item * chunks * SF : own_states;
#pragma omp single
      tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, run);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        state_product(chunk_states + c * SF, d, n, k + rk, v + rv, decay ? b.gam : nullptr, 1.0f, 0.0f, b.Vg);
      }
      prefix_states(p, gamma, chunk_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single nowait
      tile::unpack(run, d.Dk, d.Dv, a.hT + sl.state, d.Dv);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        chunk_output(b, d, n, decay, q + rk, k + rk, v + rv, o + rv, chunk_states + c * SF);
      }
    }
  }
}

// Items (sequence, q/k head, part) of GradParts: the part's value heads one after another, each
// from its own chunk states (kept: forward_items' S^T panels; else recomputed per value head into
// this thread's block), the first writing the part's dq and dk rows and the rest adding to them.
void backward_items(const Problem& p, const BackwardArgs<float>& a, float* scratch, const float* kept,
                    const int* order) {
  const Dims d = dims_of(p);
  const float s = float(attention_scale(d.Dk));
  const std::size_t SF = value_state_floats(p);
  const GradParts parts(p, omp_get_max_threads());
  float* partials = scratch;
  const std::size_t own_states = kept ? 0 : std::size_t(max_chunks(p)) * SF;
  const std::size_t per_thread = own_states + backward_thread_floats(p);
  float* threads_base = scratch + parts.partial_floats(p);
#pragma omp parallel num_threads(backward_item_threads(p))
  {
    float* own = threads_base + omp_get_thread_num() * per_thread;
    const BackwardBuffers b = backward_buffers(p, own + own_states);
// Dynamic: a thread descheduled by another job does not hold the others at the end.
#pragma omp for schedule(dynamic, 1)
    for (long pick = 0; pick < long(parts.items); ++pick) {
      const std::size_t item = item_at(order, pick);
      int sequence, h0, h1;
      parts.of(p, item, sequence, h0, h1);
      const int part = parts.part_of(item);
      float* dq_out = parts.dq_of(p, a.dq, partials, part);
      float* dk_out = parts.dk_of(p, a.dk, partials, part);
      for (int h = h0; h < h1; ++h) {
        const std::size_t index = std::size_t(sequence) * p.heads + h;
        const HeadSlice sl = p.slice(index);
        const float gamma = float(decay_gamma(p.decay, h));
        const bool decay = gamma != 1.0f;
        decay_tables(gamma, d.C, b.pw, b.mask);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value, *dO = a.dO + sl.value;
        float *dq = dq_out + sl.key, *dk = dk_out + sl.key, *dv = a.dv + sl.value;
        const int chunks = chunks_of(p, sl.seq);
        const float* states = kept ? kept + item_chunk_offset(p, index) * SF : own;  // S^T entering each chunk

        if (!kept) {
          tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, b.Sp);
          for (int c = 0; c < chunks; ++c) {
            const auto [n, rk, rv] = chunk_rows(d, sl.seq, c);
            tile::transpose_packed(b.Sp, d.Dk, d.Dv, own + c * SF);
            if (c + 1 == chunks) break;
            chunk_weights(b.pw, n, s, b.slam, b.gam);
            state_product(b.Sp, d, n, k + rk, v + rv, decay ? b.gam : nullptr, 1.0f, b.pw[n], b.dOl);
          }
        }

        tile::pack(a.dhT + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, b.dSp);
        for (int c = chunks - 1; c >= 0; --c) {
          const auto [n, rk, rv] = chunk_rows(d, sl.seq, c);
          chunk_weights(b.pw, n, s, b.slam, b.gam);
          NextRows next;  // the chunk before, which this reverse walk reads next
          if (c > 0) {
            const auto [n0, rk0, rv0] = chunk_rows(d, sl.seq, c - 1);
            next = {q + rk0, k + rk0, v + rv0, dO + rv0, std::size_t(n0) * d.Dk, std::size_t(n0) * d.Dv};
          }
          const Operand dOc = chunk_grads(b, d, n, decay, q + rk, k + rk, v + rv, dO + rv, dq + rk, dk + rk, dv + rv,
                                          states + c * SF, b.dSp, h > h0, next);
          chunk_dstate(b, d, n, decay, q + rk, dO + rv, b.dSp, b.pw[n], &dOc);
        }
        tile::unpack(b.dSp, d.Dk, d.Dv, a.dh0 + sl.state, d.Dv);
      }
    }
    parts.reduce(p, a.dq, a.dk, partials);
  }
}

// The backward of forward_chunk_split: the entering states S_c by a forward prefix, the
// gradients dS leaving each chunk by a reverse prefix over the chunks' own contributions
// s Q_c^T diag(lam) dO_c, then every chunk's dQ, dK, dV independently. Items go in order, so a
// group's value heads follow one another: the first writes dq and dk, the rest add to them.
// kept: forward_chunk_split's packed states, or null to recompute them.
void backward_chunk_split(const Problem& p, const BackwardArgs<float>& a, float* scratch, const float* kept) {
  const Dims d = dims_of(p);
  const int chunks = p.chunks();
  const float s = float(attention_scale(d.Dk));
  const std::size_t SF = key_state_floats(p);
  float* dstates = scratch;  // dS leaving each chunk, packed
  float* run = dstates + chunks * SF;
  float* own_states = kept ? nullptr : run + SF;  // S entering each chunk, packed
  float* threads_base = kept ? run + SF : own_states + chunks * SF;
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const BackwardBuffers b = backward_buffers(p, threads_base + omp_get_thread_num() * backward_thread_floats(p));
    const auto [e0, e1] = share(SF);
    for (std::size_t item = 0; item < p.slices(); ++item) {
      const HeadSlice sl = p.slice(item);
      const float gamma = float(decay_gamma(p.decay, sl.head));
      const bool decay = gamma != 1.0f;
      const bool accumulate = sl.head % p.group() != 0;
      decay_tables(gamma, d.C, b.pw, b.mask);
      const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value, *dO = a.dO + sl.value;
      const float* states = kept ? kept + item * chunks * SF : own_states;
      if (!kept) {
#pragma omp single
        tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, run);
      }
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, s, b.slam, b.gam);
        if (!kept) state_product(own_states + c * SF, d, n, k + rk, v + rv, decay ? b.gam : nullptr, 1.0f, 0.0f, b.dOl);
        chunk_dstate(b, d, n, decay, q + rk, dO + rv, dstates + c * SF, 0.0f);
      }
      if (!kept) prefix_states(p, gamma, own_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single
      tile::pack(a.dhT + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, run);
      prefix_states(p, gamma, dstates, run, e0, e1, true);
#pragma omp barrier
#pragma omp single nowait
      tile::unpack(run, d.Dk, d.Dv, a.dh0 + sl.state, d.Dv);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, s, b.slam, b.gam);
        tile::transpose_packed(states + c * SF, d.Dk, d.Dv, b.Sp);
        chunk_grads(b, d, n, decay, q + rk, k + rk, v + rv, dO + rv, a.dq + sl.key + rk, a.dk + sl.key + rk,
                    a.dv + sl.value + rv, b.Sp, dstates + c * SF, accumulate);
      }
    }
  }
}

}  // namespace

// The order list (packed problems) sits at the workspace's end.
int* order_list(float* scratch, std::size_t total, std::size_t floats) {
  return floats ? reinterpret_cast<int*>(scratch + (total - floats)) : nullptr;
}

void chunked_tiled_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  const std::size_t total = chunked_tiled_forward_floats(p, keep != nullptr);
  Workspace<float> scratch(allocator, total);
  if (split_chunks(p)) return forward_chunk_split(p, a, scratch.data(), keep);
  int* order = order_list(scratch.data(), total, order_floats(p, forward_item_count(p)));
  longest_first(p, forward_item_count(p),
                shares_scores(p) ? forward_parts(p).per_sequence(p) : std::size_t(p.heads), order);
  forward_items(p, a, scratch.data(), keep, order);
}

void chunked_tiled_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  const std::size_t total = chunked_tiled_backward_floats(p, kept != nullptr);
  Workspace<float> scratch(allocator, total);
  if (split_chunks(p)) return backward_chunk_split(p, a, scratch.data(), kept);
  const GradParts parts(p, omp_get_max_threads());
  int* order = order_list(scratch.data(), total, order_floats(p, parts.items));
  longest_first(p, parts.items, parts.per_sequence(p), order);
  backward_items(p, a, scratch.data(), kept, order);
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

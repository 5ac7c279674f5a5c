// The tiled chunked kernel's backward (the mathematics is in cpu/chunked/chunked_tiled.hpp's header and
// docs/spec.md section 1; what it shares with the forward is in cpu/chunked/chunked_tiled_parts.hpp).
//
// Backward, from the state entering each chunk (kept by the forward, or recomputed by a forward
// sweep of the state products alone):
//   P    = s (Q K^T) . M,  dA = s (dO V^T) . M                          (lower outputs)
//   dQ   = diag(s lam) (dO S^T) + dA K                                  (k of dA K: j <= i)
//   dK   = diag(gam) (V dS^T) + dA^T Q,  dV = diag(gam) (K dS) + P^T dO  (k of dA^T Q: j >= i)
//   dS   = gamma^n dS + Q^T (diag(s lam) dO)
// The backward's dq and dk of a q/k head sum over its value heads: its items are (sequence, q/k
// head, part) (GradParts, cpu/chunked/chunk_products.hpp), a part's heads on one thread, the first writing
// the rows and the others adding.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include "kernels/linear_attention/cpu/chunked/chunked_tiled.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_tiled_parts.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"

namespace lattn::cpu {
namespace tiled {
namespace {

// The backward's items split over whole items (GradParts: sequence, q/k head, part).
int backward_item_threads(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), parts.items));
}

// The largest of S, S^T: the backward's Sp holds S recomputing, S^T split over chunks.
std::size_t either_state_floats(const Problem& p) { return std::max(key_state_floats(p), value_state_floats(p)); }

std::size_t backward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, Dv = p.value_dim(), PC = panel_cols(int(C));
  const std::size_t PK = panel_cols(p.dim), PV = panel_cols(p.value_dim());
  return C * C + 2 * C * score_ld(int(C)) + (Dk + Dv) * PC + 2 * C * PK + 2 * C * PV + value_state_floats(p) +
         either_state_floats(p) + key_state_floats(p) + 3 * C + 1;
}

}  // namespace
}  // namespace tiled

std::size_t chunked_tiled_backward_floats(const Problem& p, bool kept) {
  const std::size_t bt = tiled::backward_thread_floats(p);
  if (tiled::split_chunks(p)) {
    const std::size_t SF = key_state_floats(p), chunk_states = std::size_t(p.chunks()) * SF;
    return (kept ? 1 : 2) * chunk_states + SF + std::size_t(tiled::tiled_threads(p)) * bt;
  }
  const std::size_t own = kept ? 0 : std::size_t(max_chunks(p)) * value_state_floats(p);
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(tiled::backward_item_threads(p)) * (own + bt) +
         order_floats(p, parts.items);
}

#if defined(__AVX512F__)
namespace tiled {
namespace {

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
      const GradParts::Item it = parts.item(p, item_at(order, pick), a.dq, a.dk, partials);
      for (int h = it.h0; h < it.h1; ++h) {
        const std::size_t index = std::size_t(it.sequence) * p.heads + h;
        const auto [sl, gamma, decay] = item_head(p, index, d, b.pw, b.mask);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value, *dO = a.dO + sl.value;
        float *dq = it.dq + sl.key, *dk = it.dk + sl.key, *dv = a.dv + sl.value;
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
                                          states + c * SF, b.dSp, h > it.h0, next);
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
  const SplitBlocks blocks = split_blocks(dstates + chunks * SF, chunks, SF, kept != nullptr);
  float *run = blocks.run, *own_states = blocks.own_states;  // own_states: S entering each chunk, packed
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const BackwardBuffers b = backward_buffers(p, blocks.threads + omp_get_thread_num() * backward_thread_floats(p));
    const auto [e0, e1] = share(SF);
    for (std::size_t item = 0; item < p.slices(); ++item) {
      // Named, not bound: clang does not let the OpenMP constructs below read structured bindings.
      const ItemHead head = item_head(p, item, d, b.pw, b.mask);
      const HeadSlice& sl = head.sl;
      const bool decay = head.decay;
      const bool accumulate = sl.head % p.group() != 0;
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
      if (!kept) prefix_states(p, head.gamma, own_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single
      tile::pack(a.dhT + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, run);
      prefix_states(p, head.gamma, dstates, run, e0, e1, true);
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
}  // namespace tiled

void chunked_tiled_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  const std::size_t total = chunked_tiled_backward_floats(p, kept != nullptr);
  Workspace<float> scratch(allocator, total);
  if (tiled::split_chunks(p)) return tiled::backward_chunk_split(p, a, scratch.data(), kept);
  const GradParts parts(p, omp_get_max_threads());
  int* order = tiled::order_list(scratch.data(), total, order_floats(p, parts.items));
  longest_first(p, parts.items, parts.per_sequence(p), order);
  tiled::backward_items(p, a, scratch.data(), kept, order);
}

#else
void chunked_tiled_backward(const Problem&, const BackwardArgs<float>&, Allocator&, const float*) {
  throw std::logic_error("chunked_tiled_backward: built without AVX-512");
}
#endif

}  // namespace lattn::cpu

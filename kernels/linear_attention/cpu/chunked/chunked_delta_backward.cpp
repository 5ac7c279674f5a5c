// The delta rule's chunked backward on the CPU (docs/spec.md section 1b), float32, every decay, in
// the WY / UT-transform representation of cpu/chunked/chunked_delta_forward.cpp, on every shape of
// docs/spec.md section 1c. What it shares with the forward is in cpu/chunked/chunked_delta_parts.hpp.
//
// Backward, walking the chunks in reverse with dS the gradient of the state leaving the chunk:
//   dW    = s A_qk^T dO + (K . exp(b_{n-1} - b)) dS
//   dR    = T^T dW                 (R = diag(beta) E, the system's right-hand side)
//   dV    = diag(beta) dR,   dbeta_i = E_i . dR_i + sum_{m<i} dM_im A_kk[i][m],   dM = -dR W^T
//   dP_qk = s dO W^T,   dP_kk = diag(beta) dM   (strictly lower), both times the mask for scalar gates
//   dQ    = G . s dO S^T + dP_qk K-side,   dK_read = G . (-dV S^T) + dP_kk row side,
//   dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_kk^T and dP_qk^T sides
//   dS   <- exp(b_{n-1}) dS + s (Q . G)^T dO - (K . G)^T dV
//   dg_i  = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau
// (dS_c, S_c: the chunk's entering state and its gradient; the scan's identity, cpu/scan/scan_delta.cpp,
// applied to the chunk's tokens).
//
// Items and shapes. An item is one (sequence, value head) pair, Problem::slice: its q/k rows are
// those of its q/k head, read in place (never copied), and a packed batch's documents are items of
// their own, each from its own h0 to its own hT. The forward's items are independent. In the
// backward a q/k head's dq and dk are the sums over the value heads it serves. Where items
// (sequence, q/k head) take no more rounds of the schedule than the value heads apart would (they
// fill every thread, evenly), one thread runs the group's value heads one after another, the first
// writing dq and dk and the rest adding (a member's own dq goes through a chunk-sized buffer first:
// its dg needs q . dq of that member alone). Otherwise the items stay (sequence, value head) and the
// value heads after a group's first write into partial copies of dq and dk (2 (G - 1) copies of q's
// size), summed into them once every item is done. Packed documents are taken longest first, so
// that the dynamic schedule ends on short items.
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_delta_parts.hpp"
#include "kernels/linear_attention/cpu/delta.hpp"

namespace lattn::cpu {
namespace delta {
namespace {

// Panels of X^T (Dv x P(Dk)) from the panels of a packed Dk x Dv matrix X, padding zero.
void transpose_state(const float* Xp, int Dk, int Dv, float* dst) {
  if (Dk == Dv) return tile::transpose_packed(Xp, Dk, dst);
  for (int q = 0; q < Dk; q += kNR)  // a panel of dst: rows q .. q + 31 of X
    for (int k = 0; k < Dv; ++k) {   // its row k: column k of X
      float* __restrict row = dst + std::size_t(q / kNR) * Dv * kNR + std::size_t(k) * kNR;
      const float* column = Xp + std::size_t(k / kNR) * Dk * kNR + k % kNR;
      const int width = std::min(kNR, Dk - q);
      for (int j = 0; j < width; ++j) row[j] = column[std::size_t(q + j) * kNR];
      std::fill(row + width, row + kNR, 0.0f);
    }
}

// x[i][d] *= f[i][d] over n rows of D.
void scale_rows(float* __restrict x, const float* __restrict f, int n, int D) {
#pragma omp simd
  for (int e = 0; e < n * D; ++e) x[e] *= f[e];
}

// The scores' gradients into dQ, dK_read and dK_write for vector gates, with w_im = exp(b_i - b_m)
// per channel for m <= i:
//   dq_i += sum_m dP_qk[i][m] w_im . k_m,   dK_read_i += sum_m dP_kk[i][m] w_im . k_m,
//   dK_write_m += sum_i w_im . (dP_qk[i][m] q_i + dP_kk[i][m] k_i).
// Between sub-chunks I > J (the forward's scores: r_I, e_J, Qh, Kh, Kb, left in the buffers by
// scores), w_im = exp(b_i - r_I) f_IJ exp(e_J - b_m), f_IJ = exp(r_I - e_J), so each sum is a tile
// product over the rows of Kb, Qh or Kh scaled by f of their block pair, times the factor of the
// output's own row after. Within a sub-chunk, pair by pair with w a running product.
void vector_score_gradients(const Buffers& B, const Shape& s, const Chunk& c, float* dq) {
  const int D = s.Dk, L = s.L, n = c.n;
  constexpr int c0 = kGateSubChunk;
  const int blocks = (n + c0 - 1) / c0;
  float* __restrict f = B.row;
  auto last_of = [&](int J) { return B.b + std::size_t(J * c0 + c0 - 1) * D; };  // e_J
  // out[i] += F_i . Y[i - i0] for rows [i0, i1): F_i = exp(b_i - r_I) for a row block's own rows
  // (dq, dK_read), exp(e_J - b_i) for a column block's (dK_write).
  auto add_scaled_rows = [&](float* out, int i0, int i1, const double* ref, bool row_side) {
    for (int i = i0; i < i1; ++i) {
      const std::size_t o = std::size_t(i) * D;
      if (row_side) exp_of_difference(f, B.b + o, ref, D);
      else exp_of_difference(f, ref, B.b + o, D);
      float* __restrict x = out + o;
      const float* __restrict y = B.Y + std::size_t(i - i0) * D;
#pragma omp simd
      for (int d = 0; d < D; ++d) x[d] += f[d] * y[d];
    }
  };
  for (int I = 1; I < blocks; ++I) {  // rows of I against the columns of every J < I
    const int i0 = I * c0, i1 = std::min(n, i0 + c0);
    const double* r = B.b + std::size_t(i0 - 1) * D;
    for (int J = 0; J < I; ++J) {
      exp_of_difference(f, r, last_of(J), D);
      for (int m = J * c0; m < J * c0 + c0; ++m)
        multiply_into(B.Xq + std::size_t(m) * D, B.Kb + std::size_t(m) * D, f, D);
    }
    tile::pack(B.Xq, D, false, i0, D, nullptr, B.Kp);
    for (const auto& [dP, out] : {std::pair{B.dPqk, dq}, std::pair{B.dPkk, B.dKr}}) {
      tile::run(rows_product(B.Y, D, i1 - i0, D, seg(Range::full, i0, dP + std::size_t(i0) * L, L, 1, B.Kp)));
      add_scaled_rows(out, i0, i1, r, true);
    }
  }
  for (int J = 0; J + 1 < blocks; ++J) {  // columns of J against the rows of every I > J
    const int j0 = J * c0, j1 = j0 + c0;
    const double* e = last_of(J);
    for (int I = J + 1; I < blocks; ++I) {
      const int i0 = I * c0, i1 = std::min(n, i0 + c0);
      exp_of_difference(f, B.b + std::size_t(i0 - 1) * D, e, D);
      for (int i = i0; i < i1; ++i) {
        const std::size_t o = std::size_t(i) * D;
        multiply_into(B.Xq + o, B.Qh + o, f, D);
        multiply_into(B.Xk + o, B.Kh + o, f, D);
      }
    }
    const int rows = n - j1;
    tile::pack(B.Xq + std::size_t(j1) * D, D, false, rows, D, nullptr, B.Qp);
    tile::pack(B.Xk + std::size_t(j1) * D, D, false, rows, D, nullptr, B.Kp);
    Product y = rows_product(B.Y, D, c0, D, seg(Range::full, rows, B.dPqk + std::size_t(j1) * L + j0, 1, L, B.Qp));
    y.s2 = seg(Range::full, rows, B.dPkk + std::size_t(j1) * L + j0, 1, L, B.Kp);
    tile::run(y);
    add_scaled_rows(B.dKw, j0, j1, e, false);
  }
  float* __restrict w = B.row;
  for (int i = 0; i < n; ++i) {
    std::fill_n(w, D, 1.0f);
    const float *qi = c.q + std::size_t(i) * D, *ki = c.k + std::size_t(i) * D;
    float *__restrict dqi = dq + std::size_t(i) * D, *__restrict dkri = B.dKr + std::size_t(i) * D;
    for (int m = i; m >= i / c0 * c0; --m) {
      const float* km = c.k + std::size_t(m) * D;
      float* __restrict dkwm = B.dKw + std::size_t(m) * D;
      const float x = B.dPqk[std::size_t(i) * L + m], y = B.dPkk[std::size_t(i) * L + m];
#pragma omp simd
      for (int d = 0; d < D; ++d) {
        const float wk = w[d] * km[d];
        dqi[d] += x * wk;
        dkri[d] += y * wk;
        dkwm[d] += w[d] * (x * qi[d] + y * ki[d]);
      }
      multiply(w, B.a + std::size_t(m) * D, D);
    }
  }
}

// dq, dk, dv, dbeta (and dg) of one chunk from the state entering it (Sp, packed) and dS leaving
// it (dSp, packed); dSp becomes the gradient of the state entering the chunk. dq is overwritten
// with this item's own; dk is overwritten, or with add_dk added to.
void backward_chunk(const Buffers& B, const Shape& sh, const Problem& p, const Chunk& c, const float* dO, float* dq,
                    float* dk, bool add_dk, float* dv, float* dbeta, float* dg) {
  const int Dk = sh.Dk, Dv = sh.Dv, n = c.n, L = sh.L;
  const float s = float(attention_scale(Dk));
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, sh, p, c);
  scores(B, sh, p, c, s);  // s A_qk
  invert(B, sh, c);
  solve(B, sh, p, c);
  tile::pack(B.Wm, Dv, true, Dv, n, nullptr, B.WTp);
  tile::pack(dO, Dv, false, n, Dv, nullptr, B.dOp);
  transpose_state(B.Sp, Dk, Dv, B.STp);
  transpose_state(B.dSp, Dk, Dv, B.dSTp);

  // dW = (K . exp(b_{n-1} - b)) dS + s A_qk^T dO;  dR = T^T dW;  dV = beta dR.
  Product dw = rows_product(B.dW, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Ke : c.k, Dk, 1, B.dSp));
  dw.rs = vector ? nullptr : B.EK;
  dw.s2 = seg(Range::upper, n, B.Aqk, 1, L, B.dOp);
  tile::run(dw);
  tile::pack(B.dW, Dv, false, n, Dv, nullptr, B.Zp);
  tile::run(rows_product(B.R, Dv, n, Dv, seg(Range::upper, n, B.T, 1, L, B.Zp)));
  // dP_qk = s dO W^T (lower);  dM = -dR W^T (strictly lower: only those entries are read).
  Product dpq = rows_product(B.dPqk, L, n, n, seg(Range::full, Dv, dO, Dv, 1, B.WTp), s);
  dpq.mask = vector ? B.ones : B.mask;
  dpq.ldm = L;
  dpq.mask_all = !vector;
  dpq.lower = true;
  tile::run(dpq);
  Product dm = rows_product(B.dPkk, L, n, n, seg(Range::full, Dv, B.R, Dv, 1, B.WTp), -1.0f);
  dm.lower = true;
  tile::run(dm);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dv;
    const float beta = c.beta[i];
    float db = dot(B.X + o, B.R + o, Dv);  // E_i . dR_i
    float* __restrict dpk = B.dPkk + std::size_t(i) * L;
    const float* __restrict ak = B.Akk + std::size_t(i) * L;
    const float* __restrict mk = vector ? nullptr : B.mask + std::size_t(i) * L;
    db += dot(dpk, ak, i);
    for (int m = 0; m < i; ++m) dpk[m] *= beta * (mk ? mk[m] : 1.0f);
    std::fill(dpk + i, dpk + sh.C, 0.0f);
    dbeta[i] = db;
#pragma omp simd
    for (int d = 0; d < Dv; ++d) dv[o + d] = beta * B.R[o + d];
  }

  // dQ = G . s dO S^T + dP_qk K;  dK_read = G . (-dV S^T) + dP_kk K;
  // dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_qk^T Q + dP_kk^T K.
  if (!vector) {
    tile::pack(c.k, Dk, false, n, Dk, nullptr, B.Kp);
    tile::pack(c.q, Dk, false, n, Dk, nullptr, B.Qp);
    // Two products each (the scores' side, then the state's added with its row scales): one
    // product's row scales would have to hold s G_i, a buffer of C floats.
    tile::run(rows_product(dq, Dk, n, Dk, seg(Range::lower, n, B.dPqk, L, 1, B.Kp)));
    Product dqs = rows_product(dq, Dk, n, Dk, seg(Range::full, Dv, dO, Dv, 1, B.STp), s);
    dqs.rs = B.EQ;
    dqs.beta = 1.0f;
    tile::run(dqs);
    tile::run(rows_product(B.dKr, Dk, n, Dk, seg(Range::lower, n, B.dPkk, L, 1, B.Kp)));
    Product dkr = rows_product(B.dKr, Dk, n, Dk, seg(Range::full, Dv, dv, Dv, 1, B.STp), -1.0f);
    dkr.rs = B.EQ;
    dkr.beta = 1.0f;
    tile::run(dkr);
    Product dkw = rows_product(B.dKw, Dk, n, Dk, seg(Range::full, Dv, B.Wm, Dv, 1, B.dSTp));
    dkw.rs = B.EK;
    dkw.s2 = seg(Range::upper, n, B.dPqk, 1, L, B.Qp);
    tile::run(dkw);
    Product dkw2 = rows_product(B.dKw, Dk, n, Dk, seg(Range::upper, n, B.dPkk, 1, L, B.Kp));
    dkw2.beta = 1.0f;
    tile::run(dkw2);
  } else {
    tile::run(rows_product(dq, Dk, n, Dk, seg(Range::full, Dv, dO, Dv, 1, B.STp), s));
    scale_rows(dq, B.EQ, n, Dk);
    tile::run(rows_product(B.dKr, Dk, n, Dk, seg(Range::full, Dv, dv, Dv, 1, B.STp), -1.0f));
    scale_rows(B.dKr, B.EQ, n, Dk);
    tile::run(rows_product(B.dKw, Dk, n, Dk, seg(Range::full, Dv, B.Wm, Dv, 1, B.dSTp)));
    scale_rows(B.dKw, B.EK, n, Dk);
    vector_score_gradients(B, sh, c, dq);
  }
#pragma omp simd
  for (int e = 0; e < n * Dk; ++e) dk[e] = (add_dk ? dk[e] : 0.0f) + (B.dKr[e] + B.dKw[e]);

  // dS <- exp(b_{n-1}) dS + s (Q . G)^T dO - (K . G)^T dV.
  if (vector) {
    scale_state_rows(B.dSp, Dk, Dv, B.decay);
    state_product(B.dSp, Dk, Dv, n, B.Qx, B.dOp, s, 1.0f);
    tile::pack(dv, Dv, false, n, Dv, nullptr, B.Zp);
    state_product(B.dSp, Dk, Dv, n, B.Kx, B.Zp, -1.0f, 1.0f);
  } else {
    tile::pack(dO, Dv, false, n, Dv, B.EQ, B.Zp);
    state_product(B.dSp, Dk, Dv, n, c.q, B.Zp, s, B.decay[0]);
    tile::pack(dv, Dv, false, n, Dv, B.EQ, B.Zp);
    state_product(B.dSp, Dk, Dv, n, c.k, B.Zp, -1.0f, 1.0f);
  }
  if (!dg) return;

  // dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau.
  for (int d = 0; d < Dk; ++d) B.sums[d] = 0;
  for (int panel = 0; panel < panel_cols(Dv) / kNR; ++panel)
    for (int d = 0; d < Dk; ++d) {
      const std::size_t o = (std::size_t(panel) * Dk + d) * kNR;
      double sum = 0;
      for (int j = 0; j < kNR; ++j) sum += double(B.dSp[o + j]) * B.Sp[o + j];
      B.sums[d] += sum;
    }
  if (!vector) {
    double total = 0;
    for (int d = 0; d < Dk; ++d) total += B.sums[d];
    B.sums[0] = total;
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dk;
    const float *q = c.q + o, *k = c.k + o, *dkr = B.dKr + o, *dkw = B.dKw + o, *dqi = dq + o;
    if (!vector) {
      dg[i] = float(B.sums[0]);
      double step = 0;
#pragma omp simd reduction(+ : step)
      for (int d = 0; d < Dk; ++d) step += double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      B.sums[0] -= step;
    } else {
#pragma omp simd
      for (int d = 0; d < Dk; ++d) {
        dg[o + d] = float(B.sums[d]);
        B.sums[d] -= double(q[d]) * dqi[d] + double(k[d]) * (double(dkr[d]) - dkw[d]);
      }
    }
  }
}

// How the backward splits its work (the file's head comment): items (sequence, q/k head) running a
// group's value heads on one thread, or items (sequence, value head) with the value heads after a
// group's first writing into partial dq and dk (2 (G - 1) copies of q's size; none when G is 1).
struct BackwardPlan {
  bool grouped = false;
  long items = 0;
  int threads = 1;
  std::size_t partial_floats = 0;
};

BackwardPlan backward_plan(const Problem& p) {
  BackwardPlan plan;
  const long most = omp_get_max_threads(), groups = long(p.sequences()) * p.qk_heads(), slices = long(p.slices());
  // Rounds of the schedule: a group on one thread must take no more than its value heads apart.
  const auto rounds = [&](long items) { return (items + most - 1) / most; };
  plan.grouped = p.group() > 1 && rounds(groups) * p.group() <= rounds(slices);
  plan.items = plan.grouped ? groups : slices;
  plan.threads = int(std::min(most, plan.items));
  if (p.group() > 1 && !plan.grouped) plan.partial_floats = lines(2 * std::size_t(p.group() - 1) * p.key_elems());
  return plan;
}

// One item's backward: dq and dk into the rows of dq_base and dk_base at the item's q/k offset,
// overwritten, or with add added to.
void backward_item(const Buffers& B, const Shape& sh, const Problem& p, const BackwardArgs<float>& a,
                   const float* kept, std::size_t index, float* dq_base, float* dk_base, bool add) {
  const HeadSlice h = p.slice(index);
  const int Dk = sh.Dk, Dv = sh.Dv, chunks = chunks_of(h.seq, p.chunk);
  const float* states = kept ? kept + kept_offset(p, index) * sh.SF : B.states;  // packed S entering each chunk
  if (!kept) {
    tile::pack(a.h0 + h.state, Dv, false, Dk, Dv, nullptr, B.Sp);
    for (int ci = 0; ci < chunks; ++ci) {
      std::copy_n(B.Sp, sh.SF, B.states + ci * sh.SF);
      if (ci + 1 < chunks) forward_chunk(B, sh, p, chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g), nullptr);
    }
  }
  tile::pack(a.dhT + h.state, Dv, false, Dk, Dv, nullptr, B.dSp);
  for (int ci = chunks - 1; ci >= 0; --ci) {
    const Chunk c = chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g);
    const std::size_t t0 = std::size_t(ci) * p.chunk, rk = h.key + t0 * Dk, rv = h.value + t0 * Dv;
    std::copy_n(states + ci * sh.SF, sh.SF, B.Sp);
    float* dg = a.dg ? a.dg + h.gate + t0 * p.gate_width() : nullptr;
    float* dq = add ? B.dQ : dq_base + rk;
    backward_chunk(B, sh, p, c, a.dO + rv, dq, dk_base + rk, add, a.dv + rv, a.dbeta + h.beta + t0, dg);
    if (add) {
      float* __restrict out = dq_base + rk;
#pragma omp simd
      for (int e = 0; e < c.n * Dk; ++e) out[e] += B.dQ[e];
    }
  }
  tile::unpack(B.dSp, Dk, Dv, a.dh0 + h.state, Dv);
}

}  // namespace
}  // namespace delta

std::size_t chunked_delta_backward_floats(const Problem& p, bool kept) {
  using namespace delta;  // this kernel's parts
  const BackwardPlan plan = backward_plan(p);
  return std::size_t(plan.threads) * thread_floats(p, true, !kept, plan.grouped) + plan.partial_floats + order_ints(p);
}

void chunked_delta_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  using namespace delta;  // this kernel's parts
  const Shape sh = shape_of(p);
  const BackwardPlan plan = backward_plan(p);
  const int G = p.group(), Hk = p.qk_heads();
  const std::size_t per_thread = thread_floats(p, true, !kept, plan.grouped), KE = p.key_elems();
  Workspace<float> scratch(allocator, std::size_t(plan.threads) * per_thread);
  Workspace<float> partial(allocator, plan.partial_floats);
  Workspace<int> order(allocator, order_ints(p));
  fill_order(p, order.data());
#pragma omp parallel num_threads(plan.threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, true, !kept, plan.grouped);
    if (B.ones) fill_lower_ones(B.ones, sh.C);
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < plan.items; ++item) {
      if (plan.grouped) {
        const std::size_t first = std::size_t(sequence_at(order.data(), p, item / Hk)) * p.heads + std::size_t(item % Hk) * G;
        for (int member = 0; member < G; ++member)
          backward_item(B, sh, p, a, kept, first + member, a.dq, a.dk, member > 0);
        continue;
      }
      const std::size_t index = std::size_t(sequence_at(order.data(), p, item / p.heads)) * p.heads + item % p.heads;
      const int member = int(index % p.heads) % G;
      float* copy = partial.data() + std::size_t(std::max(member - 1, 0)) * 2 * KE;  // dq's, then dk's
      backward_item(B, sh, p, a, kept, index, member == 0 ? a.dq : copy, member == 0 ? a.dk : copy + KE, false);
    }
  }
  if (!plan.partial_floats) return;
  // dq and dk of each q/k head: its first value head's, plus the others' partial copies.
  constexpr long kBlock = 4096;
#pragma omp parallel for num_threads(plan.threads) schedule(static)
  for (long e0 = 0; e0 < long(KE); e0 += kBlock) {
    const long e1 = std::min(long(KE), e0 + kBlock);
    for (int member = 1; member < G; ++member) {
      const float* __restrict pq = partial.data() + std::size_t(member - 1) * 2 * KE;
      const float* __restrict pk = pq + KE;
#pragma omp simd
      for (long e = e0; e < e1; ++e) {
        a.dq[e] += pq[e];
        a.dk[e] += pk[e];
      }
    }
  }
}

}  // namespace lattn::cpu

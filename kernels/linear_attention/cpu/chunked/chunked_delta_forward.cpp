// The delta rule's chunked forward on the CPU (docs/spec.md section 1b), float32, every
// decay, in the WY / UT-transform representation (DeltaNet: Yang et al. 2024; with gates, Gated
// DeltaNet: Yang, Kautz, Hatamizadeh 2025), on every shape of docs/spec.md section 1c.
// What it shares with the backward is in cpu/chunked/chunked_delta_parts.hpp.
//
// Per chunk of n rows with S the Dk x Dv state entering it and b_i the cumulative log-gates from the
// chunk's start (per key channel for vector gates; none and retnet are scalar gates 0 and log
// gamma), write Gi = exp(b_i) and, for m <= i, the gated scores
//   A_qk[i][m] = q_i . exp(b_i - b_m) . k_m,   A_kk[i][m] = k_i . exp(b_i - b_m) . k_m (m < i only).
// Token m's pending value w_m = beta_m (v_m - S'_m^T k_m) and S'_m = Gm S + sum_{l<m} exp(b_m - b_l) k_l w_l^T
// give (I + diag(beta) A_kk) W = diag(beta) (V - (K . G) S), a unit lower-triangular system of size
// n; with T = (I + diag(beta) A_kk)^-1 (forward substitution, once per chunk):
//   E = V - (K . G) S,   W = T diag(beta) E,   O = s ((Q . G) S + A_qk W)
//   S_next = exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W
// The scores, T and the gates are Dk wide (key channels); E, W, O and the state's columns are Dv
// wide (value columns). Every gate factor is exp of a difference <= 0 (formed in double where the
// gated form does), so strong gates stay finite. Scalar gates make exp(b_i - b_m) a mask the tile
// products apply; vector gates cannot be a mask (the factor is per channel inside the dot product):
// their scores are the gated form's sub-chunk products (at scores) with lane_scores within a
// sub-chunk (cpu/chunked/chunk_products.hpp: a running product of exp(g), the rows in the vector lanes),
// and the backward's score gradients take the same sub-chunks (docs/kernels.md).
//
// The forward's items, (sequence, value head) pairs, are independent; the states entering the
// chunks are kept when the caller asks (packed S, per item at the item's offset).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_delta_parts.hpp"
#include "kernels/linear_attention/cpu/chunked/unit_lower_inverse.hpp"
#include "kernels/linear_attention/cpu/delta.hpp"

namespace lattn::cpu {
namespace delta {

Buffers carve(const Problem& p, float* base, bool backward, bool own_states, bool own_dq) {
  const Shape s = shape_of(p);
  const std::size_t C = s.C, Dk = s.Dk, Dv = s.Dv, L = s.L;
  const bool vector = p.decay == Decay::vector;
  const std::size_t gw = vector ? Dk : 1, PK = panel_cols(s.Dk), PV = panel_cols(s.Dv), PC = panel_cols(s.C);
  Buffers b{};
  BlockCarver block{base};
  b.b = block.take_doubles(C * gw);
  b.sums = block.take_doubles(Dk);
  b.a = block.take(vector ? C * Dk : 0);
  for (float** x : {&b.EQ, &b.EK}) *x = block.take(C * gw);
  for (float** x : {&b.decay, &b.row}) *x = block.take(Dk);
  b.mask = block.take(vector ? 0 : C * L);
  b.ones = block.take(vector ? C * L : 0);
  for (float** x : {&b.Aqk, &b.Akk, &b.T}) *x = block.take(C * L);
  for (float** x : {&b.Qx, &b.Kx, &b.Ke, &b.Qh, &b.Kh, &b.Kb}) *x = block.take(vector ? C * Dk : 0);
  for (float** x : {&b.X, &b.R, &b.Wm}) *x = block.take(C * Dv);
  b.Bp = block.take(Dk * PC);
  b.WTp = block.take(Dv * PC);
  for (float** x : {&b.Rp, &b.Wp, &b.Wep}) *x = block.take(C * PV);
  b.Sp = block.take(s.SF);
  b.lanes = block.take(vector ? 2 * Dk * kLaneRows : 0);
  if (backward) {
    for (float** x : {&b.dPqk, &b.dPkk}) *x = block.take(C * L);
    b.dW = block.take(C * Dv);
    for (float** x : {&b.dKr, &b.dKw}) *x = block.take(C * Dk);
    for (float** x : {&b.Kp, &b.Qp}) *x = block.take(C * PK);
    for (float** x : {&b.dOp, &b.Zp}) *x = block.take(C * PV);
    b.STp = block.take(Dv * PK);
    b.dSp = block.take(s.SF);
    b.dSTp = block.take(Dv * PK);
    b.states = block.take(own_states ? std::size_t(s.chunks) * s.SF : 0);
    b.dQ = block.take(own_dq ? C * Dk : 0);
    for (float** x : {&b.Xq, &b.Xk, &b.Y}) *x = block.take(vector ? C * Dk : 0);
  }
  b.used = block.floats();
  return b;
}

// b, exp(g), G = exp(b), exp(b_{n-1} - b), exp(b_{n-1}); the mask exp(b_i - b_m) for scalar
// gates (none and retnet as constant log-gates), Q . G, K . G, K . exp(b_{n-1} - b) for vector gates.
void gate_operands(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int D = s.Dk, n = c.n, C = s.C, L = s.L;
  if (p.decay != Decay::vector) {
    double sum = 0;
    for (int i = 0; i < n; ++i) B.b[i] = sum += c.g ? double(c.g[i]) : double(c.log_gamma);
    const double last = B.b[n - 1];
    scalar_gate_rows(B.b, last, n, C, L, B.EQ, B.EK, B.mask);
    std::fill_n(B.decay, D, exp_nonpositive(float(last)));
    return;
  }
  for (int d = 0; d < D; ++d) B.b[d] = c.g[d];
  for (int i = 1; i < n; ++i) {
    double* bi = B.b + std::size_t(i) * D;
    const float* gi = c.g + std::size_t(i) * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) bi[d] = bi[d - D] + gi[d];
  }
  std::copy_n(c.g, std::size_t(n) * D, B.a);
  exp_in_place(B.a, n * D);
  const double* last = B.b + std::size_t(n - 1) * D;
  exp_of_difference(B.decay, last, nullptr, D);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * D;
    exp_of_difference(B.EQ + o, B.b + o, nullptr, D);
    exp_of_difference(B.EK + o, last, B.b + o, D);
    float *__restrict Qx = B.Qx + o, *__restrict Kx = B.Kx + o, *__restrict Ke = B.Ke + o;
    const float *__restrict eq = B.EQ + o, *__restrict ek = B.EK + o, *__restrict q = c.q + o, *__restrict k = c.k + o;
#pragma omp simd
    for (int d = 0; d < D; ++d) {
      Qx[d] = q[d] * eq[d];
      Kx[d] = k[d] * eq[d];
      Ke[d] = k[d] * ek[d];
    }
  }
}

// A_qk (times alpha, on and below the diagonal) and A_kk (strictly below), zero above in every row
// the products may read.
void scores(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float alpha) {
  const int D = s.Dk, n = c.n, C = s.C, L = s.L;
  if (p.decay != Decay::vector) {
    tile::pack(c.k, D, true, D, n, nullptr, B.Bp);
    for (const auto& [out, x, scale] : {std::tuple{B.Aqk, c.q, alpha}, std::tuple{B.Akk, c.k, 1.0f}}) {
      Product u = rows_product(out, L, n, n, seg(Range::full, D, x, D, 1, B.Bp), scale);
      u.mask = B.mask;
      u.ldm = L;
      u.mask_all = true;
      u.lower = true;
      tile::run(u);
    }
    for (int i = 0; i < n; ++i) B.Akk[std::size_t(i) * L + i] = 0.0f;
    return;
  }
  // Vector gates: the rows in sub-chunks of kGateSubChunk = kLaneRows (the gated form's secondary
  // chunking, cpu/chunked/chunked_gated.cpp). Between sub-chunks I > J, with r_I = b at the row before I
  // and e_J = b at J's last row, exp(b_i - b_m) = exp(b_i - r_I) exp(r_I - e_J) exp(e_J - b_m),
  // three factors <= 1: Qh = Q . exp(b - r), Kh = K . exp(b - r), Kb = K . exp(e - b), and
  // subchunk_scores applies f_IJ = exp(r_I - e_J) to the packed Kb^T's rows. Within a sub-chunk,
  // lane_scores (a running product of exp(g), the rows in the vector lanes).
  static_assert(kGateSubChunk == kLaneRows);
  constexpr int c0 = kGateSubChunk;
  const int blocks = (n + c0 - 1) / c0;
  float* __restrict f = B.row;
  for (int j = 0; j < (blocks - 1) * c0; ++j) {  // Kb of every whole sub-chunk but the last
    const std::size_t o = std::size_t(j) * D;
    exp_of_difference(f, B.b + std::size_t(j / c0 * c0 + c0 - 1) * D, B.b + o, D);
    multiply_into(B.Kb + o, c.k + o, f, D);
  }
  for (int i = c0; i < n; ++i) {  // Qh and Kh of every sub-chunk but the first
    const std::size_t o = std::size_t(i) * D;
    exp_of_difference(f, B.b + o, B.b + std::size_t(i / c0 * c0 - 1) * D, D);
    multiply_into(B.Qh + o, c.q + o, f, D);
    multiply_into(B.Kh + o, c.k + o, f, D);
  }
  subchunk_scores<2>(D, n, B.b, B.Kb, {B.Qh, B.Kh}, {alpha, 1.0f}, {B.Aqk, B.Akk}, L, f, B.Bp);
  for (int I = 0; I < blocks; ++I) {
    const int i0 = I * c0;
    lane_scores<2>(D, i0, std::min(n, i0 + c0), i0, c.k, B.a, {c.q, c.k}, {alpha, 1.0f}, {B.Aqk, B.Akk}, L,
                   B.lanes);
  }
  for (int i = 0; i < n; ++i) {
    std::fill(B.Aqk + std::size_t(i) * L + i + 1, B.Aqk + std::size_t(i) * L + C, 0.0f);
    std::fill(B.Akk + std::size_t(i) * L + i, B.Akk + std::size_t(i) * L + C, 0.0f);  // A_kk: strictly lower
  }
}

// T = (I + diag(beta) A_kk)^-1 (cpu/chunked/unit_lower_inverse.hpp, shared with the AMX row), zero
// above the diagonal up to column C.
void invert(const Buffers& B, const Shape& s, const Chunk& c) { invert_unit_lower(B.Akk, s.L, c.beta, c.n, s.C, B.T, s.L); }

// X = (K . G) S, E = V - X (into X), R = diag(beta) E, W = T R (into Wm and its panels Wp) from
// the packed state Sp.
void solve(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n, L = s.L;
  const bool vector = p.decay == Decay::vector;
  Product ks = rows_product(B.X, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Kx : c.k, Dk, 1, B.Sp));
  ks.rs = vector ? nullptr : B.EQ;
  tile::run(ks);
  for (int i = 0; i < n; ++i) {
    const std::size_t o = std::size_t(i) * Dv;
    float *__restrict x = B.X + o, *__restrict r = B.R + o;
    const float* __restrict v = c.v + o;
    const float beta = c.beta[i];
#pragma omp simd
    for (int d = 0; d < Dv; ++d) {
      x[d] = v[d] - x[d];
      r[d] = beta * x[d];
    }
  }
  tile::pack(B.R, Dv, false, n, Dv, nullptr, B.Rp);
  tile::run(rows_product(B.Wm, Dv, n, Dv, seg(Range::lower, n, B.T, L, 1, B.Rp)));
  tile::pack(B.Wm, Dv, false, n, Dv, nullptr, B.Wp);
}

namespace {

// S <- exp(b_{n-1}) S + (K . exp(b_{n-1} - b))^T W on the packed state.
void advance_state(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n;
  if (p.decay == Decay::vector) {
    scale_state_rows(B.Sp, Dk, Dv, B.decay);
    state_product(B.Sp, Dk, Dv, n, B.Ke, B.Wp, 1.0f, 1.0f);
    return;
  }
  tile::pack(B.Wm, Dv, false, n, Dv, B.EK, B.Wep);
  state_product(B.Sp, Dk, Dv, n, c.k, B.Wep, 1.0f, B.decay[0]);
}

}  // namespace

// One chunk forward from the state in Sp (left as the state leaving it); o null: the state only.
void forward_chunk(const Buffers& B, const Shape& s, const Problem& p, const Chunk& c, float* o) {
  const int Dk = s.Dk, Dv = s.Dv, n = c.n, L = s.L;
  const bool vector = p.decay == Decay::vector;
  gate_operands(B, s, p, c);
  scores(B, s, p, c, 1.0f);
  invert(B, s, c);
  solve(B, s, p, c);
  if (o) {
    Product out = rows_product(o, Dv, n, Dv, seg(Range::full, Dk, vector ? B.Qx : c.q, Dk, 1, B.Sp),
                               float(attention_scale(Dk)));
    out.rs = vector ? nullptr : B.EQ;
    out.s2 = seg(Range::lower, n, B.Aqk, L, 1, B.Wp);
    tile::run(out);
  }
  advance_state(B, s, p, c);
}

namespace {

int forward_threads(const Problem& p) { return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())); }

}  // namespace
}  // namespace delta

std::size_t chunked_delta_kept_states_floats(const Problem& p) {
  using namespace delta;  // this kernel's parts
  std::size_t chunks = 0;  // over the sequences
  for (int n = 0; n < p.sequences(); ++n) chunks += std::size_t(chunks_of(p.slice(std::size_t(n) * p.heads).seq, p.chunk));
  return std::size_t(p.heads) * chunks * shape_of(p).SF;
}

std::size_t chunked_delta_forward_floats(const Problem& p) {
  using namespace delta;  // this kernel's parts
  return std::size_t(forward_threads(p)) * thread_floats(p, false, false, false) + order_ints(p);
}

void chunked_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  using namespace delta;  // this kernel's parts
  const Shape sh = shape_of(p);
  const int threads = forward_threads(p), Dk = sh.Dk, Dv = sh.Dv;
  const std::size_t per_thread = thread_floats(p, false, false, false);
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
  Workspace<int> order(allocator, order_ints(p));
  fill_order(p, order.data());
#pragma omp parallel num_threads(threads)
  {
    const Buffers B = carve(p, scratch.data() + omp_get_thread_num() * per_thread, false, false, false);
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < long(p.slices()); ++item) {
      const std::size_t index = std::size_t(sequence_at(order.data(), p, item / p.heads)) * p.heads + item % p.heads;
      const HeadSlice h = p.slice(index);
      float* kept = keep ? keep + kept_offset(p, index) * sh.SF : nullptr;
      tile::pack(a.h0 + h.state, Dv, false, Dk, Dv, nullptr, B.Sp);
      for (int ci = 0; ci < chunks_of(h.seq, p.chunk); ++ci) {
        const Chunk c = chunk_of(p, h, ci, a.q, a.k, a.v, a.beta, a.g);
        if (kept) std::copy_n(B.Sp, sh.SF, kept + ci * sh.SF);
        forward_chunk(B, sh, p, c, a.o + h.value + std::size_t(ci) * p.chunk * Dv);
      }
      tile::unpack(B.Sp, Dk, Dv, a.hT + h.state, Dv);
    }
  }
}

}  // namespace lattn::cpu

// The diagonal-plus-low-rank rule's scan on the CPU, float32, forward and backward (docs/spec.md section
// 1f), every decay and the shapes of section 1c: u_t = S_{t-1}^T b_t, S_t = A_t S_{t-1} + a_t u_t^T +
// k_t v_t^T, o_t = s S_t^T q_t, S: Dk x Dv, one per slice (Problem::slice: a sequence or packed
// document, and a value head), whose q and k rows are read in place from its q/k head and whose a,
// b and g are its own. Reference: kernels/linear_attention/reference_dplr.cpp.
//
// Every pass is a sequence of walks over a column block of a packed state (the layout of the delta
// rule's scan, cpu/scan/scan_delta_parts.hpp's pack_blocks: W columns a block, W =
// dplr_walk_width: 32 on AVX-512 and AVX2). A walk takes one token in one pass over the rows,
// each row loaded and stored once, with r the row's W columns:
//
//   yp += xp[i] r                    (a readout of the state before the step, optional)
//   r  <- r . A                      (the decay: a scalar, a factor per row, or per column)
//   r  <- r + x1[i] c1 + x2[i] c2    (two rank-one writes: row operands x, column operands c)
//   y_j += xr_j[i] r                 (one or two readouts of the state after the step)
//
// The columns of a state are independent in every pass when the vectors that couple its rows
// (u_t = S^T b_t forward, z_t = G^T a_t in reverse) are given, so a pass walks the state's column
// blocks one after another, each over a tile of tokens while it sits in L1 (Ctx::tile).
//
// Forward (one walk per token): the walk for token t writes a_t u_t^T + k_t v_t^T and reads out
// S_t^T q_t (o_t) and S_t^T b_{t+1} (u_{t+1}, the next walk's column operand); a first walk with no
// write reads u_0 = h0^T b_0.
//
// Backward, G_t = dL/dS_t, z_t = G_t^T a_t (the lines of reference_dplr.cpp), four passes per slice:
//   F1 (S, forward):    the forward again without o, keeping u_t (T x Dv).
//   R1 (G, reverse):    G_t = A_{t+1} G_{t+1} + b_{t+1} z_{t+1}^T + q_t (s do_t)^T; readouts
//                       dv_t = G_t^T k_t and z_t (kept, T x Dv); dh0 = A_0 G_0 + b_0 z_0^T.
//   R2 (G^T, reverse):  the same recurrence transposed, the row operands z_{t+1} and do_t, blocks of
//                       key channels; readouts dk_t = G_t v_t and da_t = G_t u_t.
//   F2 (S^T, forward):  S^T_t = S^T_{t-1} A_t + u_t a_t^T + v_t k_t^T; readouts db_t = S_{t-1} z_t
//                       (before the step) and dq_t = s S_t do_t (after).
//   dg from the identity of docs/spec.md section 1f, in double: dg_t = rowsum(h0 . dh0) -
//   sum_{tau < t} (q . dq - a . da - k . dk)_tau - sum_{tau <= t} (b . db)_tau, from this value
//   head's own dq and dk (kept apart from the other value heads of its q/k head until then).
// R1 and F1 carry only the column vectors between walks; R2 and F2 read u and z of every token,
// which is why the transposed passes come after the others. A thread takes a whole group (the
// value heads of one sequence sharing a q/k head), whose dq and dk it alone writes; the forward's
// threads take (slice, block of value columns) items.
// Over 500 lines: the walk and the four passes it is made of are read together, each pass's
// operands being the others' readouts.
#include <omp.h>

#include <algorithm>
#include <initializer_list>
#include <stdexcept>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/cpu/dplr.hpp"
#include "kernels/linear_attention/cpu/scan/delta_walk.hpp"
#include "kernels/linear_attention/cpu/scan/scan_delta_parts.hpp"
#include "kernels/linear_attention/cpu/scan/scan_split.hpp"

namespace lattn::cpu {
namespace {

using scan_delta::pack_blocks;
using scan_delta::unpack_blocks;

// The walk's width and the tokens a column block walks before the next block, per vector width.
// AVX2 takes 4 registers a row (W 32, as AVX-512's 2) over tiles of 8 tokens: on Zen 3 (D 128, T 4096)
// that was 1.14x the 2 registers (W 16) over 64 tokens, forward and backward, scalar and vector
// gates (scripts/ab.py, 7 rounds in two runs, every case 1.06-1.33x); either change alone was
// 0.96-1.20x, the smaller tile alone 0.98x. The 8 tokens' row operands (a, k, q, b and the gates:
// 20 KiB at Dk 128) stay in L1 beside the block while it walks them. AVX-512 keeps 64 tokens
// (unmeasured here).
int dplr_walk_width(Vec vec) { return vec == Vec::avx2 ? 32 : delta_walk_width(vec); }
int dplr_tile(Vec vec) { return vec == Vec::avx2 ? 8 : 64; }

// One token's pass over a packed block (the file's header).
struct Walk {
  int D = 0;           // rows
  float* S = nullptr;  // D x W
  WalkDecay decay = WalkDecay::none;
  float a_scalar = 1.0f;
  const float* a_rows = nullptr;  // D factors
  const float* a_cols = nullptr;  // W factors
  const float *x1 = nullptr, *x2 = nullptr;  // row operands, D floats each
  const float *c1 = nullptr, *c2 = nullptr;  // column operands, W floats each
  const float* xp = nullptr;                 // the readout before the step (null: none)
  float* yp = nullptr;
  int post = 1;  // readouts after the step: 1 or 2
  const float* xr[2] = {};
  float* yr[2] = {};
};

template <class I, int NV, WalkDecay DEC, bool PRE, int NP>
void walk(const Walk& w) {
  using V = typename I::V;
  constexpr std::ptrdiff_t L = I::L, W = L * NV;
  V c1[NV], c2[NV], ac[NV], yp[NV], y[NP][NV];
  for (int n = 0; n < NV; ++n) {
    c1[n] = I::loadu(w.c1 + n * L);
    c2[n] = I::loadu(w.c2 + n * L);
    ac[n] = DEC == WalkDecay::columns ? I::loadu(w.a_cols + n * L) : I::zero();
    yp[n] = I::zero();
    for (int j = 0; j < NP; ++j) y[j][n] = I::zero();
  }
  const V as = I::set1(w.a_scalar);
  // The operands' pointers in locals: read through w, every store to the state would make the
  // compiler load them again for the next row.
  float* const S = w.S;
  const float *__restrict x1 = w.x1, *__restrict x2 = w.x2, *__restrict ar = w.a_rows, *__restrict xp = w.xp;
  const float* __restrict xr[NP];
  for (int j = 0; j < NP; ++j) xr[j] = w.xr[j];
  const int D = w.D;
  for (int i = 0; i < D; ++i) {
    float* p = S + std::size_t(i) * W;
    V r[NV];
    for (int n = 0; n < NV; ++n) r[n] = I::loadu(p + n * L);
    if constexpr (PRE) {
      const V x = I::set1(xp[i]);
      for (int n = 0; n < NV; ++n) yp[n] = I::fma(x, r[n], yp[n]);
    }
    if constexpr (DEC == WalkDecay::scalar)
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], as);
    if constexpr (DEC == WalkDecay::rows) {
      const V a = I::set1(ar[i]);
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], a);
    }
    if constexpr (DEC == WalkDecay::columns)
      for (int n = 0; n < NV; ++n) r[n] = I::mul(r[n], ac[n]);
    const V u1 = I::set1(x1[i]), u2 = I::set1(x2[i]);
    for (int n = 0; n < NV; ++n) r[n] = I::fma(u2, c2[n], I::fma(u1, c1[n], r[n]));
    for (int j = 0; j < NP; ++j) {
      const V x = I::set1(xr[j][i]);
      for (int n = 0; n < NV; ++n) y[j][n] = I::fma(x, r[n], y[j][n]);
    }
    for (int n = 0; n < NV; ++n) I::storeu(p + n * L, r[n]);
  }
  for (int n = 0; n < NV; ++n) {
    if constexpr (PRE) I::storeu(w.yp + n * L, yp[n]);
    for (int j = 0; j < NP; ++j) I::storeu(w.yr[j] + n * L, y[j][n]);
  }
}

template <class I, int NV, WalkDecay DEC>
void walk_shaped(const Walk& w) {
  if (w.yp && w.post == 1) return walk<I, NV, DEC, true, 1>(w);
  if (!w.yp && w.post == 1) return walk<I, NV, DEC, false, 1>(w);
  if (!w.yp && w.post == 2) return walk<I, NV, DEC, false, 2>(w);
  throw std::logic_error("scan_dplr: no walk of these readouts");
}

template <class I, int NV>
void walk_decayed(const Walk& w) {
  switch (w.decay) {
    case WalkDecay::none: return walk_shaped<I, NV, WalkDecay::none>(w);
    case WalkDecay::scalar: return walk_shaped<I, NV, WalkDecay::scalar>(w);
    case WalkDecay::rows: return walk_shaped<I, NV, WalkDecay::rows>(w);
    case WalkDecay::columns: return walk_shaped<I, NV, WalkDecay::columns>(w);
  }
}

// The widths match dplr_walk_width: 2 registers of 16 lanes, 4 of 8, or 8 portable lanes.
void run_walk(const Walk& w, Vec vec) {
  switch (vec) {
#if defined(__AVX512F__)
    case Vec::avx512: return walk_decayed<simd::Avx512, 2>(w);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case Vec::avx2: return walk_decayed<simd::Avx2, 4>(w);
#endif
    default: return walk_decayed<simd::Portable, 8>(w);
  }
}

struct Ctx {
  Vec vec;
  int Dk, Dv, W;
  int Dkp, Dvp;  // rounded up to W
  int gw;        // gate floats per token in the tile buffer: Dkp (vector), 1 (scalar), 0
  int tile;      // tokens a column block walks before the next (dplr_tile)
  Decay decay;
  float s;
  int longest;  // the longest slice's tokens (the backward's per-token buffers)
};

Ctx context(const Problem& p) {
  Ctx x;
  x.vec = active_vec();
  x.Dk = p.dim;
  x.Dv = p.value_dim();
  x.W = dplr_walk_width(x.vec);
  x.tile = dplr_tile(x.vec);
  x.Dkp = (x.Dk + x.W - 1) / x.W * x.W;
  x.Dvp = (x.Dv + x.W - 1) / x.W * x.W;
  x.gw = p.decay == Decay::vector ? x.Dkp : p.decay == Decay::scalar ? 1 : 0;
  x.decay = p.decay;
  x.s = float(attention_scale(p.dim));
  x.longest = 0;
  for (int n = 0; n < p.sequences(); ++n) x.longest = std::max(x.longest, p.slice(std::size_t(n) * p.heads).seq);
  return x;
}

// One thread's buffers, carved from its block (base null: only counted).
struct Scratch {
  float* S;      // packed state: Dk x Dvp, or (backward) Dv x Dkp
  float* gates;  // exp(g) of a tile's tokens and the one after it, (tile + 1) x gw
  float* carry;  // Dvp: the column operand a walk leaves for the next (u forward, z in reverse)
  float *c1, *c2, *zeros, *y0, *y1, *yp;  // W each
  float *u, *z;                           // backward: longest x Dv each
  float *dq, *dk;                         // backward: longest x Dk each, one value head's
  double* dg_acc;                         // backward, gated: Dk
  std::size_t used = 0;
};

Scratch carve(const Ctx& x, float* base, bool backward) {
  Scratch s;
  auto take = [&](std::size_t n) {
    float* out = base ? base + s.used : nullptr;
    s.used += n;
    return out;
  };
  const std::size_t Dk = x.Dk, Dv = x.Dv, T = x.longest;
  s.dg_acc = reinterpret_cast<double*>(take(backward && x.gw ? 2 * Dk : 0));  // first: 8-byte aligned
  s.S = take(backward ? std::max(Dk * x.Dvp, Dv * x.Dkp) : Dk * x.Dvp);
  s.gates = take(std::size_t(x.tile + 1) * x.gw);
  s.carry = take(x.Dvp);
  for (float** p : {&s.c1, &s.c2, &s.zeros, &s.y0, &s.y1, &s.yp}) *p = take(x.W);
  s.u = take(backward ? T * Dv : 0);
  s.z = take(backward ? T * Dv : 0);
  s.dq = take(backward ? T * Dk : 0);
  s.dk = take(backward ? T * Dk : 0);
  s.used = (s.used + 15) / 16 * 16;  // each thread's block on its own cache line
  if (base) std::fill_n(s.zeros, x.W, 0.0f);
  return s;
}

// One slice's inputs.
struct Head {
  const float *q, *k, *v, *a, *b, *g;  // g: this slice's log-gates, or null
  float gamma;                         // retnet's (1 otherwise)
  int T;
};

Head head_of(const Problem& p, const HeadSlice& h, const float* q, const float* k, const float* v, const float* a,
             const float* b, const float* g) {
  const std::size_t low = p.low_rank_offset(h);
  return {q + h.key, k + h.key, v + h.value, a + low, b + low, g ? g + h.gate : nullptr,
          float(decay_gamma(p.decay, h.head)), h.seq};
}

// exp(g) of tokens [first, first + count) (those before T) into the tile buffer, zero-padded.
void take_gates(const Ctx& x, const Head& h, float* buf, int first, int count) {
  if (x.gw) take_exp_gates(h.g, h.T, x.decay == Decay::vector ? x.Dk : 1, x.gw, buf, first, count);
}

// A_t on a walk over block c: on the rows of S or G (key channels), or on the columns of S^T or
// G^T. The buffer holds tokens from `first`.
void set_decay(const Ctx& x, const Head& h, const float* buf, int first, int t, int c, bool transposed, Walk& w) {
  w.decay = WalkDecay::none;
  switch (x.decay) {
    case Decay::retnet:
      w.decay = WalkDecay::scalar;
      w.a_scalar = h.gamma;
      return;
    case Decay::scalar:
      w.decay = WalkDecay::scalar;
      w.a_scalar = buf[t - first];
      return;
    case Decay::vector: {
      const float* row = buf + std::size_t(t - first) * x.gw;
      w.decay = transposed ? WalkDecay::columns : WalkDecay::rows;
      w.a_rows = row;
      w.a_cols = row + c;
      return;
    }
    default: return;
  }
}

// W floats of x from column c, scaled, zero past column n: x itself where the block is whole and
// unscaled, else written to out. Per token and block, so its cost is the walk's overhead: the
// masked copy every call took was a third of the forward's time beside the walks (Zen 3, D 128).
const float* padded(float* out, const float* x, float scale, int n, int W, int c) {
  if (c + W <= n) {
    if (scale == 1.0f) return x + c;
    for (int j = 0; j < W; ++j) out[j] = scale * x[c + j];
    return out;
  }
  for (int j = 0; j < W; ++j) out[j] = c + j < n ? scale * x[c + j] : 0.0f;
  return out;
}

// The forward recurrence on value columns [c0, c1) of one slice from h0: o (when given, rows Dv
// apart), u_t (when given: the backward's F1, rows Dv apart) and hT (when given).
void forward_columns(const Ctx& x, const Head& h, const float* h0, int c0, int c1, const Scratch& s, float* o, float* u,
                     float* hT) {
  const int Dk = x.Dk, Dv = x.Dv, W = x.W, T = h.T;
  pack_blocks(h0, false, s.S, Dk, Dv, W, c0, c1);
  if (T > 0)
    for (int c = c0; c < c1; c += W) {  // u_0 = h0^T b_0
      Walk w;
      w.D = Dk;
      w.S = s.S + std::size_t(c) * Dk;
      w.x1 = w.x2 = h.b;
      w.c1 = w.c2 = s.zeros;
      w.xr[0] = h.b;
      w.yr[0] = s.carry + c;
      run_walk(w, x.vec);
    }
  for (int t0 = 0; t0 < T; t0 += x.tile) {
    const int n = std::min(x.tile, T - t0);
    take_gates(x, h, s.gates, t0, n);
    for (int c = c0; c < c1; c += W) {
      const int m = std::min(W, Dv - c);
      // One Walk for the block's tokens, every field that varies set per token: a fresh one
      // each token was zeroed by a `rep stos`, tens of cycles a walk.
      Walk w;
      w.D = Dk;
      w.S = s.S + std::size_t(c) * Dk;
      w.c1 = s.carry + c;  // the walk reads its column operands before it writes its readouts
      for (int t = t0; t < t0 + n; ++t) {
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        if (u) std::copy_n(s.carry + c, m, u + rv + c);
        const bool next = t + 1 < T;
        if (!o && !hT && !next) break;  // F1 needs no S_{T-1}
        set_decay(x, h, s.gates, t0, t, c, false, w);
        w.x1 = h.a + rk;
        w.x2 = h.k + rk;
        w.c2 = padded(s.c2, h.v + rv, 1.0f, Dv, W, c);
        int np = 0;
        if (o) {
          w.xr[np] = h.q + rk;
          w.yr[np++] = s.y0;
        }
        if (next) {  // u_{t+1} = S_t^T b_{t+1}, straight into the carry the next walk reads
          w.xr[np] = h.b + rk + Dk;
          w.yr[np++] = s.carry + c;
        }
        if (np == 0) {  // hT's last step without o: a readout left unused
          w.xr[np] = h.q + rk;
          w.yr[np++] = s.y0;
        }
        w.post = np;
        run_walk(w, x.vec);
        if (o)
          for (int j = 0; j < m; ++j) o[rv + c + j] = x.s * s.y0[j];
      }
    }
  }
  if (hT) unpack_blocks(s.S, hT, Dk, Dv, W, c0, c1);
}

// One value head's outputs of the backward.
struct SliceGrads {
  const float *h0, *dO, *dhT;
  float *dv, *da, *db, *dh0, *dg;  // dg null without gates
};

void backward_slice(const Ctx& x, const Head& h, const SliceGrads& d, const Scratch& s) {
  const int Dk = x.Dk, Dv = x.Dv, W = x.W, T = h.T;
  const float sc = x.s;
  // F1: u_t of every token.
  forward_columns(x, h, d.h0, 0, Dv, s, nullptr, s.u, nullptr);

  // R1: G over value-column blocks, in reverse; dv_t, z_t; dh0.
  pack_blocks(d.dhT, false, s.S, Dk, Dv, W, 0, Dv);
  std::fill_n(s.carry, x.Dvp, 0.0f);
  const int last_tile = T > 0 ? (T - 1) / x.tile * x.tile : 0;
  for (int t0 = last_tile; t0 >= 0 && T > 0; t0 -= x.tile) {
    const int n = std::min(x.tile, T - t0);
    take_gates(x, h, s.gates, t0, n + 1);
    for (int c = 0; c < Dv; c += W) {
      const int m = std::min(W, Dv - c);
      Walk w;  // the block's tokens' (the forward's comment)
      w.D = Dk;
      w.S = s.S + std::size_t(c) * Dk;
      w.c1 = s.carry + c;  // z_{t+1}, zero at the last token
      w.post = 2;
      w.yr[0] = s.y0;
      w.yr[1] = s.carry + c;  // z_t, the next walk's column operand
      for (int t = t0 + n - 1; t >= t0; --t) {
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        const bool carried = t + 1 < T;  // G_{t+1} exists (else the state holds dhT)
        w.decay = WalkDecay::none;
        if (carried) set_decay(x, h, s.gates, t0, t + 1, c, false, w);
        w.x1 = h.b + (carried ? rk + Dk : rk);
        w.x2 = h.q + rk;
        w.c2 = padded(s.c2, d.dO + rv, sc, Dv, W, c);
        w.xr[0] = h.k + rk;
        w.xr[1] = h.a + rk;
        run_walk(w, x.vec);
        std::copy_n(s.y0, m, d.dv + rv + c);
        std::copy_n(s.carry + c, m, s.z + rv + c);
      }
    }
  }
  for (int c = 0; c < Dv && T > 0; c += W) {  // dh0 = A_0 G_0 + b_0 z_0^T (the gates buffer holds token 0)
    Walk w;
    w.D = Dk;
    w.S = s.S + std::size_t(c) * Dk;
    set_decay(x, h, s.gates, 0, 0, c, false, w);
    w.x1 = w.x2 = h.b;
    w.c1 = s.carry + c;
    w.c2 = s.zeros;
    w.xr[0] = h.b;
    w.yr[0] = s.y0;
    run_walk(w, x.vec);
  }
  unpack_blocks(s.S, d.dh0, Dk, Dv, W, 0, Dv);

  // R2: G^T over key-column blocks, in reverse; dk_t, da_t.
  pack_blocks(d.dhT, true, s.S, Dv, Dk, W, 0, Dk);
  for (int t0 = last_tile; t0 >= 0 && T > 0; t0 -= x.tile) {
    const int n = std::min(x.tile, T - t0);
    take_gates(x, h, s.gates, t0, n + 1);
    for (int c = 0; c < Dk; c += W) {
      const int m = std::min(W, Dk - c);
      Walk w;  // the block's tokens' (the forward's comment)
      w.D = Dv;
      w.S = s.S + std::size_t(c) * Dv;
      w.post = 2;
      w.yr[0] = s.y0;
      w.yr[1] = s.y1;
      for (int t = t0 + n - 1; t >= t0; --t) {
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        const bool carried = t + 1 < T;
        w.decay = WalkDecay::none;
        if (carried) set_decay(x, h, s.gates, t0, t + 1, c, true, w);
        w.x1 = s.z + (carried ? rv + Dv : rv);
        w.c1 = carried ? padded(s.c1, h.b + rk + Dk, 1.0f, Dk, W, c) : s.zeros;
        w.x2 = d.dO + rv;
        w.c2 = padded(s.c2, h.q + rk, sc, Dk, W, c);
        w.xr[0] = h.v + rv;
        w.xr[1] = s.u + rv;
        run_walk(w, x.vec);
        std::copy_n(s.y0, m, s.dk + rk + c);
        std::copy_n(s.y1, m, d.da + rk + c);
      }
    }
  }

  // F2: S^T over key-column blocks, forward; db_t (before the step) and dq_t.
  pack_blocks(d.h0, true, s.S, Dv, Dk, W, 0, Dk);
  for (int t0 = 0; t0 < T; t0 += x.tile) {
    const int n = std::min(x.tile, T - t0);
    take_gates(x, h, s.gates, t0, n);
    for (int c = 0; c < Dk; c += W) {
      const int m = std::min(W, Dk - c);
      Walk w;  // the block's tokens' (the forward's comment)
      w.D = Dv;
      w.S = s.S + std::size_t(c) * Dv;
      w.yp = s.yp;
      w.post = 1;
      w.yr[0] = s.y0;
      for (int t = t0; t < t0 + n; ++t) {
        const std::size_t rk = std::size_t(t) * Dk, rv = std::size_t(t) * Dv;
        w.xp = s.z + rv;
        set_decay(x, h, s.gates, t0, t, c, true, w);
        w.x1 = s.u + rv;
        w.c1 = padded(s.c1, h.a + rk, 1.0f, Dk, W, c);
        w.x2 = h.v + rv;
        w.c2 = padded(s.c2, h.k + rk, 1.0f, Dk, W, c);
        w.xr[0] = d.dO + rv;
        run_walk(w, x.vec);
        std::copy_n(s.yp, m, d.db + rk + c);
        for (int j = 0; j < m; ++j) s.dq[rk + c + j] = sc * s.y0[j];
      }
    }
  }

  if (!d.dg) return;
  // dg by the identity (the file's header), per key channel in double.
  double* acc = s.dg_acc;
  for (int i = 0; i < Dk; ++i) {
    double sum = 0;
    for (int j = 0; j < Dv; ++j) sum += double(d.h0[std::size_t(i) * Dv + j]) * d.dh0[std::size_t(i) * Dv + j];
    acc[i] = sum;
  }
  for (int t = 0; t < T; ++t) {
    const std::size_t rk = std::size_t(t) * Dk;
    double total = 0;
    for (int i = 0; i < Dk; ++i) {
      acc[i] -= double(h.b[rk + i]) * d.db[rk + i];
      total += acc[i];
      if (x.decay == Decay::vector) d.dg[rk + i] = float(acc[i]);
      acc[i] -= double(h.q[rk + i]) * s.dq[rk + i] - double(h.a[rk + i]) * d.da[rk + i] -
                double(h.k[rk + i]) * s.dk[rk + i];
    }
    if (x.decay == Decay::scalar) d.dg[t] = float(total);
  }
}

}  // namespace

std::size_t scan_dplr_forward_floats(const Problem& p) {
  const Ctx x = context(p);
  return std::size_t(scan_split(p, 1, column_blocks(x.Dv, x.W)).threads) * carve(x, nullptr, false).used;
}

std::size_t scan_dplr_backward_floats(const Problem& p) {
  const Ctx x = context(p);
  return std::size_t(scan_split(p, p.group(), 1).threads) * carve(x, nullptr, true).used;
}

void scan_dplr_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const Split split = scan_split(p, 1, column_blocks(x.Dv, x.W));
  run_split(
      p, split, carve(x, nullptr, false).used, allocator, [&](float* floats) { return carve(x, floats, false); },
      [&](const Scratch& s, long slice, int b0, int b1) {
        const HeadSlice h = p.slice(std::size_t(slice));
        const Columns v = block_columns(b0, b1, x.W, x.Dv);
        forward_columns(x, head_of(p, h, a.q, a.k, a.v, a.a, a.b, a.g), a.h0 + h.state, v.first, v.last, s,
                        a.o + h.value, nullptr, a.hT + h.state);
      });
}

void scan_dplr_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const int G = p.group();
  const Split split = scan_split(p, G, 1);
  run_split(
      p, split, carve(x, nullptr, true).used, allocator, [&](float* floats) { return carve(x, floats, true); },
      [&](const Scratch& s, long unit, int, int) {
        for (int member = 0; member < G; ++member) {
          const HeadSlice h = p.slice(std::size_t(unit) * G + member);
          const std::size_t low = p.low_rank_offset(h), rows = std::size_t(h.seq) * x.Dk;
          const Head head = head_of(p, h, a.q, a.k, a.v, a.a, a.b, a.g);
          backward_slice(x, head,
                         {a.h0 + h.state, a.dO + h.value, a.dhT + h.state, a.dv + h.value, a.da + low, a.db + low,
                          a.dh0 + h.state, a.dg ? a.dg + h.gate : nullptr},
                         s);
          // dq and dk of the q/k head: the first value head's, then the others' added.
          float *dq = a.dq + h.key, *dk = a.dk + h.key;
          if (member == 0) {
            std::copy_n(s.dq, rows, dq);
            std::copy_n(s.dk, rows, dk);
          } else {
#pragma omp simd
            for (std::size_t i = 0; i < rows; ++i) dq[i] += s.dq[i];
#pragma omp simd
            for (std::size_t i = 0; i < rows; ++i) dk[i] += s.dk[i];
          }
        }
      });
}

}  // namespace lattn::cpu

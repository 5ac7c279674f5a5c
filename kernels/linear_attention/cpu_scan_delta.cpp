// The delta rule's scan on the CPU, float32, forward and backward (docs/spec.md section 1b), for every
// decay: S'_t = A_t S_{t-1}, u_t = S'_t^T k_t, w_t = beta_t (v_t - u_t), S_t = S'_t + k_t w_t^T,
// o_t = s S_t^T q_t = s (S'_t^T q_t + (q_t . k_t) w_t).
//
// Every pass is a sequence of walks (cpu_delta_walk.hpp), one per token, over column blocks of a
// packed state; the columns of S (and of G, S^T, G^T) are independent in every pass, so a block is
// walked through all tokens of a tile before the next block, and the tile's token rows are read
// from L2 by every block after the first.
//
// Forward (one walk per token, each row loaded and stored once): walk t applies token t-1's
// pending update k_{t-1} w_{t-1}^T, the decay A_t, and reads out u_t and S'^T_t q_t; w_t and o_t
// follow from them, and a last walk applies w_{T-1} for hT.
//
// Backward, with G_t = dL/dS_t, P_t = dL/dS'_t = G_t - k_t dv_t^T (dv_t = beta_t G_t^T k_t), and
// e_t = v_t - u_t:
//   F1 (S, forward):   e_t, kept in dq's storage until F2 overwrites it.
//   R1 (G, reverse):   G_t = A_{t+1} P_{t+1} + s q_t do_t^T; dv_t = beta_t G_t^T k_t; dbeta_t =
//                      (G_t^T k_t) . e_t; dh0 = A_0 P_0. G's recurrence needs no forward state.
//   R2 (G^T, reverse): the same recurrence transposed; dk_t's write part beta_t G_t e_t.
//   F2 (S^T, forward): dk_t's read part -S'_t dv_t (S'^T read out before token t's update) and
//                      dq_t = s S_t do_t.
//   dg from the identity (docs/kernels.md): with the gates' cumulative sums b_t, o and hT depend on
//   them only through q_t . exp(b_t), the write key k_t . exp(-b_t) and the read key k_t .
//   exp(b_t), so dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q . dq - k . dk_write + k . dk_read)_tau,
//   summed in F2's walks, per key channel (F2's columns), in double.
// No state per token and no checkpoints: the only forward state the backward needs is h0, from
// which F1 and F2 recompute the forward recurrence (2 of the backward's 4 passes). The passes of a
// head depend on each other's full columns (R2 reads all of dv_t, F2 all of e_t), so the backward's
// threads take whole heads; the forward's take (head, column block) items as the additive scan's.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_delta.hpp"
#include "kernels/linear_attention/cpu_delta_walk.hpp"
#include "kernels/linear_attention/cpu_scan_split.hpp"

namespace lattn::cpu {
namespace {

constexpr int kTile = 64;  // tokens per tile: 64 tokens of ~5 row operands of D = 128 are 160 KiB, in L2

struct Ctx {
  Vec vec;
  int T, D, W, Dp, gw;  // Dp: D rounded up to W; gw: gate floats per token in the tile buffer
  Decay decay;
  float s;
};

Ctx context(const Problem& p) {
  Ctx x;
  x.vec = active_vec();
  x.T = p.seq;
  x.D = p.dim;
  x.W = delta_walk_width(x.vec);
  x.Dp = (p.dim + x.W - 1) / x.W * x.W;
  x.gw = p.decay == Decay::vector ? x.Dp : p.decay == Decay::scalar ? 1 : 0;
  x.decay = p.decay;
  x.s = float(attention_scale(p.dim));
  return x;
}

// One thread's buffers, carved from its block (base null: only counted).
struct Scratch {
  double* dg_acc;  // Dp: dg's running sums per key channel
  float *S, *ST;   // packed states, D x Dp (ST: backward only)
  float *gates;    // exp(g) of a tile's tokens (and the one after), (kTile + 1) x gw
  float *stage;    // e of a tile's tokens, kTile x D (backward only)
  float *carry;    // Dp: the pending update's column operand of each block
  float *c1, *c2, *y1, *y2, *y3;  // W each
  float* qk;       // kTile: q_t . k_t (forward)
  std::size_t used = 0;
};

Scratch carve(const Ctx& x, float* base, bool backward) {
  Scratch s;
  auto take = [&](std::size_t n) {
    float* out = base ? base + s.used : nullptr;
    s.used += n;
    return out;
  };
  const std::size_t D = x.D, Dp = x.Dp, W = x.W;
  s.dg_acc = reinterpret_cast<double*>(take(backward && x.gw ? 2 * Dp : 0));
  s.S = take(D * Dp);
  s.ST = take(backward ? D * Dp : 0);
  s.gates = take(std::size_t(kTile + 1) * x.gw);
  s.stage = take(backward ? kTile * D : 0);
  s.carry = take(Dp);
  for (float** p : {&s.c1, &s.c2, &s.y1, &s.y2, &s.y3}) *p = take(W);
  s.qk = take(kTile);
  s.used = (s.used + 15) / 16 * 16;  // each thread's block on its own cache line
  return s;
}

// Columns [c0, c1) of a D x D matrix (or its transpose) into blocks of W columns, zero-padded:
// block c / W at dst + c * D, row i at i * W.
void pack_blocks(const float* src, bool transposed, float* dst, int D, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    float* blk = dst + std::size_t(c) * D;
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < W; ++j)
        blk[std::size_t(i) * W + j] =
            c + j >= D ? 0.0f : transposed ? src[std::size_t(c + j) * D + i] : src[std::size_t(i) * D + c + j];
  }
}

void unpack_blocks(const float* src, float* dst, int D, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    const float* blk = src + std::size_t(c) * D;
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < std::min(W, D - c); ++j) dst[std::size_t(i) * D + c + j] = blk[std::size_t(i) * W + j];
  }
}

// W floats of x (D of them) from column c, scaled, zero past the last.
void padded(float* out, const float* x, float scale, int D, int W, int c) {
  for (int j = 0; j < W; ++j) out[j] = c + j < D ? scale * x[c + j] : 0.0f;
}

// This head's inputs.
struct Head {
  const float *q, *k, *v, *beta, *g;  // g: this head's log-gates, or null
  float gamma;                         // retnet's (1 otherwise)
};

Head head_of(const Problem& p, long bh, const float* q, const float* k, const float* v, const float* beta,
             const float* g) {
  const std::size_t tok = bh * p.head_token_elems();
  return {q + tok, k + tok, v + tok, beta + bh * p.seq, g ? g + bh * p.head_gate_elems() : nullptr,
          float(decay_gamma(p.decay, int(bh % p.heads)))};
}

// exp(g) of tokens [first, first + count) (those before T) into the tile buffer.
void take_gates(const Ctx& x, const Head& h, float* buf, int first, int count) {
  if (!x.gw) return;
  const int last = std::min(x.T, first + count), width = x.decay == Decay::vector ? x.D : 1;
  for (int t = first; t < last; ++t) {
    const float* g = h.g + std::size_t(t) * width;
    float* out = buf + std::size_t(t - first) * x.gw;
#pragma omp simd
    for (int d = 0; d < width; ++d) out[d] = exp_nonpositive(g[d]);
    for (int d = width; d < x.gw; ++d) out[d] = 0.0f;
  }
}

// A_t on a walk over block c of S or G (rows: the key channels) or of S^T or G^T (columns); no
// decay for t past the last token (the first step of a reverse pass). buf holds tokens from first.
void set_decay(const Ctx& x, const Head& h, const float* buf, int first, int t, int c, bool transposed, DeltaWalk& w) {
  w.decay = WalkDecay::none;
  if (t >= x.T) return;
  switch (x.decay) {
    case Decay::none: return;
    case Decay::retnet:
      w.decay = WalkDecay::scalar;
      w.a_scalar = h.gamma;
      return;
    case Decay::scalar:
      w.decay = WalkDecay::scalar;
      w.a_scalar = buf[t - first];
      return;
    case Decay::vector:
      w.decay = transposed ? WalkDecay::columns : WalkDecay::rows;
      if (transposed) w.a_cols = buf + std::size_t(t - first) * x.gw + c;
      else w.a_rows = buf + std::size_t(t - first) * x.gw;
      return;
  }
}

// The forward recurrence on columns [c0, c1) of one head from h0: o (when given), e_t = v_t - u_t
// (when given) and hT (when given).
void forward_columns(const Ctx& x, const Head& h, const float* h0, int c0, int c1, const Scratch& s, float* o,
                     float* e, float* hT) {
  const int D = x.D, W = x.W, T = x.T;
  pack_blocks(h0, false, s.S, D, W, c0, c1);
  std::fill(s.carry + c0, s.carry + std::min(x.Dp, (c1 + W - 1) / W * W), 0.0f);
  for (int t0 = 0; t0 < T; t0 += kTile) {
    const int n = std::min(kTile, T - t0);
    take_gates(x, h, s.gates, t0, n);
    if (o)
      for (int u = 0; u < n; ++u) {
        const float *qt = h.q + std::size_t(t0 + u) * D, *kt = h.k + std::size_t(t0 + u) * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += qt[d] * kt[d];
        s.qk[u] = dot;
      }
    for (int c = c0; c < c1; c += W) {
      float* carry = s.carry + c;
      const int m = std::min(W, D - c);
      for (int u = 0; u < n; ++u) {
        const int t = t0 + u;
        const std::size_t r = std::size_t(t) * D;
        DeltaWalk w;
        w.D = D;
        w.S = s.S + std::size_t(c) * D;
        w.b1 = h.k + (t > 0 ? r - D : r);  // token t-1's pending update (none before token 0: carry 0)
        w.c1 = carry;
        set_decay(x, h, s.gates, t0, t, c, false, w);
        w.x1 = h.k + r;
        w.y1 = s.y1;
        if (o) {
          w.x2 = h.q + r;
          w.y2 = s.y2;
        }
        run_delta_walk(w, x.vec);
        const float beta = h.beta[t];
        for (int j = 0; j < m; ++j) {
          const float ej = h.v[r + c + j] - s.y1[j];
          carry[j] = beta * ej;
          if (e) e[r + c + j] = ej;
          if (o) o[r + c + j] = x.s * (s.y2[j] + s.qk[u] * carry[j]);
        }
      }
    }
  }
  if (!hT) return;
  for (int c = c0; c < c1; c += W) {
    DeltaWalk w;
    w.D = D;
    w.S = s.S + std::size_t(c) * D;
    w.b1 = h.k + std::size_t(T - 1) * D;
    w.c1 = s.carry + c;
    run_delta_walk(w, x.vec);
  }
  unpack_blocks(s.S, hT, D, W, c0, c1);
}

int backward_threads(const Problem& p) { return head_parallel_threads(p); }

void backward_head(const Ctx& x, const Problem& p, long bh, const BackwardArgs<float>& a, const Scratch& s) {
  const int D = x.D, W = x.W, T = x.T;
  const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
  const Head h = head_of(p, bh, a.q, a.k, a.v, a.beta, a.g);
  const float* dO = a.dO + tok;
  float *dq = a.dq + tok, *dk = a.dk + tok, *dv = a.dv + tok, *dbeta = a.dbeta + bh * T;
  float* dg = a.dg ? a.dg + bh * p.head_gate_elems() : nullptr;
  float* E = dq;  // e_t, until F2 writes dq over it

  forward_columns(x, h, a.h0 + st, 0, D, s, nullptr, E, nullptr);  // F1

  // R1 and R2, a tile of tokens at a time in reverse: R1 on every block (dv of the tile complete),
  // then R2, which reads all of dv_{t+1}.
  pack_blocks(a.dhT + st, false, s.S, D, W, 0, D);
  pack_blocks(a.dhT + st, true, s.ST, D, W, 0, D);
  std::fill_n(s.carry, x.Dp, 0.0f);  // -dv_{t+1} of each block
  for (int t1 = T; t1 > 0; t1 -= kTile) {
    const int t0 = std::max(0, t1 - kTile);
    take_gates(x, h, s.gates, t0 + 1, t1 - t0);  // A_{t+1}
    for (int c = 0; c < D; c += W) {
      const int m = std::min(W, D - c);
      for (int t = t1 - 1; t >= t0; --t) {
        const std::size_t r = std::size_t(t) * D;
        DeltaWalk w;
        w.D = D;
        w.S = s.S + std::size_t(c) * D;
        w.b1 = h.k + (t + 1 < T ? r + D : r);  // the carry is 0 at T - 1
        w.c1 = s.carry + c;
        set_decay(x, h, s.gates, t0 + 1, t + 1, c, false, w);
        padded(s.c2, dO + r, x.s, D, W, c);
        w.b2 = h.q + r;
        w.c2 = s.c2;
        w.x3 = h.k + r;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        const float beta = h.beta[t];
        float db = 0.0f;
        for (int j = 0; j < m; ++j) {
          dv[r + c + j] = beta * s.y3[j];
          s.carry[c + j] = -dv[r + c + j];
          db += s.y3[j] * E[r + c + j];
        }
        dbeta[t] = c == 0 ? db : dbeta[t] + db;
      }
    }
    for (int c = 0; c < D; c += W) {
      const int m = std::min(W, D - c);
      for (int t = t1 - 1; t >= t0; --t) {
        const std::size_t r = std::size_t(t) * D;
        const bool last = t + 1 == T;
        DeltaWalk w;
        w.D = D;
        w.S = s.ST + std::size_t(c) * D;
        w.b1 = dv + (last ? r : r + D);
        if (last) std::fill_n(s.c1, W, 0.0f);
        else padded(s.c1, h.k + r + D, -1.0f, D, W, c);
        w.c1 = s.c1;
        set_decay(x, h, s.gates, t0 + 1, t + 1, c, true, w);
        padded(s.c2, h.q + r, x.s, D, W, c);
        w.b2 = dO + r;
        w.c2 = s.c2;
        w.x3 = E + r;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        const float beta = h.beta[t];
        for (int j = 0; j < m; ++j) dk[r + c + j] = beta * s.y3[j];
      }
    }
  }
  // dh0 = A_0 P_0: token 0's pending update and its decay.
  take_gates(x, h, s.gates, 0, 1);
  for (int c = 0; c < D; c += W) {
    DeltaWalk w;
    w.D = D;
    w.S = s.S + std::size_t(c) * D;
    w.b1 = h.k;
    w.c1 = s.carry + c;
    set_decay(x, h, s.gates, 0, 0, c, false, w);
    run_delta_walk(w, x.vec);
  }
  unpack_blocks(s.S, a.dh0 + st, D, W, 0, D);

  // F2 on S^T from h0^T; dg's sums start at rowsum(dh0 . h0).
  if (dg)
    for (int i = 0; i < D; ++i) {
      double sum = 0;
      for (int j = 0; j < D; ++j) sum += double(a.dh0[st + std::size_t(i) * D + j]) * a.h0[st + std::size_t(i) * D + j];
      s.dg_acc[i] = sum;
    }
  pack_blocks(a.h0 + st, true, s.ST, D, W, 0, D);
  for (int t0 = 0; t0 < T; t0 += kTile) {
    const int n = std::min(kTile, T - t0);
    std::copy_n(E + std::size_t(t0) * D, std::size_t(n) * D, s.stage);
    take_gates(x, h, s.gates, t0, n);
    for (int c = 0; c < D; c += W) {
      const int m = std::min(W, D - c);
      for (int t = t0; t < t0 + n; ++t) {
        const std::size_t r = std::size_t(t) * D;
        DeltaWalk w;
        w.D = D;
        w.S = s.ST + std::size_t(c) * D;
        set_decay(x, h, s.gates, t0, t, c, true, w);
        w.x1 = dv + r;
        w.y1 = s.y1;
        padded(s.c2, h.k + r, h.beta[t], D, W, c);
        w.b2 = s.stage + std::size_t(t - t0) * D;
        w.c2 = s.c2;
        w.x3 = dO + r;
        w.y3 = s.y3;
        run_delta_walk(w, x.vec);
        double total = 0;
        for (int j = 0; j < m; ++j) {
          const std::size_t e = r + c + j;
          const float dq_e = x.s * s.y3[j], read = -s.y1[j], write = dk[e];
          dq[e] = dq_e;
          dk[e] = write + read;
          if (dg) {
            double& acc = s.dg_acc[c + j];
            if (x.decay == Decay::vector) dg[e] = float(acc);
            else total += acc;
            acc -= double(h.q[e]) * dq_e - double(h.k[e]) * write + double(h.k[e]) * read;
          }
        }
        if (dg && x.decay == Decay::scalar) dg[t] = c == 0 ? float(total) : dg[t] + float(total);
      }
    }
  }
}

}  // namespace

std::size_t scan_delta_forward_floats(const Problem& p) {
  const Ctx x = context(p);
  return std::size_t(scan_split(p, x.W).threads) * carve(x, nullptr, false).used;
}

std::size_t scan_delta_backward_floats(const Problem& p) {
  return std::size_t(backward_threads(p)) * carve(context(p), nullptr, true).used;
}

void scan_delta_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const Split split = scan_split(p, x.W);
  const std::size_t per_thread = carve(x, nullptr, false).used;
  Workspace<float> scratch(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
  {
    const Scratch s = carve(x, scratch.data() + omp_get_thread_num() * per_thread, false);
    for_each_share(split, [&](long bh, int c0, int c1) {
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const Head h = head_of(p, bh, a.q, a.k, a.v, a.beta, a.g);
      forward_columns(x, h, a.h0 + st, c0, c1, s, a.o + tok, nullptr, a.hT + st);
    });
  }
}

void scan_delta_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const Ctx x = context(p);
  const int threads = backward_threads(p);
  const std::size_t per_thread = carve(x, nullptr, true).used;
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    const Scratch s = carve(x, scratch.data() + omp_get_thread_num() * per_thread, true);
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < long(p.heads_total()); ++bh) backward_head(x, p, bh, a, s);
  }
}

}  // namespace lattn::cpu

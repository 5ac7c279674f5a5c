// RWKV-7's time mixing as a form of the modern block (docs/spec.md section 2b, `rule: dplr`), shared
// by the float32 CPU block (block/cpu.cpp) and the float64 reference (block/reference.cpp) as
// block.hpp is: one template over the number type and the same `Ops` (products, the linear
// kernel, scratch). Its tensors are in block/rwkv7_args.hpp; tests/kernels/test_layer_block.cpp
// holds the float64 gradients to central finite differences, the test table the CPU to the float64.
//
// Per token row n of x [B*T][M] (x_prev = 0 at each sequence's first token), c a channel, h its head:
//   X_i   = x + (x_prev - x) mix_i                      i = r, w, k, v, a, g (the token shift's lerps)
//   r = X_r Wr, k0 = X_k Wk, v = X_v Wv                 (Wr is the layer's wq)
//   w     = -e^-1/2 sigmoid(w0 + tanh(X_w W1) W2)       the log-decay, in (-e^-1/2, 0)
//   alpha = sigmoid(a0 + (X_a A1) A2)                    the in-context learning rate
//   gate  = sigmoid(X_g G1) G2
//   kk    = L2-normalised (k0 * k_k) per head;  k = k0 * (1 + (alpha - 1) * k_a)
//   o     = sqrt(Dh) * dplr(q = r, k, v, g = w, b = kk, a = -(kk * alpha)), vector decay, h0 = 0
//   y     = GroupNorm_h(o) * g + ln_b + (sum_j r k r_k over the head's channels) v
//   out   = (y * gate) Wo
// The dplr kernel reads o_t = Dk^-1/2 S_t^T q_t; RWKV-7 reads S_t^T r_t, hence sqrt(Dh).
// Backward: each step's adjoint in reverse order (docs/spec.md section 2b). Every sum over tokens
// (the lerp weights, w0, a0, k_k, k_a, r_k, the norm's weight and bias) runs per channel in token
// order, so that the result does not depend on the thread count.
//
// Memory: everything kept is O(B T M) (the six lerps, the projections, the kernel's head-major
// copies and their gradients); nothing is T x T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/layer/block/args.hpp"
#include "kernels/layer/block/elementwise.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn::block::rwkv7 {

inline constexpr double kGroupNormEps = 64e-5;  // RWKV-7's ln_x: 1e-5 * head_size_divisor^2 (8)
inline constexpr double kNormFloor = 1e-12;    // F.normalize's: kk / max(|kk|, 1e-12)
inline constexpr int kMaxHeadDim = 1024;       // the layer suite's largest head_dim

struct Layout {
  int M = 0, H = 0, Dh = 0, T = 0, B = 0, rw = 0, ra = 0, rg = 0;
  std::size_t R = 0, N = 0;  // token rows, elements of one [B][H][T][Dh] tensor
};

inline Layout layout(const LayerProblem& p) {
  Layout l;
  l.M = int(p.model_dim());
  l.H = p.linear.heads;
  l.Dh = p.linear.dim;
  l.T = p.linear.seq;
  l.B = p.linear.batch;
  l.rw = p.block.decay_rank;
  l.ra = p.block.iclr_rank;
  l.rg = p.block.out_gate_rank;
  l.R = p.rows();
  l.N = p.token_elems();
  return l;
}

// The buffers one call keeps from start to end, in elements, in the order run() takes them.
struct Sizes {
  // forward: the lerps, r k0 v, the low-rank hiddens, w alpha gate kk k, 1/|k0 k_k|, the kernel's
  // q k v g a b o and states, the normalised o, 1/sigma, the bonus, y, y * gate
  std::size_t X, rkv, lw, la, lg, rows5, kinv, heads6, state, oh, nrm, rs, bonus, y, u;
  // backward: du dy dgate, the kernel's dO dq dk dv dg da db and dh0, dr dk dv dkk0 dk0 dza dzw, the
  // bonus's, the hiddens', the lerps'
  std::size_t drows3, dheads7, dstate, drows7, dbonus, dlw, dla, dlg, dX;
  std::size_t forward() const {
    return X + rkv + lw + la + lg + rows5 + kinv + heads6 + 2 * state + oh + nrm + rs + bonus + y + u;
  }
  std::size_t backward() const { return drows3 + dheads7 + dstate + drows7 + dbonus + dlw + dla + dlg + dX; }
};

inline Sizes sizes(const LayerProblem& p, bool backward) {
  const Layout l = layout(p);
  const std::size_t RM = l.R * std::size_t(l.M), RH = l.R * std::size_t(l.H);
  Sizes s{};
  s.X = 6 * RM;
  s.rkv = 3 * RM;
  s.lw = l.R * l.rw;
  s.la = l.R * l.ra;
  s.lg = l.R * l.rg;
  s.rows5 = 5 * RM;
  s.kinv = s.rs = s.bonus = RH;
  s.heads6 = 6 * l.N;
  s.state = p.linear.state_elems();
  s.oh = l.N;
  s.nrm = s.y = s.u = RM;
  if (backward) {
    s.drows3 = 3 * RM;
    s.dheads7 = 7 * l.N;
    s.dstate = s.state;
    s.drows7 = 7 * RM;
    s.dbonus = RH;
    s.dlw = s.lw;
    s.dla = s.la;
    s.dlg = s.lg;
    s.dX = 6 * RM;
  }
  return s;
}

// The products one call makes, as (m, n, k) of C = op(A) op(B) (`weight`: C = A^T B over the
// tokens), for the CPU's closed-form scratch (block/cpu.cpp).
template <class F>
void for_each_product(const LayerProblem& p, bool backward, F f) {
  const Layout l = layout(p);
  const int R = int(l.R), M = l.M;
  f(false, R, M, M);  // r, k0, v, out
  for (int r : {l.rw, l.ra, l.rg}) {
    f(false, R, r, M);  // X W1
    f(false, R, M, r);  // (.) W2
  }
  if (!backward) return;
  f(true, M, M, R);   // dWo, dWr, dWk, dWv
  f(false, R, M, M);  // du, dX_r, dX_k, dX_v
  for (int r : {l.rw, l.ra, l.rg}) {
    f(true, r, M, R);   // dW2
    f(false, R, r, M);  // d hidden
    f(true, M, r, R);   // dW1
    f(false, R, M, r);  // dX
  }
}

// Forward (and with `dOut` set, the backward) of RWKV-7's time mixing. Ops: as block.hpp's.
template <class T, class Ops>
void run(const LayerProblem& p, const BlockArgs<T>& a, Ops& ops, bool backward) {
  const Layout l = layout(p);
  const Sizes s = sizes(p, backward);
  const Rwkv7Args<T>& w = a.rwkv7;
  const int M = l.M, H = l.H, Dh = l.Dh, Tn = l.T, rw = l.rw, ra = l.ra, rg = l.rg, M6 = 6 * M;
  const long R = long(l.R), RH = R * H;
  const T decay_scale = T(std::exp(-0.5)), out_scale = T(std::sqrt(double(Dh)));
  auto X = ops.buffer(s.X), rkv = ops.buffer(s.rkv), lw = ops.buffer(s.lw), la = ops.buffer(s.la), lg = ops.buffer(s.lg),
       rows5 = ops.buffer(s.rows5), kinv = ops.buffer(s.kinv), heads6 = ops.buffer(s.heads6), h0 = ops.buffer(s.state),
       hT = ops.buffer(s.state), oh = ops.buffer(s.oh), nrm = ops.buffer(s.nrm), rs = ops.buffer(s.rs),
       bonus = ops.buffer(s.bonus), y = ops.buffer(s.y), u = ops.buffer(s.u);
  auto drows3 = ops.buffer(s.drows3), dheads7 = ops.buffer(s.dheads7), dh0 = ops.buffer(s.dstate),
       drows7 = ops.buffer(s.drows7), dbonus = ops.buffer(s.dbonus), dlw = ops.buffer(s.dlw), dla = ops.buffer(s.dla),
       dlg = ops.buffer(s.dlg), dX = ops.buffer(s.dX);
  const std::size_t RM = l.R * std::size_t(M), N = l.N;
  T *r = rkv.data(), *k0 = r + RM, *v = k0 + RM;
  T *wdec = rows5.data(), *alpha = wdec + RM, *gate = alpha + RM, *kk = gate + RM, *k = kk + RM;
  T *qh = heads6.data(), *kh = qh + N, *vh = kh + N, *gh = vh + N, *ah = gh + N, *bh = ah + N;
  // Head-major index of (row, head h, channel j): the kernel's [B][H][T][Dh].
  auto head_at = [&](long row, int h) { return ((std::size_t(row / Tn) * H + h) * Tn + std::size_t(row % Tn)) * Dh; };

  // The token shift's six lerps, X [R][6][M].
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const T* xr = a.x + std::size_t(row) * M;
    const T* xp = row % Tn ? xr - M : nullptr;
    T* out = X.data() + std::size_t(row) * M6;
    for (int i = 0; i < 6; ++i)
      for (int c = 0; c < M; ++c) out[i * M + c] = xr[c] + ((xp ? xp[c] : T(0)) - xr[c]) * w.mix[i * M + c];
  }

  // The projections: r, k0, v square; w, alpha and the gate through their low ranks.
  ops.product(false, int(R), M, M, X.data() + 0 * M, M6, a.wq, M, r, M);
  ops.product(false, int(R), M, M, X.data() + 2 * M, M6, a.wk, M, k0, M);
  ops.product(false, int(R), M, M, X.data() + 3 * M, M6, a.wv, M, v, M);
  ops.product(false, int(R), rw, M, X.data() + 1 * M, M6, w.w1, rw, lw.data(), rw);
  for (std::size_t i = 0; i < s.lw; ++i) lw[i] = std::tanh(lw[i]);
  ops.product(false, int(R), M, rw, lw.data(), rw, w.w2, M, wdec, M);
  ops.product(false, int(R), ra, M, X.data() + 4 * M, M6, w.a1, ra, la.data(), ra);
  ops.product(false, int(R), M, ra, la.data(), ra, w.a2, M, alpha, M);
  ops.product(false, int(R), rg, M, X.data() + 5 * M, M6, w.g1, rg, lg.data(), rg);
  for (std::size_t i = 0; i < s.lg; ++i) lg[i] = sigmoid(lg[i]);
  ops.product(false, int(R), M, rg, lg.data(), rg, w.g2, M, gate, M);

  // Per token and head: the decay, the learning rate, kk and k, and the kernel's head-major inputs.
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < RH; ++hr) {
    const long row = hr / H;
    const int h = int(hr % H);
    const std::size_t at = std::size_t(row) * M + std::size_t(h) * Dh, hd = head_at(row, h);
    T squares = 0;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      wdec[i] = -decay_scale * sigmoid(w.w0[c] + wdec[i]);
      alpha[i] = sigmoid(w.a0[c] + alpha[i]);
      kk[i] = k0[i] * w.k_k[c];
      squares += kk[i] * kk[i];
    }
    const T inv = T(1) / std::max(std::sqrt(squares), T(kNormFloor));
    kinv[std::size_t(hr)] = inv;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      kk[i] *= inv;
      k[i] = k0[i] * (T(1) + (alpha[i] - T(1)) * w.k_a[c]);
      qh[hd + j] = r[i];
      kh[hd + j] = k[i];
      vh[hd + j] = v[i];
      gh[hd + j] = wdec[i];
      bh[hd + j] = kk[i];
      ah[hd + j] = -kk[i] * alpha[i];
    }
  }

  // The dplr kernel (rule dplr, vector decay), h0 = 0.
  const Problem& lp = p.linear;
  std::fill_n(h0.data(), s.state, T(0));
  ForwardArgs<T> fa{qh, kh, vh, h0.data(), oh.data(), hT.data(), gh};
  fa.a = ah;
  fa.b = bh;
  ops.linear_forward(lp, fa);

  // The group norm, the bonus, the gate.
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < RH; ++hr) {
    const long row = hr / H;
    const int h = int(hr % H);
    const std::size_t at = std::size_t(row) * M + std::size_t(h) * Dh, hd = head_at(row, h);
    T mean = 0, bonus_sum = 0;
    for (int j = 0; j < Dh; ++j) {
      mean += oh[hd + j];
      bonus_sum += r[at + j] * k[at + j] * w.r_k[std::size_t(h) * Dh + j];
    }
    mean = out_scale * mean / T(Dh);
    T var = 0;
    for (int j = 0; j < Dh; ++j) {
      const T d = out_scale * oh[hd + j] - mean;
      var += d * d;
    }
    const T inv_sigma = T(1) / std::sqrt(var / T(Dh) + T(kGroupNormEps));
    rs[std::size_t(hr)] = inv_sigma;
    bonus[std::size_t(hr)] = bonus_sum;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      nrm[i] = (out_scale * oh[hd + j] - mean) * inv_sigma;
      y[i] = nrm[i] * a.g[c] + w.ln_b[c] + bonus_sum * v[i];
      u[i] = y[i] * gate[i];
    }
  }
  ops.product(false, int(R), M, M, u.data(), M, a.wo, M, a.out, M);
  if (!backward) return;

  // ---- backward ----
  T *du = drows3.data(), *dy = du + RM, *dgate = dy + RM;
  T *doh = dheads7.data(), *dqh = doh + N, *dkh = dqh + N, *dvh = dkh + N, *dgh = dvh + N, *dah = dgh + N, *dbh = dah + N;
  T *dr = drows7.data(), *dk = dr + RM, *dv = dk + RM, *dkk0 = dv + RM, *dk0 = dkk0 + RM, *dza = dk0 + RM, *dzw = dza + RM;
  ops.weight_product(M, M, int(R), u.data(), M, a.dOut, M, a.dwo);
  ops.product(true, int(R), M, M, a.dOut, M, a.wo, M, du, M);

  // The gate, the bonus and the group norm's adjoints; the kernel's dO.
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < RH; ++hr) {
    const long row = hr / H;
    const int h = int(hr % H);
    const std::size_t at = std::size_t(row) * M + std::size_t(h) * Dh, hd = head_at(row, h);
    T dbonus_sum = 0, mean_dn = 0, mean_dnn = 0;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      dgate[i] = du[i] * y[i];
      dy[i] = du[i] * gate[i];
      dbonus_sum += dy[i] * v[i];
      const T dn = dy[i] * a.g[c];
      mean_dn += dn;
      mean_dnn += dn * nrm[i];
    }
    mean_dn /= T(Dh);
    mean_dnn /= T(Dh);
    const T inv_sigma = rs[std::size_t(hr)], b = bonus[std::size_t(hr)];
    dbonus[std::size_t(hr)] = dbonus_sum;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      const T dn = dy[i] * a.g[c];
      doh[hd + j] = out_scale * inv_sigma * (dn - mean_dn - nrm[i] * mean_dnn);
      dv[i] = b * dy[i];
      dr[i] = dbonus_sum * k[i] * w.r_k[c];
      dk[i] = dbonus_sum * r[i] * w.r_k[c];
    }
  }

  ops.linear_backward(lp, [&] {
    BackwardArgs<T> ba{qh, kh, vh, h0.data(), doh, h0.data(), dqh, dkh, dvh, dh0.data(), gh, dgh};
    ba.a = ah;
    ba.b = bh;
    ba.da = dah;
    ba.db = dbh;
    return ba;
  }());

  // Back through the kernel's inputs: kk's normalisation, k's learning-rate scale, alpha, w.
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < RH; ++hr) {
    const long row = hr / H;
    const int h = int(hr % H);
    const std::size_t at = std::size_t(row) * M + std::size_t(h) * Dh, hd = head_at(row, h);
    T dkk[kMaxHeadDim], dalpha[kMaxHeadDim], dot = 0;
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j;
      dr[i] += dqh[hd + j];
      dv[i] += dvh[hd + j];
      dk[i] += dkh[hd + j];                                 // dk: the adjoint of k, whole
      dkk[j] = dbh[hd + j] - alpha[i] * dah[hd + j];       // b = kk, a = -(kk alpha)
      dalpha[j] = -kk[i] * dah[hd + j];
      dot += kk[i] * dkk[j];
    }
    const T inv = kinv[std::size_t(hr)];
    const bool floored = inv >= T(1) / T(kNormFloor);  // |k0 k_k| under the floor: kk = k0 k_k / floor
    for (int j = 0; j < Dh; ++j) {
      const std::size_t i = at + j, c = std::size_t(h) * Dh + j;
      dkk0[i] = inv * (floored ? dkk[j] : dkk[j] - kk[i] * dot);
      dk0[i] = dk[i] * (T(1) + (alpha[i] - T(1)) * w.k_a[c]) + dkk0[i] * w.k_k[c];
      dalpha[j] += dk[i] * k0[i] * w.k_a[c];
      dza[i] = dalpha[j] * alpha[i] * (T(1) - alpha[i]);
      dzw[i] = dgh[hd + j] * wdec[i] * (T(1) + wdec[i] / decay_scale);  // w = -e^-1/2 s: dw/dz = w (1 - s)
    }
  }

  // The low-rank projections' and the square projections' adjoints; dX per lerp.
  ops.weight_product(ra, M, int(R), la.data(), ra, dza, M, w.da2);
  ops.product(true, int(R), ra, M, dza, M, w.a2, M, dla.data(), ra);
  ops.weight_product(M, ra, int(R), X.data() + 4 * M, M6, dla.data(), ra, w.da1);
  ops.product(true, int(R), M, ra, dla.data(), ra, w.a1, ra, dX.data() + 4 * M, M6);
  ops.weight_product(rw, M, int(R), lw.data(), rw, dzw, M, w.dw2);
  ops.product(true, int(R), rw, M, dzw, M, w.w2, M, dlw.data(), rw);
  for (std::size_t i = 0; i < s.lw; ++i) dlw[i] *= T(1) - lw[i] * lw[i];
  ops.weight_product(M, rw, int(R), X.data() + 1 * M, M6, dlw.data(), rw, w.dw1);
  ops.product(true, int(R), M, rw, dlw.data(), rw, w.w1, rw, dX.data() + 1 * M, M6);
  ops.weight_product(rg, M, int(R), lg.data(), rg, dgate, M, w.dg2);
  ops.product(true, int(R), rg, M, dgate, M, w.g2, M, dlg.data(), rg);
  for (std::size_t i = 0; i < s.lg; ++i) dlg[i] *= lg[i] * (T(1) - lg[i]);
  ops.weight_product(M, rg, int(R), X.data() + 5 * M, M6, dlg.data(), rg, w.dg1);
  ops.product(true, int(R), M, rg, dlg.data(), rg, w.g1, rg, dX.data() + 5 * M, M6);
  ops.weight_product(M, M, int(R), X.data() + 0 * M, M6, dr, M, a.dwq);
  ops.product(true, int(R), M, M, dr, M, a.wq, M, dX.data() + 0 * M, M6);
  ops.weight_product(M, M, int(R), X.data() + 2 * M, M6, dk0, M, a.dwk);
  ops.product(true, int(R), M, M, dk0, M, a.wk, M, dX.data() + 2 * M, M6);
  ops.weight_product(M, M, int(R), X.data() + 3 * M, M6, dv, M, a.dwv);
  ops.product(true, int(R), M, M, dv, M, a.wv, M, dX.data() + 3 * M, M6);

  // The per-channel parameters: blocks of channels, each summing over the rows in token order (in
  // double, whatever T is), the channels innermost.
  constexpr int kBlock = 64;
  const int blocks = (M + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kBlock, n = std::min(kBlock, M - c0);
    double dmix[6][kBlock] = {}, dw0[kBlock] = {}, da0[kBlock] = {}, dkk[kBlock] = {}, dka[kBlock] = {},
           drk[kBlock] = {}, dlnw[kBlock] = {}, dlnb[kBlock] = {};
    for (long row = 0; row < R; ++row) {
      const T* xr = a.x + std::size_t(row) * M + c0;
      const T* xp = row % Tn ? xr - M : nullptr;
      const T* dXr = dX.data() + std::size_t(row) * M6 + c0;
      const std::size_t at = std::size_t(row) * M + c0;
      for (int cc = 0; cc < n; ++cc) {
        const std::size_t i = at + cc;
        const T shift = (xp ? xp[cc] : T(0)) - xr[cc];
        for (int m = 0; m < 6; ++m) dmix[m][cc] += double(dXr[m * M + cc] * shift);
        dw0[cc] += double(dzw[i]);
        da0[cc] += double(dza[i]);
        dkk[cc] += double(dkk0[i] * k0[i]);
        dka[cc] += double(dk[i] * k0[i] * (alpha[i] - T(1)));
        drk[cc] += double(dbonus[std::size_t(row) * H + (c0 + cc) / Dh] * r[i] * k[i]);
        dlnw[cc] += double(dy[i] * nrm[i]);
        dlnb[cc] += double(dy[i]);
      }
    }
    for (int cc = 0; cc < n; ++cc) {
      const int c = c0 + cc;
      for (int m = 0; m < 6; ++m) w.dmix[m * M + c] = T(dmix[m][cc]);
      w.dw0[c] = T(dw0[cc]);
      w.da0[c] = T(da0[cc]);
      w.dk_k[c] = T(dkk[cc]);
      w.dk_a[c] = T(dka[cc]);
      w.dr_k[c] = T(drk[cc]);
      a.dg[c] = T(dlnw[cc]);
      w.dln_b[c] = T(dlnb[cc]);
    }
  }

  // dx: each row's lerps take (1 - mix) of it, and the next row's take mix of it.
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const T* d = dX.data() + std::size_t(row) * M6;
    const T* next = (row + 1) % Tn ? d + M6 : nullptr;
    T* dx = a.dx + std::size_t(row) * M;
    for (int c = 0; c < M; ++c) {
      T sum = 0;
      for (int m = 0; m < 6; ++m) {
        const T mix = w.mix[m * M + c];
        sum += d[m * M + c] * (T(1) - mix) + (next ? next[m * M + c] * mix : T(0));
      }
      dx[c] = sum;
    }
  }
}

}  // namespace lattn::block::rwkv7

// The modern layer block (docs/spec.md section 2b: Gated DeltaNet, KDA, Mamba2; its tensors in
// block/args.hpp), shared by the float32 CPU kernel (block/cpu.cpp) and the float64 reference
// (block/reference.cpp): one template over the
// number type and an `Ops` that supplies the products, the linear-attention kernel, the sliding
// window and scratch. The CPU passes sgemm and the kernel suite's CPU kernels, the reference dgemm
// and the float64 scan; tests/kernels/test_layer_block.cpp holds the float64 gradients to central finite
// differences, and the test table holds the CPU to the float64 result.
//
// Per batch row (token) of x [B*T][M], with P = x W_in, W_in = [Wq Wk Wv | Wz | Wa or Wd | Wb]:
//   u      = silu(conv_w(P_qkv)) with a short convolution, else P_qkv          (q, k, v; [B][H][T][Dh])
//   q, k   = q / sqrt(|q|^2 + eps), k likewise                                 (delta rule)
//   gates  = inputs g, beta (the kernel suite's), or projected:
//            scalar: g = -exp(A_log_h) softplus(P_a + dt_bias_h)            (GDN, Mamba2: [B][H][T])
//            vector: g = -exp(A_log_h) softplus(P_d Wu + dt_bias)           (KDA: [B][H][T][Dh])
//            beta   = sigmoid(P_b)                                          (delta rule)
//            Mamba2 (additive rule): k <- dt k with dt = softplus(P_a + dt_bias), o gains D_h v
//   o      = linear attention (rule, decay) on q, k, v, h0 = 0
//   y      = sig(beta_h) RMSNorm(o) g + (1 - sig(beta_h)) Swa   (`output_gate: gate`, `attention: swa`)
//          = RMSNorm(o) g silu(P_z)                             (`output_gate: norm`, `attention: none`)
//   out    = y Wo
// Backward: each step's adjoint in reverse order (the derivations are in docs/kernels.md). Every
// reduction over tokens (dg, dbeta, dA_log, ddt_bias, dD, the conv filters) runs per head or per
// channel in token order, so the result does not depend on the thread count.
//
// Memory: everything kept is O(B T M) (P, the conv's output, q, k, v, o, y and their gradients);
// the convolution reads its w - 1 earlier rows of P in place, and nothing is T x T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/layer/block/args.hpp"
#include "kernels/layer/block/elementwise.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {

namespace block {

inline constexpr double kL2Eps = 1e-6;     // q / sqrt(|q|^2 + eps), as the delta-rule models normalise
inline constexpr int kMaxHeadDim = 1024;  // the layer suite's largest head_dim (hybrid/op.cpp)
inline constexpr int kMaxConv = 64;       // the largest short_conv (block/op.cpp)

// Where each projection's columns sit in P = x W_in.
struct Layout {
  int M = 0, H = 0, Dh = 0, T = 0, B = 0, w = 0, r = 0;
  int z = -1, a = -1, b = -1, cols = 0;  // column offsets of Wz, Wa (or Wd), Wb; -1: absent
  bool conv = false, delta = false, vector = false, projected = false, mamba = false, norm = false, window = true;
  std::size_t R = 0, N = 0;  // token rows, elements of one [B][H][T][Dh] tensor
};

inline Layout layout(const LayerProblem& p) {
  Layout l;
  l.M = int(p.model_dim());
  l.H = p.linear.heads;
  l.Dh = p.linear.dim;
  l.T = p.linear.seq;
  l.B = p.linear.batch;
  l.w = p.block.short_conv;
  l.conv = l.w > 0;
  l.delta = p.linear.delta();
  l.vector = p.linear.decay == Decay::vector;
  l.projected = p.block.projected_gates;
  l.mamba = l.projected && !l.delta;
  l.norm = p.block.norm_gate;
  l.window = p.block.window;
  l.r = l.projected && l.vector ? p.block.gate_rank : 0;
  l.R = p.rows();
  l.N = p.token_elems();
  int cols = 3 * l.M;
  if (l.norm) l.z = cols, cols += l.M;
  if (l.projected) l.a = cols, cols += l.vector ? l.r : l.H;
  if (l.projected && l.delta) l.b = cols, cols += l.H;
  l.cols = cols;
  return l;
}

// The buffers one call keeps from start to end, in elements (every one O(B T M) or a weight).
struct Sizes {
  std::size_t win, convT, P, C, q, k, v, ks, qinv, kinv, gpre, glin, blin, state, o, swa, lse, rinv, y;
  std::size_t dy, dO, dswa, dq, dk, dv, dglin, dblin, dstate, dP, dC, dgpre, dW;
  std::size_t forward() const {
    return win + convT + P + C + q + k + v + ks + qinv + kinv + gpre + glin + blin + 2 * state + o + swa + lse + rinv +
           y;
  }
  std::size_t backward() const { return dy + dO + dswa + dq + dk + dv + dglin + dblin + dstate + dP + dC + dgpre + dW; }
};

inline Sizes sizes(const LayerProblem& p, bool backward) {
  const Layout l = layout(p);
  const std::size_t RH = l.R * std::size_t(l.H), M = std::size_t(l.M), gates = p.linear.gate_elems();
  Sizes s{};
  s.win = M * l.cols;
  s.convT = l.conv ? std::size_t(l.w) * 3 * M : 0;
  s.P = l.R * l.cols;
  s.C = l.conv ? l.R * 3 * M : 0;
  s.q = s.k = s.v = s.o = s.y = l.N;
  s.ks = l.mamba ? l.N : 0;
  s.qinv = s.kinv = l.delta ? RH : 0;
  s.gpre = l.projected && l.vector ? l.R * M : 0;
  s.glin = l.projected ? gates : 0;
  s.blin = l.projected && l.delta ? RH : 0;
  s.state = p.linear.state_elems();
  s.swa = l.window ? l.N : 0;
  s.lse = l.window ? RH : 0;
  s.rinv = RH;
  if (backward) {
    s.dy = s.dO = s.dq = s.dk = s.dv = l.N;
    s.dswa = l.window ? l.N : 0;
    s.dglin = gates;
    s.dblin = l.delta ? RH : 0;
    s.dstate = s.state;
    s.dP = l.R * l.cols;
    s.dC = s.C;
    s.dgpre = s.gpre;
    s.dW = M * l.cols;
  }
  return s;
}

// Forward (and with `dOut` set, the backward) of the block. Ops: see block/cpu.cpp.
template <class T, class Ops>
void run(const LayerProblem& p, const BlockArgs<T>& a, Ops& ops, bool backward) {
  const Layout l = layout(p);
  const Sizes s = sizes(p, backward);
  const int M = l.M, H = l.H, Dh = l.Dh, Tn = l.T, cols = l.cols, w = l.w;
  const long R = long(l.R);
  const Problem& lp = p.linear;
  auto win = ops.buffer(s.win), convT = ops.buffer(s.convT), P = ops.buffer(s.P), C = ops.buffer(s.C), q = ops.buffer(s.q), k = ops.buffer(s.k),
       v = ops.buffer(s.v), ks = ops.buffer(s.ks), qinv = ops.buffer(s.qinv), kinv = ops.buffer(s.kinv),
       gpre = ops.buffer(s.gpre), glin_own = ops.buffer(s.glin), blin_own = ops.buffer(s.blin),
       h0 = ops.buffer(s.state), hT = ops.buffer(s.state), o = ops.buffer(s.o), swa = ops.buffer(s.swa),
       lse = ops.buffer(s.lse), rinv = ops.buffer(s.rinv), y = ops.buffer(s.y);
  auto dy = ops.buffer(s.dy), dO = ops.buffer(s.dO), dswa = ops.buffer(s.dswa), dq = ops.buffer(s.dq),
       dk = ops.buffer(s.dk), dv = ops.buffer(s.dv), dglin = ops.buffer(s.dglin), dblin = ops.buffer(s.dblin),
       dh0 = ops.buffer(s.dstate), dP = ops.buffer(s.dP), dC = ops.buffer(s.dC), dgpre = ops.buffer(s.dgpre),
       dW = ops.buffer(s.dW);
  auto at = [&](long bh, int t) { return (std::size_t(bh) * Tn + t); };               // head row
  auto row_of = [&](long bh, int t) { return std::size_t(bh / H) * Tn + t; };         // token row
  const T* glin = l.projected ? glin_own.data() : a.lin_g;
  const T* blin = l.projected ? blin_own.data() : a.lin_beta;
  T* const qkv[3] = {q.data(), k.data(), v.data()};

  // W_in and P = x W_in.
  const T* const parts[6] = {a.wq, a.wk, a.wv, a.wz, l.vector ? a.wd : a.wa, a.wb};
  const int widths[6] = {M, M, M, l.norm ? M : 0, l.projected ? (l.vector ? l.r : H) : 0, l.b >= 0 ? H : 0};
  for (int i = 0; i < M; ++i)
    for (int part = 0, col = 0; part < 6; col += widths[part], ++part)
      if (widths[part]) std::copy_n(parts[part] + std::size_t(i) * widths[part], widths[part], win.data() + std::size_t(i) * cols + col);
  ops.product(false, int(R), cols, M, a.x, M, win.data(), cols, P.data(), cols);

  // The short convolution, silu, and the per-head layout; the conv reads its w - 1 earlier rows of P.
  // The filters transposed to [tap][channel], so that the loops over channels read them contiguously.
  for (int c = 0; c < 3 * M; ++c)
    for (int i = 0; i < w; ++i) convT[std::size_t(i) * 3 * M + c] = a.conv[std::size_t(c) * w + i];
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const int t = int(row % Tn);
    const long b = row / Tn;
    for (int which = 0; which < 3; ++which)
      for (int h = 0; h < H; ++h) {  // channels c0 .. c0 + Dh - 1 are head h's of q, k or v
        const int c0 = which * M + h * Dh;
        const T* p = P.data() + std::size_t(row) * cols + c0;
        T* __restrict u = qkv[which] + at(b * H + h, t) * Dh;
        if (!l.conv) {
          std::copy_n(p, Dh, u);
          continue;
        }
        T* __restrict conv_out = C.data() + std::size_t(row) * 3 * M + c0;
        std::fill_n(conv_out, Dh, T(0));
        for (int i = std::max(0, w - 1 - t); i < w; ++i) {  // taps in order: each sum as one loop over i would
          const T* __restrict tap = convT.data() + std::size_t(i) * 3 * M + c0;
          const T* __restrict pi = p + std::ptrdiff_t(i - (w - 1)) * cols;
          for (int j = 0; j < Dh; ++j) conv_out[j] += tap[j] * pi[j];
        }
        for (int j = 0; j < Dh; ++j) u[j] = silu(conv_out[j]);
      }
  }

  // The delta rule's L2-normalised q and k; the gates.
  const long heads_rows = long(lp.heads_total()) * Tn;
  if (l.delta) {
#pragma omp parallel for schedule(static)
    for (long hr = 0; hr < heads_rows; ++hr)
      for (int which = 0; which < 2; ++which) {
        T* x = qkv[which] + std::size_t(hr) * Dh;
        T squares = 0;
#pragma omp simd reduction(+ : squares)
        for (int j = 0; j < Dh; ++j) squares += x[j] * x[j];
        const T inv = T(1) / std::sqrt(squares + T(kL2Eps));
        (which ? kinv : qinv)[std::size_t(hr)] = inv;
        for (int j = 0; j < Dh; ++j) x[j] *= inv;
      }
  }
  if (l.projected && l.vector)  // the low-rank gate: (x Wd) Wu, the first factor already in P
    ops.product(false, int(R), M, l.r, P.data() + l.a, cols, a.wu, M, gpre.data(), M);
  if (l.projected) {
#pragma omp parallel for schedule(static)
    for (long hr = 0; hr < heads_rows; ++hr) {
      const long bh = hr / Tn;
      const int t = int(hr % Tn), h = int(bh % H);
      const std::size_t row = row_of(bh, t);
      const T scale = std::exp(a.a_log[h]);
      if (l.vector) {
        for (int j = 0; j < Dh; ++j)
          glin_own[std::size_t(hr) * Dh + j] =
              -scale * softplus(gpre[row * M + std::size_t(h) * Dh + j] + a.dt_bias[h * Dh + j]);
      } else {
        const T dt = softplus(P[row * cols + l.a + h] + a.dt_bias[h]);
        glin_own[std::size_t(hr)] = -scale * dt;
        if (l.mamba)
          for (int j = 0; j < Dh; ++j) ks[std::size_t(hr) * Dh + j] = dt * k[std::size_t(hr) * Dh + j];
      }
      if (l.delta) blin_own[std::size_t(hr)] = sigmoid(P[row * cols + l.b + h]);
    }
  }

  // The linear branch (and Mamba2's skip), the window.
  const T* k_lin = l.mamba ? ks.data() : k.data();
  std::fill_n(h0.data(), s.state, T(0));
  ops.linear_forward(lp, ForwardArgs<T>{q.data(), k_lin, v.data(), h0.data(), o.data(), hT.data(),
                                        gated(lp.decay) ? glin : nullptr, l.delta ? blin : nullptr});
  if (l.mamba) {
#pragma omp parallel for schedule(static)
    for (long hr = 0; hr < heads_rows; ++hr) {
      const T d = a.d_skip[int((hr / Tn) % H)];
      for (int j = 0; j < Dh; ++j) o[std::size_t(hr) * Dh + j] += d * v[std::size_t(hr) * Dh + j];
    }
  }
  if (l.window) ops.window_forward(lp, p.window, q.data(), k.data(), v.data(), swa.data(), lse.data());

  // The output gate: y into rows, then out = y Wo.
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < heads_rows; ++hr) {
    const long bh = hr / Tn;
    const int t = int(hr % Tn), h = int(bh % H);
    const T* ov = o.data() + std::size_t(hr) * Dh;
    T squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int j = 0; j < Dh; ++j) squares += ov[j] * ov[j];
    const T r = T(1) / std::sqrt(squares / T(Dh) + T(kRmsNormEps));
    rinv[std::size_t(hr)] = r;
    const std::size_t row = row_of(bh, t);
    T* __restrict yr = y.data() + row * M + std::size_t(h) * Dh;
    const T* gh = a.g + std::size_t(h) * Dh;
    if (l.norm) {
      const T* z = P.data() + row * cols + l.z + std::size_t(h) * Dh;
      for (int j = 0; j < Dh; ++j) yr[j] = r * gh[j] * ov[j] * silu(z[j]);
    } else {
      const T sig = sigmoid(a.beta[h]);
      const T* sw = swa.data() + std::size_t(hr) * Dh;
      for (int j = 0; j < Dh; ++j) yr[j] = sig * r * gh[j] * ov[j] + (l.window ? (T(1) - sig) * sw[j] : T(0));
    }
  }
  ops.product(false, int(R), M, M, y.data(), M, a.wo, M, a.out, M);
  if (!backward) return;

  // ---- backward ----
  ops.weight_product(M, M, int(R), y.data(), M, a.dOut, M, a.dwo);
  ops.product(true, int(R), M, M, a.dOut, M, a.wo, M, dy.data(), M);

  // The output gate's adjoint, per head (its sums over tokens in token order).
#pragma omp parallel for schedule(static)
  for (int h = 0; h < H; ++h) {
    const T* gh = a.g + std::size_t(h) * Dh;
    const T sig = l.norm ? T(0) : sigmoid(a.beta[h]);
    double dbeta = 0, dd = 0, dg[kMaxHeadDim] = {};  // long sums in double, whatever T is
    for (long b = 0; b < l.B; ++b)
      for (int t = 0; t < Tn; ++t) {
        const long bh = b * H + h;
        const std::size_t hr = at(bh, t), row = row_of(bh, t);
        const T* ov = o.data() + hr * Dh;
        const T* d = dy.data() + row * M + std::size_t(h) * Dh;
        T* dov = dO.data() + hr * Dh;
        const T r = rinv[hr];
        T ul = 0;
        if (l.norm) {
          const T* z = P.data() + row * cols + l.z + std::size_t(h) * Dh;
          T* dz = dP.data() + row * cols + l.z + std::size_t(h) * Dh;
#pragma omp simd reduction(+ : ul)
          for (int j = 0; j < Dh; ++j) {
            const T s = sigmoid(z[j]), sz = z[j] * s;  // silu(z) and its derivative from one sigmoid
            dg[j] += double(d[j] * sz * ov[j] * r);
            dz[j] = d[j] * gh[j] * ov[j] * r * (s * (T(1) + z[j] * (T(1) - s)));
            dov[j] = gh[j] * sz * d[j];  // u, finished below
            ul += dov[j] * ov[j];
          }
        } else {
          const T* sw = swa.data() + hr * Dh;
#pragma omp simd reduction(+ : dbeta, ul)
          for (int j = 0; j < Dh; ++j) {
            dbeta += double(d[j] * (r * gh[j] * ov[j] - (l.window ? sw[j] : T(0))));
            dg[j] += double(sig * d[j] * ov[j] * r);
            dov[j] = sig * gh[j] * d[j];
            ul += dov[j] * ov[j];
            if (l.window) dswa[hr * Dh + j] = (T(1) - sig) * d[j];
          }
        }
        const T c = r * r * r / T(Dh) * ul;
#pragma omp simd
        for (int j = 0; j < Dh; ++j) dov[j] = r * dov[j] - c * ov[j];
        if (l.mamba)
#pragma omp simd reduction(+ : dd)
          for (int j = 0; j < Dh; ++j) dd += double(dov[j] * v[hr * Dh + j]);
      }
    for (int j = 0; j < Dh; ++j) a.dg[std::size_t(h) * Dh + j] = T(dg[j]);
    if (!l.norm) a.dbeta[h] = T(dbeta) * sig * (T(1) - sig);
    if (l.mamba) a.dd_skip[h] = T(dd);
  }

  // The linear branch's backward (dhT = 0: h0 serves), Mamba2's skip and dt scaling of k.
  ops.linear_backward(lp, BackwardArgs<T>{q.data(), k_lin, v.data(), h0.data(), dO.data(), h0.data(), dq.data(),
                                          dk.data(), dv.data(), dh0.data(), gated(lp.decay) ? glin : nullptr,
                                          gated(lp.decay) ? dglin.data() : nullptr, l.delta ? blin : nullptr,
                                          l.delta ? dblin.data() : nullptr});

  // The gates' adjoints, per head: dg -> A_log, dt_bias and P's gate columns; dbeta -> P_b.
  if (l.projected) {
#pragma omp parallel for schedule(static)
    for (int h = 0; h < H; ++h) {
      const T scale = std::exp(a.a_log[h]);
      double dalog = 0, dbias[kMaxHeadDim] = {};
      const int width = l.vector ? Dh : 1;
      for (long b = 0; b < l.B; ++b)
        for (int t = 0; t < Tn; ++t) {
          const long bh = b * H + h;
          const std::size_t hr = at(bh, t), row = row_of(bh, t);
          if (l.vector) {
#pragma omp simd reduction(+ : dalog)
            for (int j = 0; j < Dh; ++j) {
              const std::size_t gi = hr * Dh + j, ci = row * M + std::size_t(h) * Dh + j;
              dalog += double(dglin[gi] * glin[gi]);
              const T dpre = -dglin[gi] * scale * sigmoid(gpre[ci] + a.dt_bias[h * Dh + j]);
              dgpre[ci] = dpre;
              dbias[j] += double(dpre);
            }
          } else {
            const T pre = P[row * cols + l.a + h] + a.dt_bias[h];
            T ddt = -dglin[hr] * scale;
            dalog += double(dglin[hr] * glin[hr]);
            if (l.mamba) {  // k_lin = dt k: dk_lin feeds dt and k
              const T dt = softplus(pre);
              T* dkv = dk.data() + hr * Dh;
              const T* kv = k.data() + hr * Dh;
              for (int j = 0; j < Dh; ++j) {
                ddt += dkv[j] * kv[j];
                dkv[j] *= dt;
              }
            }
            const T dpre = ddt * sigmoid(pre);
            dP[row * cols + l.a + h] = dpre;
            dbias[0] += double(dpre);
          }
          if (l.delta) {
            const T beta = blin[hr];
            dP[row * cols + l.b + h] = dblin[hr] * beta * (T(1) - beta);
          }
        }
      a.da_log[h] = T(dalog);
      for (int j = 0; j < width; ++j) a.ddt_bias[h * width + j] = T(dbias[j]);
    }
    if (l.vector) {
      ops.product(true, int(R), l.r, M, dgpre.data(), M, a.wu, M, dP.data() + l.a, cols);
      ops.weight_product(l.r, M, int(R), P.data() + l.a, cols, dgpre.data(), M, a.dwu);
    }
  } else {
    if (gated(lp.decay)) std::copy_n(dglin.data(), s.dglin, a.dlin_g);
    if (l.delta) std::copy_n(dblin.data(), s.dblin, a.dlin_beta);
  }
  if (l.window)
    ops.window_backward(lp, p.window, q.data(), k.data(), v.data(), swa.data(), lse.data(), dswa.data(), dq.data(),
                        dk.data(), dv.data());
  if (l.mamba)
#pragma omp parallel for schedule(static)
    for (long hr = 0; hr < heads_rows; ++hr) {
      const T d = a.d_skip[int((hr / Tn) % H)];
      for (int j = 0; j < Dh; ++j) dv[std::size_t(hr) * Dh + j] += d * dO[std::size_t(hr) * Dh + j];
    }

  // The L2 normalisation's adjoint: dx = inv (dn - n (n . dn)).
  if (l.delta) {
    T* const dqk[2] = {dq.data(), dk.data()};
#pragma omp parallel for schedule(static)
    for (long hr = 0; hr < heads_rows; ++hr)
      for (int which = 0; which < 2; ++which) {
        const T* n = qkv[which] + std::size_t(hr) * Dh;
        T* dn = dqk[which] + std::size_t(hr) * Dh;
        T dot = 0;
        for (int j = 0; j < Dh; ++j) dot += n[j] * dn[j];
        const T inv = (which ? kinv : qinv)[std::size_t(hr)];
        for (int j = 0; j < Dh; ++j) dn[j] = inv * (dn[j] - n[j] * dot);
      }
  }

  // Back to rows through silu and the convolution: dC, then dP_qkv and the filters' gradients.
  const T* const dqkv[3] = {dq.data(), dk.data(), dv.data()};
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const int t = int(row % Tn);
    const long b = row / Tn;
    for (int which = 0; which < 3; ++which)
      for (int h = 0; h < H; ++h) {
        const int c0 = which * M + h * Dh;
        const T* du = dqkv[which] + at(b * H + h, t) * Dh;
        if (!l.conv) {
          std::copy_n(du, Dh, dP.data() + std::size_t(row) * cols + c0);
          continue;
        }
        const T* __restrict conv_out = C.data() + std::size_t(row) * 3 * M + c0;
        T* __restrict dconv_out = dC.data() + std::size_t(row) * 3 * M + c0;
        for (int j = 0; j < Dh; ++j) dconv_out[j] = du[j] * silu_grad(conv_out[j]);
      }
  }
  if (l.conv) {
#pragma omp parallel for schedule(static)
    for (long row = 0; row < R; ++row) {
      const int t = int(row % Tn);
      T* __restrict sum = dP.data() + std::size_t(row) * cols;
      std::fill_n(sum, 3 * M, T(0));
      // row feeds output rows row + (w - 1) - i of its own sequence (those before its end), taps in order
      for (int i = std::max(0, t + w - Tn); i < w; ++i) {
        const T* __restrict tap = convT.data() + std::size_t(i) * 3 * M;
        const T* __restrict d = dC.data() + std::size_t(row + (w - 1) - i) * 3 * M;
        for (int c = 0; c < 3 * M; ++c) sum[c] += tap[c] * d[c];
      }
    }
    // The filters' gradients: blocks of channels, each summing over the rows in order (in double,
    // on the stack) with the channels innermost, so that every row is read contiguously.
    constexpr int kChannelBlock = 64;
    const int blocks = (3 * M + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; ++blk) {
      const int c0 = blk * kChannelBlock, n = std::min(kChannelBlock, 3 * M - c0);
      double sums[kMaxConv][kChannelBlock] = {};
      for (long row = 0; row < R; ++row) {
        const int t = int(row % Tn);
        const T* d = dC.data() + std::size_t(row) * 3 * M + c0;
        for (int i = std::max(0, w - 1 - t); i < w; ++i) {
          const T* p = P.data() + std::size_t(row - (w - 1) + i) * cols + c0;
          for (int cc = 0; cc < n; ++cc) sums[i][cc] += double(d[cc] * p[cc]);
        }
      }
      for (int cc = 0; cc < n; ++cc)
        for (int i = 0; i < w; ++i) a.dconv[std::size_t(c0 + cc) * w + i] = T(sums[i][cc]);
    }
  }

  // The input projections: dW_in = x^T dP (unpacked), dx = dP W_in^T.
  ops.weight_product(M, cols, int(R), a.x, M, dP.data(), cols, dW.data());
  T* const dparts[6] = {a.dwq, a.dwk, a.dwv, a.dwz, l.vector ? a.dwd : a.dwa, a.dwb};
  for (int i = 0; i < M; ++i)
    for (int part = 0, col = 0; part < 6; col += widths[part], ++part)
      if (widths[part]) std::copy_n(dW.data() + std::size_t(i) * cols + col, widths[part], dparts[part] + std::size_t(i) * widths[part]);
  ops.product(true, int(R), M, cols, dP.data(), cols, win.data(), cols, a.dx, M);
}

}  // namespace block
}  // namespace lattn


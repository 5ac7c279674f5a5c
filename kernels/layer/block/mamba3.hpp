// The Mamba-3 form of the modern layer block (docs/spec.md section 2b, "Mamba-3"; the layer suite's
// `rule: trapezoidal`), SISO: one template over the number type shared, as block.hpp is, by the
// float32 CPU block (block/cpu.cpp: sgemm and the kernel suite's CPU trapezoidal rows) and the
// float64 reference (block/reference.cpp: dgemm and the float64 trapezoidal scan).
// tests/kernels/test_layer_block.cpp holds the float64 gradients to central finite differences and
// the float64 forward to the authors' recurrent (step) form written out token by token; the test
// table holds the CPU to the float64 result.
//
// Per token row of x [B*T][M] (M = H Dh, N = Dh the state's rows, G groups of B and C, nA angles),
// P = x W_in with W_in = [Wz (M) | Wv (M) | Wk (G N) | Wq (G N) | Wa (H) | Wda (H) | Wtrap (H) | Wangle (nA)],
// the authors' in_proj order z, x, B, C, dd_dt, dd_A, trap, angles:
//   dt     = softplus(P_a + dt_bias_h),   A = -max(heavy_tail(P_da), A_floor),   g = A dt    (per head)
//   B~, C~ = RMSNorm(P_k) w_b, RMSNorm(P_q) w_c per group (eps 1e-5)
//   theta  = cumsum over the sequence's tokens of pi tanh(P_angle) dt_h   (per head, reduced mod 2 pi)
//   k, q   = rotate(B~_group(h) + b_bias_h, theta), rotate(C~_group(h) + c_bias_h, theta): channel pairs
//            (2i, 2i + 1), i < nA, by theta_i; the rest as they are
//   o      = the trapezoidal kernel (docs/spec.md section 1e) on q, k, v = P_v, g, dt, trap = P_trap, h0 = 0
//   y      = (o + D_h v) silu(P_z)
//   out    = y Wo
// Backward: each step's adjoint in reverse order. Every sum over tokens (dD, the biases, the norm
// weights, dt_bias) runs per head or per channel in token order, and every sum over heads (a
// group's B and C, an angle's shared logit) per token in head order, so that none of the block's own
// sums depends on the thread count (the products and the kernel round as their own code does).
//
// Memory: everything kept is O(B T M) (P, q, k, v, o, y, theta and their gradients); nothing is T x T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/layer/block/args.hpp"
#include "kernels/layer/block/elementwise.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {
namespace block::mamba3 {

inline constexpr double kNormEps = 1e-5;   // B_norm and C_norm's eps (the authors' RMSNormGated(d_state, eps=1e-5))
inline constexpr double kAFloor = 1e-4;    // the authors' A_floor: A = -max(heavy_tail(dd_A), A_floor)
inline constexpr int kMaxDim = 1024;       // the layer suite's largest head_dim (hybrid/op.cpp)
inline constexpr double kPi = 3.14159265358979323846;

// The rotated channel pairs of a state of n rows at rope_fraction f, as the authors count them:
// int(n f) channels, one fewer if odd, in pairs.
inline int rope_angles(int n, double fraction) {
  int split = int(n * fraction);
  if (split % 2) --split;
  return split / 2;
}

// heavy_tail(u) = 1 + u (u >= 0), 1 / (1 - u) (u < 0): positive, continuous, with a continuous
// derivative 1 (u >= 0), 1 / (1 - u)^2 (u < 0).
template <class T>
T heavy_tail(T u) {
  return u >= T(0) ? T(1) + u : T(1) / (T(1) - u);
}
template <class T>
T heavy_tail_grad(T u) {
  return u >= T(0) ? T(1) : T(1) / ((T(1) - u) * (T(1) - u));
}

// Where each projection's columns sit in P = x W_in.
struct Layout {
  int M = 0, H = 0, Dh = 0, T = 0, B = 0, G = 1, nA = 0;
  int z = 0, x = 0, k = 0, q = 0, dt = 0, da = 0, trap = 0, angle = 0, cols = 0;
  std::size_t R = 0, N = 0, heads_rows = 0;  // token rows, elements of one [B][H][T][Dh] tensor, B H T
};

inline Layout layout(const LayerProblem& p) {
  Layout l;
  l.M = int(p.model_dim());
  l.H = p.linear.heads;
  l.Dh = p.linear.dim;
  l.T = p.linear.seq;
  l.B = p.linear.batch;
  l.G = p.block.bc_groups;
  l.nA = rope_angles(l.Dh, p.block.rope_fraction);
  l.R = p.rows();
  l.N = p.token_elems();
  l.heads_rows = l.R * std::size_t(l.H);
  l.z = 0;
  l.x = l.M;
  l.k = 2 * l.M;
  l.q = l.k + l.G * l.Dh;
  l.dt = l.q + l.G * l.Dh;
  l.da = l.dt + l.H;
  l.trap = l.da + l.H;
  l.angle = l.trap + l.H;
  l.cols = l.angle + l.nA;
  return l;
}

// The buffers one call keeps from start to end, in elements.
struct Sizes {
  std::size_t win, P, rinv, dt, g, trap, phi, theta, q, k, v, state, o, y;
  std::size_t dy, dO, dq, dk, dv, dg, ddt, dtrap, dstate, dtheta, dbc, dP, dW;
  std::size_t forward() const { return win + P + rinv + dt + g + trap + phi + theta + q + k + v + 2 * state + o + y; }
  std::size_t backward() const { return dy + dO + dq + dk + dv + dg + ddt + dtrap + dstate + dtheta + dbc + dP + dW; }
};

inline Sizes sizes(const LayerProblem& p, bool backward) {
  const Layout l = layout(p);
  const std::size_t M = std::size_t(l.M), BHT = l.heads_rows, GN = std::size_t(l.G) * l.Dh;
  Sizes s{};
  s.win = M * l.cols;
  s.P = l.R * l.cols;
  s.rinv = 2 * l.R * l.G;
  s.dt = s.g = s.trap = BHT;
  s.phi = l.R * l.nA;
  s.theta = BHT * l.nA;
  s.q = s.k = s.v = s.o = s.y = l.N;
  s.state = p.linear.state_elems();
  if (backward) {
    s.dy = s.dO = s.dq = s.dk = s.dv = l.N;
    s.dg = s.ddt = s.dtrap = BHT;
    s.dstate = s.state;
    s.dtheta = s.theta;
    s.dbc = 2 * l.R * GN;
    s.dP = l.R * l.cols;
    s.dW = M * l.cols;
  }
  return s;
}

// Rotates the pairs (x[2i], x[2i + 1]) by theta[i], i < n.
template <class T>
void rotate(T* __restrict x, const T* __restrict theta, int n) {
  for (int i = 0; i < n; ++i) {
    const std::size_t e = 2 * std::size_t(i);
    const T c = std::cos(theta[i]), s = std::sin(theta[i]), a = x[e], b = x[e + 1];
    x[e] = a * c - b * s;
    x[e + 1] = a * s + b * c;
  }
}

// Forward (and with `dOut` set, the backward) of the Mamba-3 block. Ops: as block.hpp's (block/cpu.cpp).
template <class T, class Ops>
void run(const LayerProblem& p, const BlockArgs<T>& a, Ops& ops, bool backward) {
  const Layout l = layout(p);
  const Sizes s = sizes(p, backward);
  const int M = l.M, H = l.H, Dh = l.Dh, Tn = l.T, cols = l.cols, G = l.G, nA = l.nA, per_group = H / G;
  const long R = long(l.R), heads_rows = long(l.heads_rows), BH = long(l.B) * H;
  const Problem& lp = p.linear;
  const T two_pi = T(2 * kPi), two_pi_low = T(2 * kPi - double(two_pi)), pi = T(kPi);
  auto win = ops.buffer(s.win), P = ops.buffer(s.P), rinv = ops.buffer(s.rinv), dt = ops.buffer(s.dt),
       g = ops.buffer(s.g), trap = ops.buffer(s.trap), phi = ops.buffer(s.phi), theta = ops.buffer(s.theta),
       q = ops.buffer(s.q), k = ops.buffer(s.k), v = ops.buffer(s.v), h0 = ops.buffer(s.state),
       hT = ops.buffer(s.state), o = ops.buffer(s.o), y = ops.buffer(s.y);
  auto dy = ops.buffer(s.dy), dO = ops.buffer(s.dO), dq = ops.buffer(s.dq), dk = ops.buffer(s.dk),
       dv = ops.buffer(s.dv), dg = ops.buffer(s.dg), ddt = ops.buffer(s.ddt), dtrap = ops.buffer(s.dtrap),
       dh0 = ops.buffer(s.dstate), dtheta = ops.buffer(s.dtheta), dbc = ops.buffer(s.dbc), dP = ops.buffer(s.dP),
       dW = ops.buffer(s.dW);
  const int GN = G * Dh;
  // The rows of k (which 0: B) and q (which 1: C) in P, their norm weights, biases and gradients.
  const int bc_col[2] = {l.k, l.q};
  const T* const norm_w[2] = {a.b_norm, a.c_norm};
  const T* const bias[2] = {a.b_bias, a.c_bias};
  T* const kq[2] = {k.data(), q.data()};
  T* const dkq[2] = {dk.data(), dq.data()};

  // W_in and P = x W_in.
  const T* const parts[8] = {a.wz, a.wv, a.wk, a.wq, a.wa, a.wda, a.wtrap, a.wangle};
  const int widths[8] = {M, M, GN, GN, H, H, H, nA};
  for (int i = 0; i < M; ++i)
    for (int part = 0, col = 0; part < 8; col += widths[part], ++part)
      if (widths[part])
        std::copy_n(parts[part] + std::size_t(i) * widths[part], widths[part], win.data() + std::size_t(i) * cols + col);
  ops.product(false, int(R), cols, M, a.x, M, win.data(), cols, P.data(), cols);

  // Per row: B's and C's inverse RMS per group, the angles' rates pi tanh(P_angle).
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const T* pr = P.data() + std::size_t(row) * cols;
    for (int which = 0; which < 2; ++which)
      for (int gi = 0; gi < G; ++gi) {
        const T* b = pr + bc_col[which] + gi * Dh;
        T squares = 0;
        for (int j = 0; j < Dh; ++j) squares += b[j] * b[j];
        rinv[(std::size_t(which) * R + row) * G + gi] = T(1) / std::sqrt(squares / T(Dh) + T(kNormEps));
      }
    for (int i = 0; i < nA; ++i) phi[std::size_t(row) * nA + i] = pi * std::tanh(pr[l.angle + i]);
  }

  // Per (sequence, head), in token order: dt, g, trap, the cumulative angles, k, q and v.
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < BH; ++bh) {
    const long b = bh / H;
    const int h = int(bh % H), gi = h / per_group;
    T angle[kMaxDim / 2] = {};
    for (int t = 0; t < Tn; ++t) {
      const std::size_t row = std::size_t(b) * Tn + t, hr = std::size_t(bh) * Tn + t;
      const T* pr = P.data() + row * cols;
      const T d = softplus(pr[l.dt + h] + a.dt_bias[h]);
      dt[hr] = d;
      g[hr] = -std::max(heavy_tail(pr[l.da + h]), T(kAFloor)) * d;
      trap[hr] = pr[l.trap + h];
      T* th = theta.data() + hr * nA;
      for (int i = 0; i < nA; ++i) {
        // Reduced mod 2 pi, as the authors' kernels keep the angle state, so that a long sequence's
        // angles keep their bits; 2 pi in two parts (T(2 pi) and its rounding error), so that the
        // reductions do not add up T(2 pi)'s own error.
        const T next = angle[i] + phi[row * nA + i] * d, turns = std::floor(next / two_pi);
        angle[i] = th[i] = (next - turns * two_pi) - turns * two_pi_low;
      }
      for (int which = 0; which < 2; ++which) {
        const T* src = pr + bc_col[which] + gi * Dh;
        const T r = rinv[(std::size_t(which) * R + row) * G + gi];
        const T* w = norm_w[which];
        const T* bb = bias[which] + std::size_t(h) * Dh;
        T* dst = kq[which] + hr * Dh;
        for (int j = 0; j < Dh; ++j) dst[j] = src[j] * r * w[j] + bb[j];
        rotate(dst, th, nA);
      }
      std::copy_n(pr + l.x + h * Dh, Dh, v.data() + hr * Dh);
    }
  }

  // The trapezoidal kernel, the skip and the gate; out = y Wo.
  std::fill_n(h0.data(), s.state, T(0));
  ForwardArgs<T> fwd{q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data(), g.data()};
  fwd.dt = dt.data();
  fwd.trap = trap.data();
  ops.linear_forward(lp, fwd);
#pragma omp parallel for schedule(static)
  for (long hr = 0; hr < heads_rows; ++hr) {
    const long bh = hr / Tn;
    const int t = int(hr % Tn), h = int(bh % H);
    const std::size_t row = std::size_t(bh / H) * Tn + t;
    const T d = a.d_skip[h];
    T* ov = o.data() + std::size_t(hr) * Dh;
    const T* vv = v.data() + std::size_t(hr) * Dh;
    const T* z = P.data() + row * cols + l.z + std::size_t(h) * Dh;
    T* yr = y.data() + row * M + std::size_t(h) * Dh;
    for (int j = 0; j < Dh; ++j) {
      ov[j] += d * vv[j];  // o keeps o + D v: the gate's backward reads it
      yr[j] = ov[j] * silu(z[j]);
    }
  }
  ops.product(false, int(R), M, M, y.data(), M, a.wo, M, a.out, M);
  if (!backward) return;

  // ---- backward ----
  ops.weight_product(M, M, int(R), y.data(), M, a.dOut, M, a.dwo);
  ops.product(true, int(R), M, M, a.dOut, M, a.wo, M, dy.data(), M);

  // The gate's adjoint, per head (dD's sum over tokens in token order): dz into dP, dO = dy silu(z).
#pragma omp parallel for schedule(static)
  for (int h = 0; h < H; ++h) {
    double dd = 0;
    for (long b = 0; b < l.B; ++b)
      for (int t = 0; t < Tn; ++t) {
        const std::size_t hr = (std::size_t(b) * H + h) * Tn + t, row = std::size_t(b) * Tn + t;
        const T* ov = o.data() + hr * Dh;
        const T* vv = v.data() + hr * Dh;
        const T* d = dy.data() + row * M + std::size_t(h) * Dh;
        const T* z = P.data() + row * cols + l.z + std::size_t(h) * Dh;
        T* dz = dP.data() + row * cols + l.z + std::size_t(h) * Dh;
        T* dov = dO.data() + hr * Dh;
        for (int j = 0; j < Dh; ++j) {
          dz[j] = d[j] * ov[j] * silu_grad(z[j]);
          dov[j] = d[j] * silu(z[j]);
          dd += double(dov[j] * vv[j]);
        }
      }
    a.dd_skip[h] = T(dd);
  }

  // The kernel's backward (dhT = 0: h0 serves).
  BackwardArgs<T> bwd{q.data(), k.data(), v.data(), h0.data(), dO.data(), h0.data(), dq.data(), dk.data(),
                      dv.data(), dh0.data(), g.data(), dg.data()};
  bwd.dt = dt.data();
  bwd.trap = trap.data();
  bwd.ddt = ddt.data();
  bwd.dtrap = dtrap.data();
  ops.linear_backward(lp, bwd);

  // Per (sequence, head), tokens in reverse: v's skip, the rotation's adjoint (dq and dk back to the
  // biased norms', d theta summed from the sequence's end), dt's and the gates' columns of dP.
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < BH; ++bh) {
    const long b = bh / H;
    const int h = int(bh % H);
    const T dskip = a.d_skip[h];
    T later[kMaxDim / 2] = {};  // d theta_t summed over t' >= t: theta_t feeds every later angle
    for (int t = Tn - 1; t >= 0; --t) {
      const std::size_t row = std::size_t(b) * Tn + t, hr = std::size_t(bh) * Tn + t;
      const T* pr = P.data() + row * cols;
      T* dpr = dP.data() + row * cols;
      for (int j = 0; j < Dh; ++j) dpr[l.x + h * Dh + j] = dv[hr * Dh + j] + dskip * dO[hr * Dh + j];
      const T* th = theta.data() + hr * nA;
      T* dth = dtheta.data() + hr * nA;
      for (int i = 0; i < nA; ++i) {
        const T c = std::cos(th[i]), sn = std::sin(th[i]);
        T dangle = 0;
        for (int which = 0; which < 2; ++which) {
          const T* xv = kq[which] + hr * Dh;
          T* dx = dkq[which] + hr * Dh;
          const std::size_t e = 2 * std::size_t(i);
          const T d0 = dx[e], d1 = dx[e + 1];
          dangle += d1 * xv[e] - d0 * xv[e + 1];
          dx[e] = d0 * c + d1 * sn;
          dx[e + 1] = d1 * c - d0 * sn;
        }
        later[i] += dangle;
        dth[i] = later[i];
      }
      const T d = dt[hr], u = pr[l.da + h], A = -std::max(heavy_tail(u), T(kAFloor));
      T ddt_total = ddt[hr] + dg[hr] * A;
      for (int i = 0; i < nA; ++i) ddt_total += later[i] * phi[row * nA + i];
      dpr[l.da + h] = heavy_tail(u) > T(kAFloor) ? -dg[hr] * d * heavy_tail_grad(u) : T(0);
      dpr[l.dt + h] = ddt_total * sigmoid(pr[l.dt + h] + a.dt_bias[h]);
      dpr[l.trap + h] = dtrap[hr];
    }
  }

  // Per head, tokens in order: dt_bias and the biases of B and C.
#pragma omp parallel for schedule(static)
  for (int h = 0; h < H; ++h) {
    double dbias_dt = 0, dbias[2][kMaxDim] = {};
    for (long b = 0; b < l.B; ++b)
      for (int t = 0; t < Tn; ++t) {
        const std::size_t row = std::size_t(b) * Tn + t, hr = (std::size_t(b) * H + h) * Tn + t;
        dbias_dt += double(dP[row * cols + l.dt + h]);
        for (int which = 0; which < 2; ++which) {
          const T* dx = dkq[which] + hr * Dh;
          for (int j = 0; j < Dh; ++j) dbias[which][j] += double(dx[j]);
        }
      }
    a.ddt_bias[h] = T(dbias_dt);
    for (int j = 0; j < Dh; ++j) {
      a.db_bias[std::size_t(h) * Dh + j] = T(dbias[0][j]);
      a.dc_bias[std::size_t(h) * Dh + j] = T(dbias[1][j]);
    }
  }

  // Per row, heads in order: the angles' logits (theta's rate feeds every head through its dt), a
  // group's B~ and C~ (the sum over its heads), and the RMS norms' adjoint into dP.
#pragma omp parallel for schedule(static)
  for (long row = 0; row < R; ++row) {
    const long b = row / Tn;
    const int t = int(row % Tn);
    const T* pr = P.data() + std::size_t(row) * cols;
    T* dpr = dP.data() + std::size_t(row) * cols;
    for (int i = 0; i < nA; ++i) {
      T sum = 0;
      for (int h = 0; h < H; ++h) {
        const std::size_t hr = (std::size_t(b) * H + h) * Tn + t;
        sum += dtheta[hr * nA + i] * dt[hr];
      }
      const T th = std::tanh(pr[l.angle + i]);
      dpr[l.angle + i] = sum * pi * (T(1) - th * th);
    }
    for (int which = 0; which < 2; ++which)
      for (int gi = 0; gi < G; ++gi) {
        T* dn = dbc.data() + (std::size_t(which) * R + row) * GN + gi * Dh;  // d(B~ or C~): kept for the norm weight
        std::fill_n(dn, Dh, T(0));
        for (int h = gi * per_group; h < (gi + 1) * per_group; ++h) {
          const T* dx = dkq[which] + ((std::size_t(b) * H + h) * Tn + t) * Dh;
          for (int j = 0; j < Dh; ++j) dn[j] += dx[j];
        }
        const T* x = pr + bc_col[which] + gi * Dh;
        const T* w = norm_w[which];
        const T r = rinv[(std::size_t(which) * R + row) * G + gi];
        T dot = 0;
        for (int j = 0; j < Dh; ++j) dot += dn[j] * w[j] * x[j];
        const T c = r * r * r / T(Dh) * dot;
        for (int j = 0; j < Dh; ++j) dpr[bc_col[which] + gi * Dh + j] = r * dn[j] * w[j] - c * x[j];
      }
  }

  // The norm weights, per channel: rows in order, then groups.
#pragma omp parallel for schedule(static)
  for (int item = 0; item < 2 * Dh; ++item) {
    const int which = item / Dh, j = item % Dh;
    double sum = 0;
    for (long row = 0; row < R; ++row)
      for (int gi = 0; gi < G; ++gi)
        sum += double(dbc[(std::size_t(which) * R + row) * GN + std::size_t(gi) * Dh + j] *
                      P[std::size_t(row) * cols + bc_col[which] + std::size_t(gi) * Dh + j] *
                      rinv[(std::size_t(which) * R + row) * G + gi]);
    (which ? a.dc_norm : a.db_norm)[j] = T(sum);
  }

  // The input projections: dW_in = x^T dP (unpacked), dx = dP W_in^T.
  ops.weight_product(M, cols, int(R), a.x, M, dP.data(), cols, dW.data());
  T* const dparts[8] = {a.dwz, a.dwv, a.dwk, a.dwq, a.dwa, a.dwda, a.dwtrap, a.dwangle};
  for (int i = 0; i < M; ++i)
    for (int part = 0, col = 0; part < 8; col += widths[part], ++part)
      if (widths[part])
        std::copy_n(dW.data() + std::size_t(i) * cols + col, widths[part], dparts[part] + std::size_t(i) * widths[part]);
  ops.product(true, int(R), M, cols, dP.data(), cols, win.data(), cols, a.dx, M);
}

}  // namespace block::mamba3
}  // namespace lattn

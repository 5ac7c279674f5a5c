// Float64 reference of the hybrid layer. It follows docs/spec.md section 2 step by step with full-size
// intermediates; only the sliding window's O(T * W) bound is kept, so that seq 8192 stays quick.
#include "kernels/layer/hybrid/reference.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cancel.hpp"
#include "kernels/linear_attention/reference.hpp"
#include "kernels/sliding_window/reference.hpp"

namespace lattn::reference {
namespace {

using Vec = std::vector<double>;

// C = op(A) op(B) + beta C, row-major, in blocks of at most kRowBlock token rows with the run's
// stop request polled between them (core/cancel.hpp): at seq 262144 one product of the projections
// takes seconds. Token rows are A's rows (m) when A is not transposed, else the reduction (k);
// the layer never transposes both.
void gemm(bool ta, bool tb, int m, int n, int k, const double* A, const double* B, double beta, double* C) {
  constexpr int kRowBlock = 1024;
  const int lda = ta ? m : k, ldb = tb ? k : n;
  const int rows = ta ? k : m;
  for (int r = 0; r < rows; r += kRowBlock) {
    throw_if_stop_requested();
    const int block = std::min(kRowBlock, rows - r);
    if (!ta)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, block, n, k, 1.0, A + std::size_t(r) * lda,
                  lda, B, ldb, beta, C + std::size_t(r) * n, n);
    else  // the reduction over token rows r..r+block: the first block applies beta, the rest add
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, block, 1.0, A + std::size_t(r) * lda, lda,
                  B + std::size_t(r) * ldb, ldb, r == 0 ? beta : 1.0, C, n);
  }
}

// [B*T][M] <-> [B][H][T][Dh]
Vec to_heads(const LayerProblem& p, const Vec& rows) {
  const int T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  Vec out(rows.size());
  for (int b = 0; b < p.linear.batch; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < Dh; ++j)
          out[((std::size_t(b) * H + h) * T + t) * Dh + j] = rows[(std::size_t(b) * T + t) * p.model_dim() + std::size_t(h) * Dh + j];
  return out;
}

Vec to_rows(const LayerProblem& p, const Vec& heads) {
  const int T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  Vec out(heads.size());
  for (int b = 0; b < p.linear.batch; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < Dh; ++j)
          out[(std::size_t(b) * T + t) * p.model_dim() + std::size_t(h) * Dh + j] = heads[((std::size_t(b) * H + h) * T + t) * Dh + j];
  return out;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

struct Forward {
  Vec q, k, v, lin, linn, swa, y;  // q..swa per head, y per row
  Vec r;                           // per head row: (mean(lin^2) + eps)^-1/2
};

Forward forward(const LayerProblem& p, const LayerForwardArgs<double>& a) {
  const Problem& lp = p.linear;
  const int M = int(p.model_dim()), rows = int(p.rows()), T = lp.seq, H = lp.heads, Dh = lp.dim;
  Forward f;
  Vec tmp(p.token_elems());
  gemm(false, false, rows, M, M, a.x, a.wq, 0.0, tmp.data());
  f.q = to_heads(p, tmp);
  gemm(false, false, rows, M, M, a.x, a.wk, 0.0, tmp.data());
  f.k = to_heads(p, tmp);
  gemm(false, false, rows, M, M, a.x, a.wv, 0.0, tmp.data());
  f.v = to_heads(p, tmp);

  const Vec h0(lp.state_elems(), 0.0);
  Vec hT(lp.state_elems());
  f.lin.assign(p.token_elems(), 0.0);
  reference::forward(lp, {f.q.data(), f.k.data(), f.v.data(), h0.data(), f.lin.data(), hT.data()});
  f.swa.assign(p.token_elems(), 0.0);
  sliding_window_forward(lp, p.window, f.q.data(), f.k.data(), f.v.data(), f.swa.data(), nullptr);

  f.linn.assign(p.token_elems(), 0.0);
  f.r.assign(lp.heads_total() * T, 0.0);
  Vec y_heads(p.token_elems());
  for (std::size_t bh = 0; bh < lp.heads_total(); ++bh) {
    const int h = int(bh % H);
    const double sig = sigmoid(a.beta[h]);
    for (int t = 0; t < T; ++t) {
      const std::size_t row = bh * T + t, at = row * Dh;
      double squares = 0;
      for (int j = 0; j < Dh; ++j) squares += f.lin[at + j] * f.lin[at + j];
      f.r[row] = 1.0 / std::sqrt(squares / Dh + kRmsNormEps);
      for (int j = 0; j < Dh; ++j) {
        f.linn[at + j] = f.lin[at + j] * f.r[row] * a.g[h * Dh + j];
        y_heads[at + j] = sig * f.linn[at + j] + (1.0 - sig) * f.swa[at + j];
      }
    }
  }
  f.y = to_rows(p, y_heads);
  gemm(false, false, rows, M, M, f.y.data(), a.wo, 0.0, a.out);
  return f;
}

}  // namespace

void layer_forward(const LayerProblem& p, const LayerForwardArgs<double>& a) { forward(p, a); }

void layer_forward_backward(const LayerProblem& p, const LayerBackwardArgs<double>& a) {
  const Problem& lp = p.linear;
  const int M = int(p.model_dim()), rows = int(p.rows()), T = lp.seq, H = lp.heads, Dh = lp.dim;
  const Forward f = forward(p, {a.x, a.wq, a.wk, a.wv, a.wo, a.g, a.beta, a.out});

  gemm(true, false, M, M, rows, f.y.data(), a.dOut, 0.0, a.dwo);
  Vec dy_rows(p.token_elems());
  gemm(false, true, rows, M, M, a.dOut, a.wo, 0.0, dy_rows.data());
  const Vec dy = to_heads(p, dy_rows);

  Vec dlin(p.token_elems()), dswa(p.token_elems());
  std::fill_n(a.dg, M, 0.0);
  std::fill_n(a.dbeta, H, 0.0);
  for (std::size_t bh = 0; bh < lp.heads_total(); ++bh) {
    const int h = int(bh % H);
    const double sig = sigmoid(a.beta[h]);
    for (int t = 0; t < T; ++t) {
      const std::size_t row = bh * T + t, at = row * Dh;
      const double r = f.r[row];
      double ul = 0;  // u . lin with u = g sig dY
      for (int j = 0; j < Dh; ++j) {
        a.dbeta[h] += dy[at + j] * (f.linn[at + j] - f.swa[at + j]) * sig * (1.0 - sig);
        a.dg[h * Dh + j] += dy[at + j] * sig * f.lin[at + j] * r;
        ul += a.g[h * Dh + j] * sig * dy[at + j] * f.lin[at + j];
      }
      for (int j = 0; j < Dh; ++j) {
        dlin[at + j] = r * a.g[h * Dh + j] * sig * dy[at + j] - r * r * r / Dh * ul * f.lin[at + j];
        dswa[at + j] = (1.0 - sig) * dy[at + j];
      }
    }
  }

  const Vec zeros(lp.state_elems(), 0.0);
  Vec dq(p.token_elems()), dk(p.token_elems()), dv(p.token_elems()), dh0(lp.state_elems());
  reference::backward(lp, {f.q.data(), f.k.data(), f.v.data(), zeros.data(), dlin.data(), zeros.data(), dq.data(),
                           dk.data(), dv.data(), dh0.data()});
  Vec wq(p.token_elems()), wk(p.token_elems()), wv(p.token_elems());
  sliding_window_backward(lp, p.window, f.q.data(), f.k.data(), f.v.data(), dswa.data(), wq.data(), wk.data(), wv.data());
  for (std::size_t i = 0; i < dq.size(); ++i) {
    dq[i] += wq[i];
    dk[i] += wk[i];
    dv[i] += wv[i];
  }

  const Vec dQ = to_rows(p, dq), dK = to_rows(p, dk), dV = to_rows(p, dv);
  gemm(false, true, rows, M, M, dQ.data(), a.wq, 0.0, a.dx);
  gemm(false, true, rows, M, M, dK.data(), a.wk, 1.0, a.dx);
  gemm(false, true, rows, M, M, dV.data(), a.wv, 1.0, a.dx);
  gemm(true, false, M, M, rows, a.x, dQ.data(), 0.0, a.dwq);
  gemm(true, false, M, M, rows, a.x, dK.data(), 0.0, a.dwk);
  gemm(true, false, M, M, rows, a.x, dV.data(), 0.0, a.dwv);
}

}  // namespace lattn::reference

// The float64 block (block/reference.hpp): what block.hpp's and mamba3.hpp's templates need, in double.
#include "kernels/layer/block/reference.hpp"

#include <cblas.h>

#include <vector>

#include "kernels/layer/block/rwkv7.hpp"

#include "core/cancel.hpp"
#include "kernels/layer/block/mamba3.hpp"
#include "kernels/linear_attention/reference.hpp"
#include "kernels/sliding_window/reference.hpp"

namespace lattn::reference {
namespace {

struct ReferenceOps {
  std::vector<double> buffer(std::size_t n) { return std::vector<double>(n); }
  void product(bool trans_b, int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C,
               int ldc) {
    throw_if_stop_requested();
    cblas_dgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0, A, lda, B, ldb, 0.0,
                C, ldc);
  }
  void weight_product(int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C) {
    throw_if_stop_requested();
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0, A, lda, B, ldb, 0.0, C, n);
  }
  void linear_forward(const Problem& p, const ForwardArgs<double>& args) { forward(p, args); }
  void linear_backward(const Problem& p, const BackwardArgs<double>& args) { backward(p, args); }
  void window_forward(const Problem& p, int window, const double* q, const double* k, const double* v, double* o,
                      double* lse) {
    sliding_window_forward(p, window, q, k, v, o, lse);
  }
  void window_backward(const Problem& p, int window, const double* q, const double* k, const double* v,
                       const double*, const double*, const double* dO, double* dq, double* dk, double* dv) {
    std::vector<double> wq(p.token_elems()), wk(p.token_elems()), wv(p.token_elems());
    sliding_window_backward(p, window, q, k, v, dO, wq.data(), wk.data(), wv.data());
    for (std::size_t i = 0; i < wq.size(); ++i) {
      dq[i] += wq[i];
      dk[i] += wk[i];
      dv[i] += wv[i];
    }
  }
};

}  // namespace

void block_forward(const LayerProblem& p, const BlockArgs<double>& args) {
  ReferenceOps ops;
  if (p.linear.dplr())
    block::rwkv7::run(p, args, ops, false);  // RWKV-7's time mixing
  else if (p.linear.trapezoidal())
    block::mamba3::run(p, args, ops, false);
  else
    block::run(p, args, ops, false);
}

void block_forward_backward(const LayerProblem& p, const BlockArgs<double>& args) {
  ReferenceOps ops;
  if (p.linear.dplr())
    block::rwkv7::run(p, args, ops, true);
  else if (p.linear.trapezoidal())
    block::mamba3::run(p, args, ops, true);
  else
    block::run(p, args, ops, true);
}

}  // namespace lattn::reference

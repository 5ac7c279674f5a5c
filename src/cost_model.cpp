#include "cost_model.hpp"

#include <algorithm>

namespace lattn {

namespace {

double kernel_flops(const Case& kase) {
  const Problem& p = kase.problem;
  const double per_head_tokens = double(p.heads_total()) * p.seq;
  const double D = p.dim;
  if (kase.impl == Impl::scan) return per_head_tokens * (kase.mode == Mode::fwd ? 4.0 : 14.0) * D * D;
  const double C = std::min(p.chunk, p.seq);
  const double forward = per_head_tokens * (4.0 * D * D + 2.0 * C * D);
  return kase.mode == Mode::fwd ? forward : 3.0 * forward;
}

// Keys the causal window sees, summed over the queries of one head: sum_t min(t + 1, W).
double window_pairs(double T, double W) {
  if (T <= W) return T * (T + 1) / 2;
  return W * (W + 1) / 2 + (T - W) * W;
}

// The layer (docs/performance.md, "Layer suite"): the four M x M projections, the linear branch by
// the kernel model, the window's two products over the causal pairs it computes (the masked part
// of a query block's tile is not counted), and the norm and gate as elementwise work.
double layer_flops(const Case& kase) {
  const Problem& p = kase.problem;
  const double rows = double(p.batch) * p.seq, M = double(kase.model_dim()), Dh = p.dim;
  const double projections = 4 * 2 * rows * M * M;
  const double pairs = double(p.heads_total()) * window_pairs(p.seq, kase.window);
  const double window = 4 * pairs * Dh;
  const double elementwise = 8 * rows * M;  // squares and their sum, two scalings, the gate's blend
  Case linear = kase;
  linear.suite = "kernel";
  const double branch = kernel_flops(linear);  // includes its own backward for fwd_bwd
  if (kase.mode == Mode::fwd) return projections + branch + window + elementwise;
  // Backward: dx and dW per projection (2x), the window's five products (recomputed scores,
  // dP, dQ, dK, dV: 2.5x), and about twice the elementwise work.
  return 3 * projections + branch + 3.5 * window + 3 * elementwise;
}

}  // namespace

double case_flops(const Case& kase) { return kase.is_layer() ? layer_flops(kase) : kernel_flops(kase); }

double case_min_bytes(const MemoryUsage& memory) { return double(memory.arg_bytes + memory.out_bytes); }

double case_cost_estimate(const Case& kase) {
  const Problem& p = kase.problem;
  return case_flops(kase) + 64.0 * double(p.token_elems());  // a layer's token_elems is B * T * M
}

}  // namespace lattn

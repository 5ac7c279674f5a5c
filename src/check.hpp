// The correctness check of every case: relative L2 error of each output against a float64
// reference on the same inputs (SPEC section 4), outside any timed region.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "backend.hpp"
#include "layer_problem.hpp"

namespace lattn {

// Tolerance on rel_err per dtype (docs/harness.md says why these values).
double tolerance_for(const std::string& dtype);
// The layer suite's, per dtype: its gradients are sums over every token of the batch, so float32
// rounding there is larger than in the kernel's outputs (docs/harness.md).
double layer_tolerance_for(const std::string& dtype);

struct OutputError {
  double rel_err = 0;
  long first_non_finite = -1;  // index of the first NaN/Inf in the output, -1 when none
};

// ||x - ref||_2 / ||ref||_2; ||x||_2 when ref is all zeros; +inf when x holds a NaN or Inf.
OutputError relative_l2_error(const float* x, const double* ref, std::size_t n);

struct KernelReference {
  std::vector<double> o, hT, dq, dk, dv, dh0;
  bool has_backward = false;
};

KernelReference compute_kernel_reference(const Problem& problem, const KernelTensors& inputs, bool backward);

struct LayerReference {
  std::vector<double> out, dx, dwq, dwk, dwv, dwo, dg, dbeta;
  bool has_backward = false;
};

// `problem` is the layer's (a Case's problem with its window and impl).
LayerReference compute_layer_reference(const LayerProblem& problem, const LayerTensors& inputs, bool backward);

struct CheckResult {
  double rel_err = 0;                     // the largest per-output error
  std::map<std::string, double> per_output;
  std::string worst_output;
  std::string non_finite;                 // "dq[123]" when an output held NaN/Inf
  double tolerance = 0;
  bool passed = false;
};

CheckResult check_kernel_outputs(const KernelTensors& outputs, const KernelReference& reference, Mode mode,
                                 double tolerance);
// out for fwd; out, dx, dwq, dwk, dwv, dwo, dg, dbeta for fwd_bwd.
CheckResult check_layer_outputs(const LayerTensors& outputs, const LayerReference& reference, Mode mode,
                                double tolerance);

}  // namespace lattn

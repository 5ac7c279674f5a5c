// The correctness check of every case: relative L2 error of each output against the op's float64
// reference on the same inputs (docs/spec.md section 4), outside any timed region.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "core/case.hpp"
#include "core/tensor_set.hpp"

namespace lattn {

struct OutputError {
  double rel_err = 0;
  long first_non_finite = -1;  // index of the first NaN/Inf in the output, -1 when none
};

// ||x - ref||_2 / max(||ref||_2, floor); ||x - ref||_2 when both are 0; +inf when x holds a NaN
// or Inf. `floor` is the norm of the output the op names as this one's error floor, or 0.
OutputError relative_l2_error(const float* x, const double* ref, std::size_t n, double floor = 0);

struct CheckResult {
  double rel_err = 0;                     // the largest per-output error
  std::map<std::string, double> per_output;
  std::string worst_output;
  std::string non_finite;                 // "dq[123]" when an output held NaN/Inf
  double tolerance = 0;
  bool passed = false;

  // Why the check failed, in one line; empty when it passed.
  std::string failure() const;
};

// Every output (and for fwd_bwd every gradient) of `kase`, in the order its op lists them,
// against `reference`, with the op's tolerance for the case's dtype.
CheckResult check_outputs(const Case& kase, const TensorSet& outputs, const Reference& reference);

}  // namespace lattn

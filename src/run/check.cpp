#include "src/run/check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/op.hpp"

namespace lattn {

OutputError relative_l2_error(const float* x, const double* ref, std::size_t n, double floor) {
  OutputError result;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      result.rel_err = std::numeric_limits<double>::infinity();
      result.first_non_finite = long(i);
      return result;
    }
    const double d = double(x[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  const double scale = std::max(std::sqrt(norm), floor);
  result.rel_err = scale > 0 ? std::sqrt(diff) / scale : std::sqrt(diff);
  return result;
}

std::string CheckResult::failure() const {
  if (!non_finite.empty()) return "non-finite output at " + non_finite;
  if (passed) return {};
  return fmt::format("{} rel_err {:.3e} over tolerance {:.1e}", worst_output, rel_err, tolerance);
}

CheckResult check_outputs(const Case& kase, const TensorSet& outputs, const Reference& reference) {
  CheckResult result;
  result.tolerance = kase.op->case_tolerance ? kase.op->case_tolerance(kase) : kase.op->tolerance(kase.dtype);
  if (kase.backward() && !reference.has_backward)
    throw RuntimeFailure("the reference has no backward for a fwd_bwd case");
  for (const TensorSpec& spec : kase.op->tensors) {
    if (is_input(spec.role) || !spec.in(kase)) continue;
    const Tensor& x = outputs.at(spec.name);
    const auto ref = reference.values.find(spec.name);
    if (ref == reference.values.end() || x.elems() != ref->second.size())
      throw RuntimeFailure("output " + spec.name + " has the wrong size");
    double floor = 0;
    if (spec.error_floor) {
      const auto of = reference.values.find(spec.error_floor);
      if (of == reference.values.end()) throw RuntimeFailure("output " + spec.name + "'s error floor has no reference");
      for (double v : of->second) floor += v * v;
      floor = std::sqrt(floor);
    }
    const OutputError e = relative_l2_error(x.data.data(), ref->second.data(), x.elems(), floor);
    result.per_output[spec.name] = e.rel_err;
    if (e.first_non_finite >= 0 && result.non_finite.empty())
      result.non_finite = spec.name + "[" + std::to_string(e.first_non_finite) + "]";
    if (result.worst_output.empty() || e.rel_err > result.rel_err) {
      result.rel_err = e.rel_err;
      result.worst_output = spec.name;
    }
  }
  result.passed = result.non_finite.empty() && result.rel_err <= result.tolerance;
  return result;
}

}  // namespace lattn

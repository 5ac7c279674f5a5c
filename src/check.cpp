#include "check.hpp"

#include <cmath>
#include <limits>

#include "error.hpp"
#include "reference/linear_attention_ref.hpp"

namespace lattn {

double tolerance_for(const std::string& dtype) {
  if (dtype == "float32") return 1e-4;
  if (dtype == "bf16") return 3e-2;
  throw UsageError("dtype", "no tolerance known for '" + dtype + "'");
}

OutputError relative_l2_error(const float* x, const double* ref, std::size_t n) {
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
  result.rel_err = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return result;
}

namespace {
std::vector<double> widened(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
}  // namespace

KernelReference compute_kernel_reference(const Problem& p, const KernelTensors& in, bool backward) {
  KernelReference ref;
  const auto q = widened(in.q), k = widened(in.k), v = widened(in.v), h0 = widened(in.h0);
  ref.o.assign(p.token_elems(), 0.0);
  ref.hT.assign(p.state_elems(), 0.0);
  reference::forward(p, {q.data(), k.data(), v.data(), h0.data(), ref.o.data(), ref.hT.data()});
  if (backward) {
    const auto dO = widened(in.dO), dhT = widened(in.dhT);
    ref.dq.assign(p.token_elems(), 0.0);
    ref.dk.assign(p.token_elems(), 0.0);
    ref.dv.assign(p.token_elems(), 0.0);
    ref.dh0.assign(p.state_elems(), 0.0);
    reference::backward(p, {q.data(), k.data(), v.data(), h0.data(), dO.data(), dhT.data(), ref.dq.data(),
                            ref.dk.data(), ref.dv.data(), ref.dh0.data()});
    ref.has_backward = true;
  }
  return ref;
}

CheckResult check_kernel_outputs(const KernelTensors& out, const KernelReference& ref, Mode mode, double tolerance) {
  CheckResult result;
  result.tolerance = tolerance;
  auto check = [&](const char* name, const std::vector<float>& x, const std::vector<double>& r) {
    if (x.size() != r.size()) throw RuntimeFailure(std::string("output ") + name + " has the wrong size");
    const OutputError e = relative_l2_error(x.data(), r.data(), x.size());
    result.per_output[name] = e.rel_err;
    if (e.first_non_finite >= 0 && result.non_finite.empty())
      result.non_finite = std::string(name) + "[" + std::to_string(e.first_non_finite) + "]";
    if (result.worst_output.empty() || e.rel_err > result.rel_err) {
      result.rel_err = e.rel_err;
      result.worst_output = name;
    }
  };
  check("o", out.o, ref.o);
  check("hT", out.hT, ref.hT);
  if (mode == Mode::fwd_bwd) {
    if (!ref.has_backward) throw RuntimeFailure("the reference has no backward for a fwd_bwd case");
    check("dq", out.dq, ref.dq);
    check("dk", out.dk, ref.dk);
    check("dv", out.dv, ref.dv);
    check("dh0", out.dh0, ref.dh0);
  }
  result.passed = result.non_finite.empty() && result.rel_err <= tolerance;
  return result;
}

}  // namespace lattn

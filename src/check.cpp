#include "check.hpp"

#include <cmath>
#include <limits>

#include "error.hpp"
#include "reference/layer_ref.hpp"
#include "reference/linear_attention_ref.hpp"

namespace lattn {

double tolerance_for(const std::string& dtype) {
  if (dtype == "float32") return 1e-4;
  if (dtype == "bf16") return 3e-2;
  throw UsageError("dtype", "no tolerance known for '" + dtype + "'");
}

double layer_tolerance_for(const std::string& dtype) {
  if (dtype == "float32") return 1e-3;
  if (dtype == "bf16") return 5e-2;
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

namespace {
// Adds one output's error to `result`.
void check_one(CheckResult& result, const char* name, const std::vector<float>& x, const std::vector<double>& r) {
  if (x.size() != r.size()) throw RuntimeFailure(std::string("output ") + name + " has the wrong size");
  const OutputError e = relative_l2_error(x.data(), r.data(), x.size());
  result.per_output[name] = e.rel_err;
  if (e.first_non_finite >= 0 && result.non_finite.empty())
    result.non_finite = std::string(name) + "[" + std::to_string(e.first_non_finite) + "]";
  if (result.worst_output.empty() || e.rel_err > result.rel_err) {
    result.rel_err = e.rel_err;
    result.worst_output = name;
  }
}
}  // namespace

LayerReference compute_layer_reference(const LayerProblem& p, const LayerTensors& in, bool backward) {
  LayerReference ref;
  const auto x = widened(in.x), wq = widened(in.wq), wk = widened(in.wk), wv = widened(in.wv), wo = widened(in.wo),
             g = widened(in.g), beta = widened(in.beta);
  ref.out.assign(p.token_elems(), 0.0);
  if (!backward) {
    reference::layer_forward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(),
                                 ref.out.data()});
    return ref;
  }
  const auto dOut = widened(in.dOut);
  ref.dx.assign(p.token_elems(), 0.0);
  for (auto* w : {&ref.dwq, &ref.dwk, &ref.dwv, &ref.dwo}) w->assign(p.weight_elems(), 0.0);
  ref.dg.assign(p.model_dim(), 0.0);
  ref.dbeta.assign(std::size_t(p.linear.heads), 0.0);
  reference::layer_forward_backward(p, {x.data(), wq.data(), wk.data(), wv.data(), wo.data(), g.data(), beta.data(),
                                        dOut.data(), ref.out.data(), ref.dx.data(), ref.dwq.data(), ref.dwk.data(),
                                        ref.dwv.data(), ref.dwo.data(), ref.dg.data(), ref.dbeta.data()});
  ref.has_backward = true;
  return ref;
}

CheckResult check_layer_outputs(const LayerTensors& out, const LayerReference& ref, Mode mode, double tolerance) {
  CheckResult result;
  result.tolerance = tolerance;
  check_one(result, "out", out.out, ref.out);
  if (mode == Mode::fwd_bwd) {
    if (!ref.has_backward) throw RuntimeFailure("the reference has no backward for a fwd_bwd case");
    check_one(result, "dx", out.dx, ref.dx);
    check_one(result, "dwq", out.dwq, ref.dwq);
    check_one(result, "dwk", out.dwk, ref.dwk);
    check_one(result, "dwv", out.dwv, ref.dwv);
    check_one(result, "dwo", out.dwo, ref.dwo);
    check_one(result, "dg", out.dg, ref.dg);
    check_one(result, "dbeta", out.dbeta, ref.dbeta);
  }
  result.passed = result.non_finite.empty() && result.rel_err <= tolerance;
  return result;
}

CheckResult check_kernel_outputs(const KernelTensors& out, const KernelReference& ref, Mode mode, double tolerance) {
  CheckResult result;
  result.tolerance = tolerance;
  auto check = [&](const char* name, const std::vector<float>& x, const std::vector<double>& r) {
    check_one(result, name, x, r);
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

// The correctness table every backend is held to, as ggml's test-backend-ops holds its backends:
// each row is an op and the shapes it runs at; every impl row a backend has for that op runs every
// shape in both modes and both dtypes against the op's float64 reference. A case the backend
// declines is counted under its reason and printed as "not supported: <reason>", never passed
// silently. tests/test_ops.cpp runs it on the CPU, tests/cuda/test_cuda_ops.cpp on the GPU, and
// tests/cuda_emulation/test_backend.cpp on the CUDA backend built against the CPU emulation.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "trapezoidal_cases.hpp"

namespace lattn::test {

struct OpTestRow {
  std::vector<Case> shapes;  // op and shape set; impl, mode, dtype and backend filled in per case
  double float32_bound;      // a float32 result's rel_err must also be under this (its tolerance is looser)
};

// One row per op. Adding an op, a decay or a shape to the suite's coverage is a line here.
inline std::vector<OpTestRow> op_test_table() {
  OpTestRow linear{{}, 1e-5}, layer{{}, 1e-4}, window{{}, 1e-5}, decode{{}, 1e-5};
  for (const Problem& p : kernel_test_shapes()) {
    linear.shapes.push_back(kernel_case(p, "", Mode::fwd));
    if (gated(p.decay)) linear.shapes.push_back(gated_case(p, "1", "", Mode::fwd));
  }
  for (const Problem& p : trapezoidal_test_shapes()) linear.shapes.push_back(trapezoidal_case(p, "1", "", Mode::fwd));
  for (const LayerProblem& p : layer_test_shapes()) layer.shapes.push_back(layer_case(p, Mode::fwd));
  for (const LayerProblem& p : block_test_shapes()) layer.shapes.push_back(layer_case(p, Mode::fwd));
  for (const LayerProblem& p : rwkv7_test_shapes()) layer.shapes.push_back(layer_case(p, Mode::fwd));
  for (const LayerProblem& p : mamba3_test_shapes()) layer.shapes.push_back(layer_case(p, Mode::fwd));
  for (const WindowShape& w : window_test_shapes()) window.shapes.push_back(window_case(w.p, w.window, Mode::fwd));
  for (const DecodeProblem& p : decode_test_shapes()) decode.shapes.push_back(decode_case(p));
  for (const DecodeProblem& p : decode_trapezoidal_test_shapes()) decode.shapes.push_back(trapezoidal_decode_case(p));
  return {linear, layer, window, decode};
}

struct TableRun {
  int checked = 0;
  std::map<std::string, int> checked_by_op;
  std::map<std::string, int> checked_by_variant;  // the backend's variant name (Backend::variant) -> cases
  std::map<std::string, int> not_supported;  // "op impl: reason" -> cases
};

// Makes the backend under test with the given options (make_backend, or a backend built elsewhere:
// the emulated CUDA one).
using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendOptions&)>;

// Runs the table on the backend `make` makes (cases name it `backend_name`): every row's shapes x
// the backend's impls of that op x modes x dtypes; chunked fwd_bwd cases once more with the chunk
// states recomputed instead of kept. `include` (when given) picks the cases to run of those the
// backend does not decline (a slow backend's test runs only the cases a setting changes), and
// `only_op` one op's row (a slow backend's test runs the rows as separate tests).
inline TableRun run_op_table(const std::string& backend_name, const BackendFactory& make,
                             const std::function<bool(const Case&)>& include = {}, const std::string& only_op = {}) {
  TableRun run;
  // The impls and the two backends innermost: a shape's inputs and reference (the op's, whatever
  // runs it) are made once for all of them.
  const std::unique_ptr<Backend> keeping = make(BackendOptions{0, 0, true});
  const std::unique_ptr<Backend> recomputing = make(BackendOptions{0, 0, false});
  for (const OpTestRow& row : op_test_table()) {
    if (!only_op.empty() && row.shapes.front().op->name != only_op) continue;
    for (Case kase : row.shapes)
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd})
        for (const std::string dtype : {"float32", "bf16"})
          for (const ImplRow& impl : keeping->impls) {
            if (impl.op != row.shapes.front().op->name) continue;
            for (const bool keep : {true, false}) {
              Backend& backend = keep ? *keeping : *recomputing;
              kase.impl = impl.impl;
              kase.mode = mode;
              kase.dtype = dtype;
              kase.backend = backend_name;
              if (!keep && (kase.impl != "chunked" || mode != Mode::fwd_bwd)) continue;
              if (auto why = backend.unsupported(kase)) {
                ++run.not_supported[kase.op->name + " " + kase.impl + ": " + *why];
                continue;
              }
              if (include && !include(kase)) continue;
              INFO(describe(kase) << (keep ? "" : " (chunk states recomputed)"));
              const Outcome r = run_on(backend, kase, 5);
              INFO(errors(r.check));
              CHECK(r.check.non_finite.empty());
              CHECK(r.check.passed);
              if (dtype == "float32") CHECK(r.check.rel_err < row.float32_bound);
              ++run.checked;
              ++run.checked_by_op[kase.op->name];
              ++run.checked_by_variant[backend.variant(kase)];
            }
          }
  }
  return run;
}

// The same on a backend of this build, by name.
inline TableRun run_op_table(const std::string& backend_name) {
  return run_op_table(backend_name, [&](const BackendOptions& options) { return make_backend(backend_name, options); });
}

}  // namespace lattn::test

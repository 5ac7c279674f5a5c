// The delta rule (docs/spec.md section 1b) beyond the correctness table: both CPU forms at the extremes of
// beta and under strong gates, every vector width and thread split, their scratch against its
// closed form, raw (unnormalised) keys through the real binary, and the config keys' validation.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <fstream>
#include <vector>

#include "src/run/counting_allocator.hpp"
#include "src/config/plan.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

Problem delta(Problem p) {
  p.rule = Rule::delta;
  return p;
}

// One case on the CPU backend with its inputs edited before the backend and the reference see them.
CheckResult run_edited(const Case& kase, const std::function<void(TensorSet&)>& edit, int threads = 0) {
  auto backend = make_backend("cpu", BackendOptions{threads});
  TensorSet all = make_case_inputs(kase, 3);
  if (edit) edit(all);
  const Reference reference = kase.op->reference(kase, all, kase.backward());
  auto prepared = backend->find(kase.op->name, kase.impl)->prepare(kase, all.inputs_for(kase.mode));
  prepared->run();
  TensorSet outputs = make_case_outputs(kase);
  prepared->read_outputs(outputs);
  return check_outputs(kase, outputs, reference);
}

constexpr Decay kDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};

}  // namespace

TEST_CASE("delta rule: scan and chunked match the reference with beta near 0 and near 1", "[delta]") {
  // beta 1e-4: the state hardly moves and dbeta carries the gradient through v - u; beta 0.9999
  // with unit keys: each write all but replaces the state's value for k (I - beta k k^T close to a
  // projection). At D = 1 the key spans the whole state, so a write with beta near 1 erases all of
  // it: dh0 and dg are then of order (1 - beta) times the terms they are summed from, and lose digits
  // in proportion to 1 / (1 - beta) in float32 (the chunked form's dh0 most: per chunk it is a sum
  // of n such terms; docs/kernels.md). Those cases (D = 1, beta 0.9 to 0.9999) are run and must
  // stay finite; their errors are reported, not held to the float32 bound.
  double worst = 0, worst_conditioned = 0;
  for (const float beta : {1e-4f, 0.9f, 0.99f, 0.9999f})
    for (Decay decay : kDecays)
      for (const Problem& shape : {Problem{1, 2, 20, 8, 64}, Problem{1, 2, 100, 16, 32}, Problem{1, 1, 37, 1, 16},
                                   Problem{2, 1, 50, 5, 16}})
        for (const char* impl : {"scan", "chunked"}) {
          Problem p = delta(shape);
          p.decay = decay;
          const Case kase = gated(decay) ? test::gated_case(p, "1", impl, Mode::fwd_bwd)
                                         : test::kernel_case(p, impl, Mode::fwd_bwd);
          INFO(test::describe(kase) << " beta " << beta);
          const CheckResult r = run_edited(kase, [&](TensorSet& t) {
            auto& b = t.at("beta").data;
            std::fill(b.begin(), b.end(), beta);
          });
          INFO(test::errors(r));
          CHECK(r.non_finite.empty());
          if (p.dim == 1 && beta >= 0.9f) {
            worst_conditioned = std::max(worst_conditioned, r.rel_err);
            continue;
          }
          CHECK(r.passed);
          CHECK(r.rel_err < 1e-5);
          worst = std::max(worst, r.rel_err);
        }
  WARN("delta rule, beta 1e-4 to 0.9999 (strong gates): worst rel_err " << worst
       << "; D = 1 with beta 0.9 to 0.9999 (1 / (1 - beta) conditioning): " << worst_conditioned);
}

TEST_CASE("delta rule: strong gates keep both forms finite and within tolerance", "[delta][strong]") {
  // gate_norm 1 and 0.25: a chunk's cumulative log-gate reaches -100 and below, where exp(b_i)
  // exp(-b_j) would overflow float32 (tests/kernels/test_gated.cpp); every factor here is exp of a
  // difference <= 0.
  double worst = 0;
  for (const char* gate_norm : {"1", "0.25"})
    for (Decay decay : {Decay::scalar, Decay::vector})
      for (const char* impl : {"scan", "chunked"}) {
        Problem p = delta({1, 2, 1024, 32, 128});
        p.decay = decay;
        const Case kase = test::gated_case(p, gate_norm, impl, Mode::fwd_bwd);
        INFO(test::describe(kase));
        const CheckResult r = run_edited(kase, {});
        INFO(test::errors(r));
        CHECK(r.non_finite.empty());
        CHECK(r.passed);
        worst = std::max(worst, r.rel_err);
      }
  WARN("delta rule, gate_norm 1 and 0.25, T 1024: worst rel_err " << worst);
}

TEST_CASE("delta rule: every vector width and thread split matches the reference", "[delta][paths]") {
  // D 37: ragged over every walk width (32, 16, 8) and the 32-column tile panels; 1 and 3 heads on
  // 1 to 3 threads: the scan forward splits one head's column blocks over threads.
  for (const cpu::Vec vec : cpu::available_vecs()) {
    const test::VecOverride force(vec);
    for (int threads = 1; threads <= 3; ++threads)
      for (Decay decay : kDecays)
        for (const Problem& shape : {Problem{1, 1, 45, 37, 16}, Problem{1, 3, 70, 64, 32}})
          for (const char* impl : {"scan", "chunked"}) {
            Problem p = delta(shape);
            p.decay = decay;
            const Case kase = test::kernel_case(p, impl, Mode::fwd_bwd);
            INFO(test::describe(kase) << " " << cpu::to_string(vec) << " threads " << threads);
            const CheckResult r = run_edited(kase, {}, threads);
            INFO(test::errors(r));
            CHECK(r.passed);
            CHECK(r.rel_err < 1e-5);
          }
  }
}

TEST_CASE("delta rule: each CPU kernel's scratch equals its closed form", "[delta][memory]") {
  omp_set_num_threads(2);
  for (const cpu::Vec vec : cpu::available_vecs()) {
    const test::VecOverride force(vec);
    for (Decay decay : kDecays)
      for (const Problem& shape : {Problem{2, 4, 300, 32, 128}, Problem{1, 1, 70, 80, 32}}) {
        Problem p = delta(shape);
        p.decay = decay;
        INFO(test::describe(p) << " " << cpu::to_string(vec));
        const std::size_t D = p.dim, C = std::min(p.chunk, p.seq), chunks = std::size_t(p.chunks());
        const std::size_t heads_threads = std::min<std::size_t>(2, p.heads_total());
        const bool vector = decay == Decay::vector;
        auto lines = [](std::size_t floats) { return (floats + 15) / 16 * 16; };
        // The scan (cpu/scan/scan_delta.cpp): walks of W columns (32, 16, 8 by width), Dp = D rounded up
        // to W; per thread a packed state, the tile's gates ((64 + 2) x gw, gw = Dp or 1), the two
        // pending updates of each block (Dp each), six W-float operands, 64 q . k and the forward's
        // 32 pairs of tokens (three D rows each, a fourth for vector gates, three scalars); the
        // backward's thread has a second state, e of a tile (64 D) and, with gates, dg's Dp doubles.
        const std::size_t W = vec == cpu::Vec::avx512 ? 32 : vec == cpu::Vec::avx2 ? 16 : 8;
        const std::size_t Dp = (D + W - 1) / W * W, gw = vector ? Dp : decay == Decay::scalar ? 1 : 0;
        const std::size_t pairs = 32 * ((vector ? 4 : 3) * D + 3);
        const std::size_t scan_fwd = lines(D * Dp + 66 * gw + 2 * Dp + 6 * W + 64 + pairs);
        const std::size_t scan_bwd =
            lines((gw ? 2 * Dp : 0) + 2 * D * Dp + 66 * gw + 64 * D + 2 * Dp + 6 * W + 64 + pairs);
        const std::size_t items = p.heads_total() * ((D + W - 1) / W);
        CHECK(cpu::scan_forward_workspace_bytes(p) == std::min<std::size_t>(2, items) * scan_fwd * 4);
        CHECK(cpu::scan_backward_workspace_bytes(p) == heads_threads * scan_bwd * 4);
        // The chunked WY form (cpu/chunked/chunked_delta_parts.hpp): L = C + 16, PD, PC rounded up to 32, g = D
        // for vector gates else 1; per thread b (C g doubles) and dg's D doubles, the gates'
        // factors, the mask (or the ones mask), A_qk, A_kk, T, six C x D operands and the
        // scores' lanes (2 sources x D x 32 rows) for vector gates, X, R, W, K^T and W^T panels, three C x PD panels and the packed state; the
        // backward adds dP_qk, dP_kk, dW, dK_read, dK_write, four C x PD panels, S^T, dS, dS^T, for
        // vector gates three C x D rows for the score gradients' products and, without kept states,
        // every chunk's packed state.
        const std::size_t L = C + 16, PD = (D + 31) / 32 * 32, PC = (C + 31) / 32 * 32, g = vector ? D : 1;
        const std::size_t fwd = lines(2 * C * g + 2 * D + (vector ? C * D : 0) + 2 * C * g + 2 * D + C * L + 3 * C * L +
                                      (vector ? 6 * C * D + 2 * D * 32 : 0) + 3 * C * D + 2 * D * PC + 3 * C * PD + D * PD);
        const std::size_t bwd_extra = 2 * C * L + 3 * C * D + 4 * C * PD + 3 * D * PD + (vector ? 3 * C * D : 0);
        const std::size_t SF = D * PD;
        auto bwd = [&](bool kept) {
          return lines(2 * C * g + 2 * D + (vector ? C * D : 0) + 2 * C * g + 2 * D + C * L + 3 * C * L +
                       (vector ? 6 * C * D + 2 * D * 32 : 0) + 3 * C * D + 2 * D * PC + 3 * C * PD + D * PD + bwd_extra +
                       (kept ? 0 : chunks * SF));
        };
        CHECK(cpu::chunked_kept_states_bytes(p) == p.heads_total() * chunks * SF * 4);
        CHECK(cpu::chunked_forward_workspace_bytes(p) == heads_threads * fwd * 4);
        CHECK(cpu::chunked_backward_workspace_bytes(p) == heads_threads * bwd(false) * 4);
        CHECK(cpu::chunked_backward_workspace_bytes(p, true) == heads_threads * bwd(true) * 4);

        // And the kernels' counted peaks are those.
        const Case kase = test::kernel_case(p, "scan", Mode::fwd_bwd);
        const TensorSet t = make_case_inputs(kase, 0);
        std::vector<float> o(p.token_elems()), hT(p.state_elems()), dq(p.token_elems()), dk(p.token_elems()),
            dv(p.token_elems()), dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.beta_elems());
        const float* gates = gated(decay) ? t.data("g") : nullptr;
        const ForwardArgs<float> fa{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data(), gates,
                                    t.data("beta")};
        const BackwardArgs<float> ba{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), t.data("dO"),
                                     t.data("dhT"), dq.data(), dk.data(), dv.data(), dh0.data(), gates,
                                     gated(decay) ? dg.data() : nullptr, t.data("beta"), dbeta.data()};
        auto peak_of = [](auto&& call) {
          CountingAllocator allocator;
          call(allocator);
          CHECK(allocator.live_bytes() == 0);
          return allocator.peak_bytes();
        };
        CHECK(peak_of([&](Allocator& a) { cpu::scan_forward(p, fa, a); }) == cpu::scan_forward_workspace_bytes(p));
        CHECK(peak_of([&](Allocator& a) { cpu::scan_backward(p, ba, a); }) == cpu::scan_backward_workspace_bytes(p));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fa, a); }) == cpu::chunked_forward_workspace_bytes(p));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, ba, a); }) == cpu::chunked_backward_workspace_bytes(p));
        std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / 4);
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fa, a, kept.data()); }) ==
              cpu::chunked_forward_workspace_bytes(p, true));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, ba, a, kept.data()); }) ==
              cpu::chunked_backward_workspace_bytes(p, true));
      }
  }
}

TEST_CASE("delta rule with raw keys through the binary: finite results or a per-case failure", "[delta][cli][spawns]") {
  // normalize_keys false: with |k|^2 ~ D the write (I - beta k k^T) can grow the state without
  // bound (the float64 reference too), so a case may fail its check; it must say so per case and
  // the run must end (exit 1, never a crash, a hang or exit 3), or pass with finite results.
  const auto dir = test::fresh_dir("delta-raw-keys");
  for (const char* seq : {"8", "2048"}) {
    const std::string out = (dir / (std::string("raw-") + seq + ".json")).string();
    const test::ProcessResult r = test::run_process(
        "timeout 300 " + test::binary() + " --suite kernel --rule delta --normalize-keys false --decay none,vector "
        "--impl scan --seq " + seq + " --dim 16 --batch 1 --heads 2 --reps 1 --warmup 0 --min-sample-ms 1 --threads 2 "
        "--out " + out);
    INFO(r.output);
    REQUIRE((r.exit_status == 0 || r.exit_status == 1));
    if (r.exit_status == 1) CHECK(r.output.find("FAILED: non-finite output") != std::string::npos);
    std::ifstream file(out);
    CHECK(file.good());
  }
}

TEST_CASE("delta rule config keys are validated in one line naming where", "[delta][config][spawns]") {
  const std::string unknown_rule = test::config_error("kernel:\n  rule: gated\n");
  INFO(unknown_rule);
  CHECK(unknown_rule.find("suite.yaml:2") != std::string::npos);
  CHECK(unknown_rule.find("gated") != std::string::npos);
  CHECK(unknown_rule.find("additive") != std::string::npos);  // the choices are named
  const std::string not_boolean = test::config_error("kernel:\n  rule: delta\n  normalize_keys: 3\n");
  INFO(not_boolean);
  CHECK(not_boolean.find("suite.yaml:3") != std::string::npos);
  CHECK(not_boolean.find("normalize_keys") != std::string::npos);
  // The layer's linear branch takes every rule (its block, docs/spec.md section 2b); an unknown one is refused there too.
  const std::string layer_rule = test::config_error("suites: [layer]\nlayer:\n  rule: gated\n");
  INFO(layer_rule);
  CHECK(layer_rule.find("suite.yaml:3") != std::string::npos);
  CHECK(layer_rule.find("rule") != std::string::npos);
  CHECK(test::config_error("kernel:\n  rule: [additive, delta]\n  normalize_keys: [true, false]\n").empty());

  // Planned: rule for every decay, recorded in every case; normalize_keys varied for delta only.
  const Config c = parse_config("suites: [kernel]\nkernel:\n  seq: 16\n  dim: 8\n  impl: scan\n  mode: fwd\n"
                                "  decay: [none, vector]\n  rule: [additive, delta]\n  normalize_keys: [true, false]\n",
                                "p.yaml");
  const auto plan = expand_plan(c);
  REQUIRE(plan.size() == 2 * (1 + 2));
  for (const Case& kase : plan) {
    CHECK(kase.options.count("rule") == 1);
    CHECK(kase.options.count("normalize_keys") == (kase.option("rule") == "delta" ? 1u : 0u));
    // Its name shows the options off their default only: a delta case its rule and raw keys, a
    // plain additive case neither.
    const std::string name = case_slug(kase);
    INFO(name);
    CHECK((name.find("-ruledelta") != std::string::npos) == (kase.option("rule") == "delta"));
    CHECK((name.find("normalize_keysfalse") != std::string::npos) == (kase.option("normalize_keys") == "false"));
    CHECK(name.find("ruleadditive") == std::string::npos);
    CHECK(name.find("normalize_keystrue") == std::string::npos);
  }

  // Through the binary: exit 2 with one line.
  const auto dir = test::fresh_dir("delta-config");
  for (const auto& [text, flags] :
       {std::pair<std::string, std::string>{"kernel:\n  rule: gated\n", ""},
        {"kernel:\n  normalize_keys: maybe\n", ""},
        {"suites: [layer]\nlayer:\n  rule: gated\n", ""},
        {"suites: [kernel]\n", "--rule gated"},
        {"suites: [layer]\n", "--rule gated"}}) {
    const auto path = dir / "c.yaml";
    std::ofstream(path) << text;
    const test::ProcessResult r = test::run_process(test::binary() + " --config " + path.string() + " " + flags +
                                                    " --out " + (dir / "o.json").string());
    INFO(text << flags << "\n" << r.output);
    CHECK(r.exit_status == 2);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
}

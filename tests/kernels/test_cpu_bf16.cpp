// bf16 cases on the CPU (kernels/linear_attention/cpu/bf16.hpp): every rule, decay, form and mode
// against the float64 reference within the bf16 tolerance, on dense, grouped, rectangular and packed
// shapes; which variant runs each; the scratch against its closed form; the tensors held at their
// dtype's size; and the reason a CPU without AVX512-BF16 gives.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;

namespace {

// Forces bf16_supported() for a scope.
struct Bf16Override {
  explicit Bf16Override(bool supported) { cpu::set_bf16_override(supported); }
  ~Bf16Override() { cpu::set_bf16_override(std::nullopt); }
  Bf16Override(const Bf16Override&) = delete;
  Bf16Override& operator=(const Bf16Override&) = delete;
};

// Turns the chunked_amx row off for a scope: these tests hold chunked_bf16 to its own checks on
// an AMX host too (tests/kernels/test_amx.cpp tests the AMX row).
struct AmxOff {
  AmxOff() { cpu::set_amx_override(cpu::AmxPath::none); }
  ~AmxOff() { cpu::set_amx_override(std::nullopt); }
  AmxOff(const AmxOff&) = delete;
  AmxOff& operator=(const AmxOff&) = delete;
};

Problem packed(std::vector<int> cu, int heads, int heads_k, int dim, int dim_v, int chunk, Decay decay, Rule rule) {
  Problem p{1, heads, cu.back(), dim, chunk, decay, rule, heads_k, dim_v};
  p.cu_seqlens = std::move(cu);
  return p;
}

// Dense D 64 and 128 (a short last chunk), grouped heads with Dk != Dv, and packed documents
// straddling chunk boundaries (one of a single token).
// With vector gates and the additive rule, RWKV-6's bonus form of each too (docs/spec.md section 1g).
std::vector<Problem> shapes(Decay decay, Rule rule) {
  std::vector<Problem> out = {Problem{1, 2, 150, 64, 64, decay, rule},
                              Problem{1, 2, 200, 128, 128, decay, rule},
                              Problem{2, 4, 75, 32, 32, decay, rule, 2, 64},
                              packed({0, 37, 38, 102, 192}, 2, 1, 32, 64, 32, decay, rule)};
  if (decay != Decay::vector || rule != Rule::additive) return out;
  for (std::size_t i = 0, n = out.size(); i < n; ++i) {
    Problem p = out[i];
    p.bonus = true;
    out.push_back(p);
  }
  return out;
}

// What should run a problem in bf16: the native chunked forward where its row takes the problem,
// else the float32 table's variant behind the converter.
std::string expected_variant(const std::string& form, const Problem& p) {
  const bool native = form == "chunked" && p.rule == Rule::additive && p.decay != Decay::vector &&
                      p.dim % 32 == 0 && p.value_dim() % 32 == 0 && p.chunk % 32 == 0;
  return native ? "chunked_bf16" : cpu::cpu_variant_for(form, p).name + "+bf16cvt";
}

bool skipped_without_bf16() {
  if (cpu::bf16_supported()) return false;
  WARN("SKIPPED: this CPU has no AVX512-BF16: the CPU backend declines bf16 cases");
  return true;
}

}  // namespace

TEST_CASE("bf16 on the CPU: every rule, decay, form and mode within the bf16 tolerance", "[bf16]") {
  const AmxOff amx_off;
  if (skipped_without_bf16()) return;
  double worst_native = 0, worst_converted = 0;
  for (const bool keep : {true, false}) {
    auto backend = make_backend("cpu", BackendOptions{2, 0, keep});
    for (const Rule rule : {Rule::additive, Rule::delta})
      for (const Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector})
        for (const Problem& p : shapes(decay, rule))
          for (const std::string form : {"scan", "chunked"})
            for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
              if (!keep && (form != "chunked" || mode != Mode::fwd_bwd)) continue;
              const Case c = test::kernel_case(p, form, mode, "cpu", "bf16");
              INFO(test::describe(c) << (keep ? "" : " (chunk states recomputed)"));
              REQUIRE_FALSE(backend->unsupported(c));
              const std::string variant = backend->find("linear_attention", form)->variant(c);
              const std::string native_backward = cpu::cpu_variant_for(form, p).name + "+bf16cvt";
              CHECK(variant == (expected_variant(form, p) == "chunked_bf16" && mode == Mode::fwd_bwd
                                    ? "chunked_bf16/" + native_backward
                                    : expected_variant(form, p)));
              const test::Outcome r = test::run_on(*backend, c);
              INFO(test::errors(r.check));
              CHECK(r.check.non_finite.empty());
              CHECK(r.check.passed);
              CHECK(r.check.tolerance == 3e-2);
              double& worst = variant.rfind("chunked_bf16", 0) == 0 ? worst_native : worst_converted;
              worst = std::max(worst, r.check.rel_err);
            }
  }
  // The converted path computes in float32 on exact copies: its error is float32's. The native
  // forward rounds P, S and the decayed keys to bf16: larger, and still far inside the tolerance.
  WARN("bf16 worst rel_err: chunked_bf16 " << worst_native << ", +bf16cvt " << worst_converted);
  CHECK(worst_converted < 1e-4);
  CHECK(worst_native < 1e-2);
}

TEST_CASE("the native bf16 chunked forward's rows: retnet and scalar gates, short chunks, threads", "[bf16]") {
  const AmxOff amx_off;
  if (skipped_without_bf16()) return;
  // Strong scalar gates (gate_norm 1), several thread counts, and a chunk longer than the sequence.
  for (int threads : {1, 2, 3}) {
    auto backend = make_backend("cpu", BackendOptions{threads});
    for (const Problem& p : {Problem{2, 3, 70, 32, 32, Decay::scalar}, Problem{1, 5, 300, 128, 64, Decay::retnet},
                             Problem{1, 1, 20, 64, 256, Decay::none}, Problem{1, 2, 129, 96, 96, Decay::scalar}}) {
      Case c = test::kernel_case(p, "chunked", Mode::fwd, "cpu", "bf16");
      if (p.decay == Decay::scalar) c.options["gate_norm"] = "1";
      INFO(test::describe(c) << " threads " << threads);
      CHECK(backend->find("linear_attention", "chunked")->variant(c) == "chunked_bf16");
      const test::Outcome r = test::run_on(*backend, c);
      INFO(test::errors(r.check));
      CHECK(r.check.passed);
      CHECK(r.check.rel_err < 1e-2);
    }
  }
}

TEST_CASE("bf16 variants' scratch equals their closed forms, and tokens are held at 2 bytes", "[bf16][memory]") {
  const AmxOff amx_off;
  if (skipped_without_bf16()) return;
  omp_set_num_threads(2);
  for (const Problem& p : {Problem{2, 4, 300, 32, 128, Decay::none}, Problem{1, 1, 50, 64, 32, Decay::retnet},
                           Problem{1, 3, 70, 128, 64, Decay::scalar}, Problem{2, 2, 40, 16, 16, Decay::vector},
                           Problem{1, 2, 33, 32, 32, Decay::scalar, Rule::delta},
                           packed({0, 37, 38, 102}, 2, 1, 32, 64, 32, Decay::none, Rule::additive)})
    for (const std::string form : {"scan", "chunked"}) {
      const Case c = test::kernel_case(p, form, Mode::fwd_bwd, "cpu", "bf16");
      INFO(test::describe(c));
      const cpu::CpuBf16Variant v = cpu::cpu_bf16_variant_for(form, p);
      // Written out here: the native forward's per-thread scratch in words (packed K^T, V, K_w, S;
      // S; scores; P; a short chunk's Q; the decays), one per thread up to the items; the
      // converter's widened q, k, v (and dO) beside the float32 variant's own.
      const std::size_t C = p.chunk, Dk = p.dim, Dv = p.value_dim();
      const std::size_t native_thread = Dk / 2 * C + C / 2 * Dv + C / 2 * Dk + Dk / 2 * Dv + Dk * Dv + C * C +
                                        C * C / 2 + C * Dk / 2 + 3 * C;
      const std::size_t threads = std::min<std::size_t>(2, p.slices());
      const cpu::CpuVariant inner = cpu::cpu_variant_for(form, p);
      const std::size_t fwd_cvt = (2 * p.key_elems() + p.value_elems()) * 4, bwd_cvt = (2 * p.key_elems() + 2 * p.value_elems()) * 4;
      if (v.name == "chunked_bf16") {
        CHECK(v.forward_workspace_bytes(p, false) == threads * native_thread * 4);
        CHECK(v.backward_workspace_bytes(p, false) == bwd_cvt + inner.backward_workspace_bytes(p, false));
        CHECK(!v.kept_states_bytes);
      } else {
        CHECK(v.name == inner.name + "+bf16cvt");
        for (bool keep : {false, true}) {
          CHECK(v.forward_workspace_bytes(p, keep) == fwd_cvt + inner.forward_workspace_bytes(p, keep));
          CHECK(v.backward_workspace_bytes(p, keep) == bwd_cvt + inner.backward_workspace_bytes(p, keep));
        }
      }

      // Measured, each call alone: its peak is its closed form, and it frees everything.
      const TensorSet t = make_case_inputs(c, 0);
      const auto bits = [&](const char* name) {
        std::vector<cpu::Bf16> out(t.at(name).data.size());
        std::transform(t.at(name).data.begin(), t.at(name).data.end(), out.begin(), float_to_bf16_bits);
        return out;
      };
      const std::vector<cpu::Bf16> q = bits("q"), k = bits("k"), v16 = bits("v"), dO = bits("dO");
      std::vector<float> o(p.value_elems()), hT(p.state_elems()), dq(p.key_elems()), dk(p.key_elems()),
          dv(p.value_elems()), dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.delta() ? p.beta_elems() : 0);
      const float* g = gated(p.decay) ? t.at("g").data.data() : nullptr;
      const float* beta = p.delta() ? t.at("beta").data.data() : nullptr;
      const cpu::Bf16ForwardArgs fa{q.data(), k.data(), v16.data(), t.at("h0").data.data(), o.data(), hT.data(), g, beta};
      const cpu::Bf16BackwardArgs ba{q.data(),   k.data(),  v16.data(), t.at("h0").data.data(), dO.data(),
                                     t.at("dhT").data.data(), dq.data(), dk.data(), dv.data(), dh0.data(), g,
                                     g ? dg.data() : nullptr, beta, beta ? dbeta.data() : nullptr};
      const auto peak_of = [](auto&& call) {
        CountingAllocator allocator;
        call(allocator);
        CHECK(allocator.live_bytes() == 0);
        return allocator.peak_bytes();
      };
      CHECK(peak_of([&](Allocator& a) { v.forward(p, fa, a, nullptr); }) == v.forward_workspace_bytes(p, false));
      CHECK(peak_of([&](Allocator& a) { v.backward(p, ba, a, nullptr); }) == v.backward_workspace_bytes(p, false));
      if (v.kept_states_bytes && v.kept_states_bytes(p) > 0) {
        std::vector<float> kept(v.kept_states_bytes(p) / 4);
        CHECK(peak_of([&](Allocator& a) { v.forward(p, fa, a, kept.data()); }) == v.forward_workspace_bytes(p, true));
        CHECK(peak_of([&](Allocator& a) { v.backward(p, ba, a, kept.data()); }) == v.backward_workspace_bytes(p, true));
      }

      // Measured: the backend's one fwd_bwd call holds the kept states (where its variant keeps
      // them) and the larger pass; q, k, v and dO at 2 bytes, the rest at 4.
      auto backend = make_backend("cpu", BackendOptions{2});
      const test::Outcome r = test::run_on(*backend, c);
      CHECK(r.check.passed);
      const std::size_t kept = form == "chunked" && v.kept_states_bytes ? v.kept_states_bytes(p) : 0;
      CHECK(r.memory.temp_bytes ==
            kept + std::max(v.forward_workspace_bytes(p, kept > 0), v.backward_workspace_bytes(p, kept > 0)));
      CHECK(r.bwd_states == (form == "scan" ? "" : kept > 0 ? "kept" : "recomputed"));
      const std::size_t gates = p.gate_elems() * 4, betas = p.delta() ? p.beta_elems() * 4 : 0;
      CHECK(r.memory.arg_bytes == (2 * p.key_elems() + 2 * p.value_elems()) * 2 + 2 * p.state_elems() * 4 + gates + betas);
      CHECK(r.memory.out_bytes == (2 * p.key_elems() + 2 * p.value_elems() + 2 * p.state_elems()) * 4 + gates + betas);
      CHECK(backend->find("linear_attention", form)->memory_estimate(c) ==
            r.memory.arg_bytes + r.memory.out_bytes + r.memory.temp_bytes);
    }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("without AVX512-BF16 the CPU declines bf16 cases with the reason", "[bf16]") {
  const Bf16Override without(false);
  auto backend = make_backend("cpu", BackendOptions{1});
  for (const std::string form : {"scan", "chunked"}) {
    const Case c = test::kernel_case(Problem{1, 2, 64, 128, 64, Decay::none}, form, Mode::fwd, "cpu", "bf16");
    REQUIRE(backend->unsupported(c));
    CHECK_THAT(*backend->unsupported(c), Contains("AVX512-BF16"));
    CHECK_FALSE(cpu::chunked_bf16_limits(Problem{1, 2, 64, 128, 64, Decay::none}) == std::nullopt);
  }
  // float32 cases are not affected.
  CHECK_FALSE(backend->unsupported(test::kernel_case(Problem{1, 2, 64, 128, 64, Decay::none}, "chunked", Mode::fwd)));
}

TEST_CASE("the CPU's other ops decline bf16, saying where it runs", "[bf16]") {
  auto backend = make_backend("cpu", BackendOptions{1});
  Case c = test::window_case(Problem{1, 1, 32, 16, 1, Decay::none}, 8, Mode::fwd);
  c.dtype = "bf16";
  REQUIRE(backend->unsupported(c));
  CHECK_THAT(*backend->unsupported(c), Contains("float32 only") && Contains("linear_attention scan and chunked"));
}

TEST_CASE("bf16: RWKV-6's bonus and DeltaProduct run on the float32 rows behind the converter", "[bf16]") {
  // No native bf16 row takes either form (their tables decline them), so every bf16 case of them is
  // the float32 kernel on the bf16-rounded inputs: float32's error against the reference on the
  // same inputs. Those rows need no AVX512-BF16, so the test forces the support on any CPU.
  const AmxOff amx_off;
  const Bf16Override force(true);
  auto backend = make_backend("cpu", BackendOptions{2});
  std::vector<Problem> problems;
  for (Problem p : {Problem{1, 2, 150, 64, 64, Decay::vector}, Problem{2, 4, 75, 32, 32, Decay::vector, Rule::additive, 2, 64},
                    packed({0, 37, 38, 102}, 2, 1, 32, 64, 32, Decay::vector, Rule::additive)}) {
    p.bonus = true;
    problems.push_back(p);
  }
  for (Problem p : {Problem{1, 2, 70, 32, 64, Decay::scalar, Rule::delta}, Problem{1, 2, 45, 64, 32, Decay::vector, Rule::delta},
                    packed({0, 20, 21, 60}, 2, 1, 32, 16, 32, Decay::none, Rule::delta)}) {
    p.householder = 2;
    problems.push_back(p);
  }
  for (const Problem& p : problems)
    for (const std::string form : {"scan", "chunked"})
      for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        const Case c = test::kernel_case(p, form, mode, "cpu", "bf16");
        INFO(test::describe(c));
        REQUIRE_FALSE(backend->unsupported(c));
        const std::string variant = backend->find("linear_attention", form)->variant(c);
        CHECK(variant == cpu::cpu_variant_for(form, p).name + "+bf16cvt");
        const test::Outcome r = test::run_on(*backend, c);
        INFO(test::errors(r.check));
        CHECK(r.check.passed);
        CHECK(r.check.rel_err < 1e-4);
      }
}

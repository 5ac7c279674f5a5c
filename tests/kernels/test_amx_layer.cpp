// The layer's bf16 cases on AMX tiles (kernels/layer/cpu/products.hpp, amx_products.cpp): run by
// lattn_amx_tests (test_amx.cpp's main) on the emulated tiles everywhere and on the CPU's under
// --hardware.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "kernels/cpu/amx.hpp"
#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/layer/block/cpu.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"
#include "amx_tests.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;
using amx_tests::hardware_run;
using amx_tests::tested_path;
namespace amx = lattn::cpu::amx;

// ---- The layer's bf16 cases on AMX tiles (kernels/layer/cpu/products.hpp) ----

namespace {

Case bf16_layer_case(const LayerProblem& p, Mode mode) {
  Case c = test::layer_case(p, mode);
  c.dtype = "bf16";
  return c;
}

// The scratch a bf16 layer call allocates by the closed forms (hybrid/cpu.hpp, block/cpu.hpp).
std::size_t bf16_layer_scratch(const LayerProblem& p, Mode mode) {
  const bool back = mode == Mode::fwd_bwd;
  if (p.modern())
    return back ? cpu::block_forward_backward_bf16_workspace_bytes(p) : cpu::block_forward_bf16_workspace_bytes(p);
  return back ? cpu::layer_forward_backward_bf16_workspace_bytes(p) : cpu::layer_forward_bf16_workspace_bytes(p);
}

// The hybrid block: head dims 32 (the chunked branch on chunked_amx) and 16 (scan), ragged T (a
// short last chunk, T not a multiple of 16), windows shorter and longer than T, decays none and
// retnet; the modern block: block_test_shapes() (GDN, KDA, Mamba2, the KDA and scalar-gated kernels
// in the hybrid block, the retnet decay with the gated norm) and a Mamba2 block of head dim 32 (its
// chunked branch on chunked_amx). The layer takes no grouped heads (Q, K and V are all M x M).
std::vector<LayerProblem> bf16_layer_shapes() {
  std::vector<LayerProblem> shapes = {
      {{1, 2, 37, 32, 32, Decay::none}, 8, true},   {{2, 1, 45, 32, 32, Decay::retnet}, 64, true},
      {{1, 2, 19, 16, 16, Decay::none}, 4, false},  {{2, 2, 9, 8, 16, Decay::retnet}, 1, false},
      {{1, 2, 37, 32, 32, Decay::scalar, Rule::additive}, 1, true, true, LayerBlock{4, true, true, false, 0}},
  };
  for (LayerProblem p : test::block_test_shapes())
    for (const bool chunked : {false, true}) {
      if (p.linear.seq == 1) continue;
      p.chunked = chunked;
      shapes.push_back(p);
    }
  return shapes;
}

}  // namespace

TEST_CASE("amx layer: bf16 hybrid and modern blocks, fwd and fwd_bwd, within the layer's bf16 tolerance", "[amx]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  const ImplRow* rows[2] = {backend->find("layer", "scan"), backend->find("layer", "chunked")};
  std::map<std::string, double> worst;  // per block and mode
  int ran = 0, declined = 0;
  for (const LayerProblem& p : bf16_layer_shapes())
    for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      const Case c = bf16_layer_case(p, mode);
      INFO(test::describe(c) << (p.modern() ? " (modern block)" : " (hybrid block)") << " on the "
                             << (hardware_run ? "hardware's" : "emulated") << " tiles");
      const ImplRow& row = *rows[p.chunked ? 1 : 0];
      if (const std::optional<std::string> why = backend->unsupported(c)) {
        // Only a chunked branch that no AMX row takes: chunked_amx wants dims multiples of 32.
        INFO(*why);
        CHECK(p.chunked);
        CHECK(p.linear.rule == Rule::additive);
        CHECK(p.linear.decay != Decay::vector);
        CHECK(p.linear.dim % 32 != 0);
        CHECK_THAT(*why, Contains("AMX tiles only") && Contains("chunked_amx"));
        ++declined;
        continue;
      }
      const std::string linear = p.chunked ? cpu::layer_amx_linear(p).name : "";
      CHECK(row.variant(c) == (p.chunked ? "products amx, linear " + linear : std::string("products amx")));
      if (p.chunked)
        CHECK(linear == (p.linear.delta() ? "chunked_amx_delta"
                         : p.linear.decay == Decay::vector ? "chunked_amx_gated"
                                                           : "chunked_amx"));
      const test::Outcome r = test::run_on(*backend, c);
      INFO(test::errors(r.check));
      CHECK(r.check.non_finite.empty());
      CHECK(r.check.passed);
      CHECK(r.check.tolerance == 5e-2);
      // The scratch the call allocated is what the closed form says; the AMX rows keep no states.
      CHECK(r.memory.temp_bytes == bf16_layer_scratch(p, mode));
      if (p.chunked && mode == Mode::fwd_bwd) CHECK(r.bwd_states == "recomputed");
      double& w = worst[std::string(p.modern() ? "modern " : "hybrid ") + (p.chunked ? "chunked " : "scan ") +
                        to_string(mode)];
      w = std::max(w, r.check.rel_err);
      ++ran;
    }
  for (const auto& [kind, err] : worst) WARN("bf16 layer " << kind << " worst rel_err " << err);
  CHECK(worst.size() == 8);
  CHECK(declined > 0);
  CHECK(ran > declined);
}

TEST_CASE("amx layer: amx_product against float64 products of the bf16-rounded operands", "[amx]") {
  omp_set_num_threads(2);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const int m = 45, n = 37, k = 70;  // none a multiple of 16
      std::vector<float> A(std::size_t(m) * k), B(std::size_t(k) * n), C(std::size_t(m) * n, 1.0f);
      fill_normal(A, 1, 1);
      fill_normal(B, 1, 2);
      const int lda = ta ? m : k, ldb = tb ? k : n;
      CountingAllocator allocator;
      cpu::amx_product(ta, tb, m, n, k, A.data(), lda, B.data(), ldb, 0.5f, C.data(), n, allocator);
      CHECK(allocator.live_bytes() == 0);
      CHECK(allocator.peak_bytes() == cpu::amx_product_bytes(m, n, k));
      double worst = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double sum = 0.5, size = 0;
          for (int l = 0; l < k; ++l) {
            const double a = bf16_bits_to_float(float_to_bf16_bits(ta ? A[std::size_t(l) * lda + i] : A[std::size_t(i) * lda + l]));
            const double b = bf16_bits_to_float(float_to_bf16_bits(tb ? B[std::size_t(j) * ldb + l] : B[std::size_t(l) * ldb + j]));
            sum += a * b;
            size += std::abs(a * b);
          }
          worst = std::max(worst, std::abs(C[std::size_t(i) * n + j] - sum) / (size + 0.5));
        }
      INFO("trans_a " << ta << " trans_b " << tb);
      CHECK(worst < 1e-6);  // float32 accumulation of exact bf16 products
    }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("amx layer: without AMX-BF16 a bf16 layer case declines with the reason", "[amx]") {
  auto backend = make_backend("cpu", BackendOptions{2});
  const LayerProblem hybrid{{1, 2, 37, 32, 32, Decay::none}, 8, true};
  LayerProblem modern = test::block_test_shapes().front();
  for (const LayerProblem& p : {hybrid, modern})
    for (const Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      const Case c = bf16_layer_case(p, mode);
      INFO(test::describe(c));
      // Turned off as on a CPU without AMX: declined with that reason, float32 cases unchanged.
      cpu::set_amx_override(cpu::AmxPath::none);
      const std::optional<std::string> off = backend->unsupported(c);
      REQUIRE(off);
      CHECK_THAT(*off, Contains("AMX tiles only") && Contains("AMX turned off"));
      Case f32 = c;
      f32.dtype = "float32";
      CHECK_FALSE(backend->unsupported(f32));
      // The CPU's own answer: declined where amx::hardware_refusal() says why, run otherwise.
      cpu::set_amx_override(std::nullopt);
      const std::optional<std::string> own = backend->unsupported(c);
      if (const auto& why = amx::hardware_refusal()) {
        REQUIRE(own);
        CHECK_THAT(*own, Contains(*why));
      } else {
        CHECK_FALSE(own);
      }
      cpu::set_amx_override(tested_path());
    }
}

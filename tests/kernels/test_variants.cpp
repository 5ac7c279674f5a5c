// The CPU variant tables (kernels/linear_attention/cpu/variants.cpp): which variant each (rule,
// decay) of each form runs, that the backend's rows name it, and that a problem no row takes is
// refused with the table's reason rather than run by another variant.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>

#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "src/run/backend.hpp"
#include "cases.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;

namespace {

// The variant each form should run, by the kernels' own files: the rule first, then the decay,
// then whether the AVX-512 register tiles are active.
std::string expected_variant(const std::string& form, Rule rule, Decay decay) {
  if (rule == Rule::dplr) return form + "_dplr";
  if (rule == Rule::trapezoidal) return form + "_trapezoidal";
  if (form == "scan") return rule == Rule::delta ? "scan_delta" : "scan_columns";
  if (rule == Rule::delta) return "chunked_delta";
  if (gated(decay)) return "chunked_gated";
  return cpu::tiles_active() ? "chunked_tiled" : "chunked_blas";
}

}  // namespace

TEST_CASE("each form's table runs every rule and decay with the variant written for it", "[variants]") {
  auto backend = make_backend("cpu", BackendOptions{1});
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (const std::string form : {"scan", "chunked"})
      for (const std::string& rule_name : rule_names())
        for (const std::string& decay_name : decay_names()) {
          const Problem p{1, 2, 24, 16, 8, decay_from(decay_name), rule_from(rule_name)};
          INFO(cpu::to_string(vec) << " " << form << " " << test::describe(p));
          std::string why;
          const cpu::CpuVariant* v = cpu::cpu_variant(form, p, &why);
          if (p.trapezoidal() && p.decay != Decay::scalar) {  // scalar gates only (docs/spec.md section 1e)
            CHECK(v == nullptr);
            CHECK_THAT(why, Contains("decay scalar only"));
            continue;
          }
          REQUIRE(v != nullptr);
          CHECK(v->name == expected_variant(form, p.rule, p.decay));
          const Case c = test::kernel_case(p, form, Mode::fwd_bwd);
          CHECK_FALSE(backend->unsupported(c));
          CHECK(backend->variant(c) == v->name);
        }
  }
}

TEST_CASE("a problem no variant takes is refused with the table's reason", "[variants]") {
  // The chunked table without its gated row: the gated decays are then taken by no row.
  std::vector<cpu::CpuVariant> table;
  for (const cpu::CpuVariant& v : cpu::cpu_variants("chunked"))
    if (v.name != "chunked_gated") table.push_back(v);
  REQUIRE(table.size() + 1 == cpu::cpu_variants("chunked").size());
  const Problem gated_problem{1, 1, 16, 8, 8, Decay::vector, Rule::additive};
  std::string why;
  CHECK(choose_variant(table, gated_problem, "CPU chunked", &why) == nullptr);
  CHECK_THAT(why, Contains("no CPU chunked variant takes rule additive, decay vector"));
  CHECK_THAT(why, Contains("chunked_delta (rule delta only)"));
  CHECK_THAT(why, Contains("chunked_tiled (decay none, retnet only)"));
  CHECK_THAT(why, Contains("chunked_blas (decay none, retnet only)"));
  // Without a reason asked for, the same answer.
  CHECK(choose_variant(table, gated_problem, "CPU chunked", nullptr) == nullptr);
  // The untrimmed table takes it.
  CHECK(cpu::cpu_variant("chunked", gated_problem) != nullptr);

  // A form the op does not have is an empty table: refused, never a fall-through.
  CHECK(cpu::cpu_variant("no_such_form", gated_problem, &why) == nullptr);
  CHECK_THAT(why, Contains("the table is empty"));
  CHECK_THROWS_WITH(cpu::cpu_variant_for("no_such_form", gated_problem), Contains("no CPU no_such_form variant"));
}

TEST_CASE("a variant's limits refuse a problem with their own reason", "[variants]") {
  // chunked_tiled takes the ungated additive problems only where the AVX-512 tiles are active;
  // chunked_blas only where they are not: exactly one of them runs it at any vector width.
  const Problem p{1, 1, 16, 8, 8, Decay::none, Rule::additive};
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    INFO(cpu::to_string(vec));
    const auto& table = cpu::cpu_variants("chunked");
    int takers = 0;
    for (const cpu::CpuVariant& v : table)
      if (v.name == "chunked_tiled" || v.name == "chunked_blas") {
        const auto refused = variant_refusal(v.takes, p);
        takers += !refused;
        if (refused && v.name == "chunked_tiled") CHECK_THAT(*refused, Contains("register tiles are not active"));
        if (refused && v.name == "chunked_blas") CHECK_THAT(*refused, Contains("chunked_tiled runs"));
      }
    CHECK(takers == 1);
  }
}

namespace {

// A toy variant, registered through the table as docs/adding-a-kernel.md says a new kernel is: the
// additive rule with the ungated decays, token by token in float32, for dim <= 16 only (its
// shape key). The test table below runs it against the float64 reference.
constexpr int kToyMaxDim = 16;

std::optional<std::string> toy_limits(const Problem& p) {
  if (p.dim <= kToyMaxDim) return std::nullopt;
  return "toy_scan takes dim <= " + std::to_string(kToyMaxDim);
}

void toy_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float*) {
  const int T = p.seq, D = p.dim;
  const float s = float(attention_scale(D));
  Workspace<float> state(allocator, p.head_state_elems());
  float* S = state.data();
  for (int bh = 0; bh < int(p.heads_total()); ++bh) {
    const float gamma = float(decay_gamma(p.decay, bh % p.heads));
    const std::size_t tok = std::size_t(bh) * p.head_token_elems(), st = std::size_t(bh) * p.head_state_elems();
    std::copy(a.h0 + st, a.h0 + st + p.head_state_elems(), S);
    for (int t = 0; t < T; ++t) {
      const float *k = a.k + tok + std::size_t(t) * D, *v = a.v + tok + std::size_t(t) * D, *q = a.q + tok + std::size_t(t) * D;
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) S[i * D + j] = gamma * S[i * D + j] + k[i] * v[j];
      for (int j = 0; j < D; ++j) {
        float o = 0;
        for (int i = 0; i < D; ++i) o += S[i * D + j] * q[i];
        a.o[tok + std::size_t(t) * D + j] = s * o;
      }
    }
    std::copy(S, S + p.head_state_elems(), a.hT + st);
  }
}

// docs/spec.md section 1's reverse recurrence, with every S_t kept (T + 1 states of one head).
void toy_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float*) {
  const int T = p.seq, D = p.dim;
  const std::size_t DD = p.head_state_elems();
  const float s = float(attention_scale(D));
  Workspace<float> states(allocator, (std::size_t(T) + 1) * DD + DD);
  float* G = states.data() + (std::size_t(T) + 1) * DD;
  for (int bh = 0; bh < int(p.heads_total()); ++bh) {
    const float gamma = float(decay_gamma(p.decay, bh % p.heads));
    const std::size_t tok = std::size_t(bh) * p.head_token_elems(), st = std::size_t(bh) * DD;
    const auto row = [&](const float* base, int t) { return base + tok + std::size_t(t) * D; };
    float* S = states.data();
    std::copy(a.h0 + st, a.h0 + st + DD, S);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j)
          S[(t + 1) * DD + i * D + j] = gamma * S[t * DD + i * D + j] + row(a.k, t)[i] * row(a.v, t)[j];
    std::copy(a.dhT + st, a.dhT + st + DD, G);
    for (int t = T - 1; t >= 0; --t) {
      const float *q = row(a.q, t), *dO = row(a.dO, t), *k = row(a.k, t), *v = row(a.v, t);
      if (t < T - 1)
        for (std::size_t m = 0; m < DD; ++m) G[m] *= gamma;
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) G[i * D + j] += s * q[i] * dO[j];
      for (int i = 0; i < D; ++i) {
        float dq = 0, dk = 0, dv = 0;
        for (int j = 0; j < D; ++j) {
          dq += S[(t + 1) * DD + i * D + j] * dO[j];
          dk += G[i * D + j] * v[j];
          dv += G[j * D + i] * k[j];
        }
        a.dq[tok + std::size_t(t) * D + i] = s * dq;
        a.dk[tok + std::size_t(t) * D + i] = dk;
        a.dv[tok + std::size_t(t) * D + i] = dv;
      }
    }
    for (std::size_t m = 0; m < DD; ++m) a.dh0[st + m] = gamma * G[m];
  }
}

cpu::CpuVariant toy_variant() {
  return {"toy_scan", {{Rule::additive}, {Decay::none, Decay::retnet}, toy_limits}, toy_forward, toy_backward,
          [](const Problem& p, bool) { return p.head_state_elems() * sizeof(float); },
          [](const Problem& p, bool) { return (std::size_t(p.seq) + 2) * p.head_state_elems() * sizeof(float); }};
}

// Registers the toy for one scope.
struct ToyRegistered {
  ToyRegistered() { cpu::add_cpu_variant("scan", toy_variant()); }
  ~ToyRegistered() { cpu::remove_cpu_variant("scan", "toy_scan"); }
};

}  // namespace

TEST_CASE("a variant registered through the table runs the cases it takes, and only those", "[variants][toy]") {
  const ToyRegistered toy;
  auto backend = make_backend("cpu", BackendOptions{1});
  int ran_by_toy = 0;
  for (const Problem& p : test::kernel_test_shapes()) {
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      const Case c = test::kernel_case(p, "scan", mode);
      INFO(test::describe(c));
      const bool toy_takes = p.rule == Rule::additive && !gated(p.decay) && p.dim <= kToyMaxDim;
      REQUIRE_FALSE(backend->unsupported(c));
      CHECK((backend->variant(c) == "toy_scan") == toy_takes);
      if (!toy_takes) continue;
      const test::Outcome out = test::run_on(*backend, c);
      INFO(test::errors(out.check));
      CHECK(out.check.passed);
      ++ran_by_toy;
    }
  }
  // The test shapes hold dims over the toy's limit and the gated decays, and the toy ran the rest.
  CHECK(ran_by_toy > 0);
  // Its limit is its own reason when it refuses.
  const Problem wide{1, 1, 8, kToyMaxDim + 1, 8, Decay::none, Rule::additive};
  CHECK(variant_refusal(toy_variant().takes, wide) == "toy_scan takes dim <= 16");
  CHECK(cpu::cpu_variant("scan", wide)->name == "scan_columns");
}

TEST_CASE("the toy variant is gone from the table once its test ends", "[variants][toy]") {
  for (const cpu::CpuVariant& v : cpu::cpu_variants("scan")) CHECK(v.name != "toy_scan");
}

namespace {

// A toy decay, added as docs/adding-a-kernel.md's steps for a new decay say: its name and its
// mathematics (a fixed gamma_h per head, which the float64 reference reads through decay_gamma),
// then a kernel (toy_forward and toy_backward above, which read decay_gamma too) and one variant
// row naming it. gamma_h = 1 - 1 / (h + 3): 2/3, 3/4, ... (retnet's are 1 - 2^(-5-h)).
double toy_gamma(int head) { return 1.0 - 1.0 / (head + 3); }

Decay toy_decay() { return add_fixed_decay("toy_fixed", toy_gamma); }

cpu::CpuVariant toy_decay_variant() {
  cpu::CpuVariant v = toy_variant();
  v.name = "toy_fixed_scan";
  v.takes.decays = {toy_decay()};
  return v;
}

}  // namespace

TEST_CASE("a decay added through the table: skipped with the table's reason until a variant row takes it",
          "[variants][toy]") {
  const Decay toy = toy_decay();
  CHECK(to_string(toy) == "toy_fixed");
  CHECK(decay_from("toy_fixed") == toy);
  CHECK(add_fixed_decay("toy_fixed", toy_gamma) == toy);  // added once
  CHECK(decay_gamma(toy, 1) == Approx(0.75));
  CHECK_FALSE(gated(toy));

  auto backend = make_backend("cpu", BackendOptions{1});
  const Problem p{2, 3, 21, 8, 8, toy, Rule::additive};
  for (const std::string form : {"scan", "chunked"}) {
    const Case c = test::kernel_case(p, form, Mode::fwd_bwd);
    INFO(test::describe(c));
    // No built-in row names it: each form's table refuses it, naming every row's reason.
    const std::optional<std::string> why = backend->unsupported(c);
    REQUIRE(why.has_value());
    CHECK_THAT(*why, Contains("no CPU " + form + " variant takes rule additive, decay toy_fixed"));
    CHECK_THAT(*why, Contains(form == "scan" ? "scan_columns (decay none, retnet, scalar, vector only)"
                                             : "chunked_gated (decay scalar, vector only)"));
  }

  // One row in the scan table, and the test shapes' additive cases of dim <= 16 run with the toy
  // decay, held to the float64 reference (which takes the decay's gamma_h per head).
  cpu::add_cpu_variant("scan", toy_decay_variant());
  int ran = 0;
  for (const Problem& shape : test::kernel_test_shapes()) {
    if (shape.rule != Rule::additive || shape.decay != Decay::none || shape.dim > kToyMaxDim) continue;
    Problem q = shape;
    q.decay = toy;
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      const Case c = test::kernel_case(q, "scan", mode);
      INFO(test::describe(c));
      REQUIRE_FALSE(backend->unsupported(c));
      CHECK(backend->variant(c) == "toy_fixed_scan");
      const test::Outcome out = test::run_on(*backend, c);
      INFO(test::errors(out.check));
      CHECK(out.check.passed);
      ++ran;
    }
  }
  // The chunked table still has no row for it.
  CHECK(backend->unsupported(test::kernel_case(p, "chunked", Mode::fwd)).has_value());
  cpu::remove_cpu_variant("scan", "toy_fixed_scan");
  CHECK(ran > 0);
  CHECK(backend->unsupported(test::kernel_case(p, "scan", Mode::fwd)).has_value());
}

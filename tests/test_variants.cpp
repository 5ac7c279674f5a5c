// The CPU variant tables (kernels/linear_attention/cpu_variants.cpp): which variant each (rule,
// decay) of each form runs, that the backend's rows name it, and that a problem no row takes is
// refused with the table's reason rather than run by another variant.
#include <catch2/catch.hpp>

#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/cpu_variants.hpp"
#include "src/backend.hpp"
#include "cases.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;

namespace {

// The variant each form should run, by the kernels' own files: the rule first, then the decay,
// then whether the AVX-512 register tiles are active.
std::string expected_variant(const std::string& form, Rule rule, Decay decay) {
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

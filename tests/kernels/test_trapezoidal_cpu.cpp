// The CPU's trapezoidal rows (kernels/linear_attention/cpu/trapezoidal.cpp: scan_trapezoidal on
// scan_columns, chunked_trapezoidal on chunked_gated) against the float64 reference, every output
// and gradient (o, hT, dq, dk, dv, dh0, dg, ddt, dtrap), at every vector width, weak and strong
// gates, MIMO ranks 1, 2 and 4, grouped heads, rectangular states and packed documents; and their
// scratch against the closed form they report.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/trapezoidal.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "src/run/counting_allocator.hpp"
#include "test_util.hpp"
#include "trapezoidal_cases.hpp"

using namespace lattn;

namespace {

std::string describe_shape(const Problem& p) {
  return test::describe(p) + " rank " + std::to_string(p.rank) + " heads_k " + std::to_string(p.qk_heads()) +
         " dim_v " + std::to_string(p.value_dim()) + " documents " + std::to_string(p.sequences());
}

}  // namespace

TEST_CASE("the trapezoidal rule runs on its own CPU rows", "[trapezoidal][cpu]") {
  for (const Problem& p : test::trapezoidal_test_shapes()) {
    INFO(describe_shape(p));
    CHECK(cpu::cpu_variant_for("scan", p).name == "scan_trapezoidal");
    CHECK(cpu::cpu_variant_for("chunked", p).name == "chunked_trapezoidal");
    // The inner problem: R rows per token, the documents R times as long.
    const Problem in = cpu::trapezoidal_inner(p);
    CHECK(in.rule == Rule::additive);
    CHECK(in.seq == p.seq * p.rank);
    CHECK(in.value_elems() == p.value_elems());
    CHECK(in.key_elems() == p.key_elems());
  }
}

TEST_CASE("the CPU trapezoidal rows match the float64 reference", "[trapezoidal][cpu]") {
  const cpu::Vec active = cpu::active_vec();
  const std::vector<Problem> shapes = test::trapezoidal_test_shapes();
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (const std::string impl : {"scan", "chunked"})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd})
        for (const char* gate_norm : {"16", "1"})
          for (const cpu::Vec vec : cpu::available_vecs()) {
            if (vec != active && i % 3 != 0) continue;  // every width on every third shape
            const test::VecOverride force(vec);
            const Case kase = test::trapezoidal_case(shapes[i], gate_norm, impl, mode);
            INFO(describe_shape(shapes[i]) << " " << impl << " " << to_string(mode) << " gate_norm " << gate_norm << " "
                                           << cpu::to_string(vec));
            const CheckResult check = test::run_cpu_case(kase, 2);
            INFO(test::errors(check));
            CHECK(check.non_finite.empty());
            CHECK(check.passed);
            CHECK(check.rel_err < 1e-5);
            if (mode == Mode::fwd_bwd)
              for (const char* name : {"dq", "dk", "dv", "dh0", "dg", "ddt", "dtrap"}) CHECK(check.per_output.count(name) == 1);
          }
}

TEST_CASE("the CPU trapezoidal rows' scratch equals their closed form", "[trapezoidal][cpu][memory]") {
  for (const Problem& p : test::trapezoidal_test_shapes()) {
    INFO(describe_shape(p));
    const Case kase = test::trapezoidal_case(p, "1", "scan", Mode::fwd_bwd);
    const TensorSet t = make_case_inputs(kase, 0);
    std::vector<float> o(p.value_elems()), hT(p.state_elems()), dq(p.key_elems()), dk(p.key_elems()),
        dv(p.value_elems()), dh0(p.state_elems()), dg(p.gate_elems()), ddt(p.beta_elems()), dtrap(p.beta_elems());
    ForwardArgs<float> fa{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data(), t.data("g")};
    fa.dt = t.data("dt"), fa.trap = t.data("trap");
    BackwardArgs<float> ba{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), t.data("dO"), t.data("dhT"),
                           dq.data(),   dk.data(),   dv.data(),   dh0.data(),   t.data("g"),  dg.data()};
    ba.dt = fa.dt, ba.trap = fa.trap, ba.ddt = ddt.data(), ba.dtrap = dtrap.data();
    const auto peak_of = [](auto&& call) {
      CountingAllocator allocator;
      call(allocator);
      CHECK(allocator.live_bytes() == 0);
      return allocator.peak_bytes();
    };
    CHECK(peak_of([&](Allocator& a) { cpu::scan_forward(p, fa, a); }) == cpu::scan_forward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::scan_backward(p, ba, a); }) == cpu::scan_backward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fa, a); }) == cpu::chunked_forward_workspace_bytes(p));
    CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, ba, a); }) == cpu::chunked_backward_workspace_bytes(p));
  }
}

TEST_CASE("the CPU trapezoidal rows run bf16 tokens through the converter", "[trapezoidal][cpu][bf16]") {
  // No bf16 row of its own takes the rule: the float32 rows run behind the converter, which widens
  // q, k, v and dO and hands dt and trap on as they are. Forced on where the CPU lacks AVX512-BF16
  // (the converter's widening is plain code), so that the path is checked on every host.
  cpu::set_bf16_override(true);
  const std::vector<Problem> shapes = test::trapezoidal_test_shapes();
  for (std::size_t i = 0; i < shapes.size(); i += 2)
    for (const std::string impl : {"scan", "chunked"})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        const Case kase = test::trapezoidal_case(shapes[i], "1", impl, mode, "cpu", "bf16");
        INFO(describe_shape(shapes[i]) << " " << impl << " " << to_string(mode));
        const CheckResult check = test::run_cpu_case(kase, 2);
        INFO(test::errors(check));
        CHECK(check.non_finite.empty());
        CHECK(check.passed);
      }
  cpu::set_bf16_override(std::nullopt);
}

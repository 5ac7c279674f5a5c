// Every code path of the CPU kernels against the float64 reference: each vector width this build
// and CPU have (the scan's AVX-512 / AVX2 / portable passes; chunked's tiled AVX-512 products and
// its OpenBLAS form), thread splits over heads and over one head's state columns, ragged column
// tails (D not a multiple of the vector or tile width) and ragged token tails (T not a multiple
// of the tokens per pass, of the token tile or of the chunk).
#include <catch2/catch.hpp>

#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::vector<Problem> path_shapes() {
  std::vector<Problem> shapes;
  // Gated decays too: the scan pass's gate per token, per row and per column at every width and
  // ragged tail; the gated chunked form's sub-chunks (ragged at 40, 97, 131 rows) and its
  // portable tile products where the AVX-512 tiles are not active.
  for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
    shapes.push_back({1, 1, 1, 3, 4, decay});         // one token
    shapes.push_back({1, 2, 7, 17, 4, decay});        // D = 16 + 1 (a ragged block of two registers), T < 8
    shapes.push_back({1, 1, 70, 80, 32, decay});      // three column blocks (32, 32, 16), T past two token tiles
    shapes.push_back({1, 2, 52, 64, 16, decay});      // D = 64: two full blocks, 52 tokens past one tile of 48
    shapes.push_back({2, 1, 45, 33, 16, decay});      // D = 32 + 1, ragged chunk
    shapes.push_back({1, 1, 131, 48, 128, decay});    // ragged last chunk of 3 rows, D = 1.5 panels
    shapes.push_back({1, 1, 97, 64, 40, decay});      // chunk not a multiple of the 8-row tile
    shapes.push_back({1, 2, 66, 128, 64, decay});     // D = 128: four column blocks, four panels
    shapes.push_back({2, 1, 50, 32, 16, decay});      // D = 32: one full-width column block, 50 tokens = 8 groups of 6 + 2
  }
  return shapes;
}

}  // namespace

TEST_CASE("every vector width of scan and chunked matches the float64 reference", "[paths]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    for (const Problem& p : path_shapes()) {
      for (const std::string impl : {"scan", "chunked"}) {
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          INFO(cpu::to_string(vec) << " " << impl << " " << to_string(mode) << " " << test::describe(p)
                                   << (impl == "chunked" ? (cpu::chunked_uses_tiles() ? " tiled" : " blas") : ""));
          const CheckResult check = test::run_cpu_case(p, impl, mode, 2);
          for (const auto& [name, err] : check.per_output) INFO(name << " rel_err " << err);
          CHECK(check.passed);
          CHECK(check.rel_err < 1e-5);
        }
      }
    }
  }
}

TEST_CASE("thread splits over heads and over one head's columns give the reference answer", "[paths][threads]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    // B*H = 1 and 3 with up to 4 threads: fewer heads than threads, so the scan splits one
    // head's state columns (D = 100: four blocks on AVX-512, seven on AVX2, two generic; D = 64:
    // as many blocks as threads on AVX-512 at 2, fewer at 3 and 4).
    // Gated: one head's columns split over threads with vector gates (each thread its own key
    // channels) and scalar gates (dg summed over every channel after the passes).
    for (const Problem& p : {Problem{1, 1, 50, 100, 16, Decay::retnet}, Problem{3, 1, 41, 40, 16, Decay::none},
                             Problem{1, 1, 50, 64, 16, Decay::none}, Problem{1, 1, 50, 100, 16, Decay::vector},
                             Problem{1, 1, 61, 64, 16, Decay::scalar}, Problem{3, 1, 41, 40, 16, Decay::vector}}) {
      for (int threads : {1, 2, 3, 4}) {
        for (const std::string impl : {"scan", "chunked"}) {
          INFO(cpu::to_string(vec) << " threads " << threads << " " << impl << " " << test::describe(p));
          CHECK(test::run_cpu_case(p, impl, Mode::fwd_bwd, threads).rel_err < 1e-5);
        }
      }
    }
  }
}

TEST_CASE("scan gives the same answer on one thread and on several", "[scan][threads]") {
  const Problem p{1, 3, 50, 16, 16, Decay::retnet};
  for (int threads : {1, 2, 3}) {
    INFO("threads " << threads);
    CHECK(test::run_cpu_case(p, "scan", Mode::fwd_bwd, threads).rel_err < 1e-5);
  }
}

// The trapezoidal rule's test shapes and cases (docs/spec.md section 1e): the kernel suite's and
// the decode suite's, for tests/op_table.hpp and the rule's own tests. Its own header, beside
// cases.hpp: the cases carry the rule's mimo_rank key.
#pragma once

#include <string>
#include <vector>

#include "cases.hpp"

namespace lattn::test {

// Shapes every test of the trapezoidal rule covers (docs/spec.md section 1e, scalar gates only): MIMO
// ranks 1, 2 and 4; T = 1, T < C, T not a multiple of C, C = 1, odd D, D = 128; grouped heads, a
// rectangular state and packed documents (one of a single token).
inline std::vector<Problem> trapezoidal_test_shapes() {
  std::vector<Problem> shapes;
  for (int rank : {1, 2, 4}) {
    const auto add = [&](Problem p) {
      p.decay = Decay::scalar;
      p.rule = Rule::trapezoidal;
      p.rank = rank;
      shapes.push_back(p);
    };
    // T = 1, D = 1: one state element per head. With R > 1 it is the sum of R writes and the decayed
    // h0, which can cancel to any size (seed 5 leaves it 500 times below its terms at R 2), and the
    // relative error of one number is then float32's rounding times that ratio: two heads there.
    add({1, rank > 1 ? 2 : 1, 1, 1, 4});
    add({2, 3, 20, 8, 64});    // T < C
    add({1, 4, 100, 16, 32});  // ragged last chunk
    add({2, 1, 64, 5, 16});    // odd D
    add({1, 2, 37, 12, 1});    // C = 1
    Problem grouped{1, 4, 70, 32, 16};
    grouped.heads_k = 2;
    grouped.dim_v = 20;
    add(grouped);
    Problem packed{1, 2, 61, 16, 16};
    packed.heads_k = 1;
    packed.cu_seqlens = {0, 30, 31, 61};
    add(packed);
    if (rank != 2) add({1, 2, 150, 128, 64});  // D = 128, ragged
  }
  return shapes;
}

// A kernel-suite case of a trapezoidal problem (its rank as mimo_rank), gates of this strength.
inline Case trapezoidal_case(const Problem& p, const std::string& gate_norm, const std::string& impl, Mode mode,
                             const std::string& backend = "cpu", const std::string& dtype = "float32") {
  Case c = kernel_case(p, impl, mode, backend, dtype);
  c.options["gate_norm"] = gate_norm;
  c.options["mimo_rank"] = std::to_string(p.rank);
  return c;
}

// The trapezoidal rule's decode shapes (docs/spec.md section 1e; scalar gates, float32 states in
// place): MIMO ranks 1, 2 and 4; one token and a draft with snapshots; D = 1, odd, ragged strips,
// 128; grouped heads and Dk x Dv states.
inline std::vector<DecodeProblem> decode_trapezoidal_test_shapes() {
  std::vector<DecodeProblem> shapes;
  for (int rank : {1, 2, 4}) {
    const auto add = [&](DecodeProblem p) {
      p.decay = Decay::scalar;
      p.rule = Rule::trapezoidal;
      p.rank = rank;
      shapes.push_back(p);
    };
    add({1, 1, 1, 1, 1});
    add({2, 3, 1, 37, 1});   // ragged strip
    add({1, 2, 4, 16, 2});   // snapshots < tokens
    add({2, 2, 3, 64, 4});   // snapshots > tokens
    add({1, 2, 8, 128, 3});
    add({3, 1, 2, 5, 2});    // odd D
    add({2, 6, 2, 20, 3, Decay::scalar, Rule::trapezoidal, 3, 40});  // grouped heads, Dv a ragged strip
    add({1, 4, 3, 16, 2, Decay::scalar, Rule::trapezoidal, 1, 32});  // one q/k head, Dv = 2 Dk
  }
  return shapes;
}

// A decode case of a trapezoidal problem (its rank as mimo_rank).
inline Case trapezoidal_decode_case(const DecodeProblem& p, const std::string& backend = "cpu") {
  Case c = decode_case(p, backend);
  c.options["mimo_rank"] = std::to_string(p.rank);
  return c;
}

}  // namespace lattn::test

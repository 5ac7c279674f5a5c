// The cases and shapes the tests share: a case of each op built from the kernels' problem structs,
// and the shapes every correctness test covers. Only core/ and the ops' rows: the CUDA emulation
// tests, which link no backend, use them too.
#pragma once

#include <string>
#include <vector>

#include "core/op.hpp"
#include "kernels/decode/op.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/op.hpp"

namespace lattn::test {

inline std::string describe(const Problem& p) {
  std::string shape;
  if (!p.square_dense()) {
    shape = " Hk" + std::to_string(p.qk_heads()) + " Dv" + std::to_string(p.value_dim());
    if (p.packed()) {
      shape += " docs";
      for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) shape += " " + std::to_string(p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
    }
  }
  return "B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" +
         std::to_string(p.dim) + " C" + std::to_string(p.chunk) + " " + to_string(p.decay) + " " + to_string(p.rule) + (p.bonus ? " bonus" : "") +
         (p.householder > 1 ? " householder " + std::to_string(p.householder) : "") + shape;
}

inline std::string describe(const Case& c) {
  return c.op->name + " " + c.impl + " " + to_string(c.mode) + " " + c.dtype + " B" + std::to_string(c.batch) + " H" +
         std::to_string(c.heads) + " T" + std::to_string(c.seq) + " D" + std::to_string(c.dim) + " C" +
         std::to_string(c.chunk) + " W" + std::to_string(c.window) + " " + c.decay +
         (c.options.count("gate_norm") ? " gate_norm " + c.option("gate_norm") : "") +
         (c.options.count("rule") ? " rule " + c.option("rule") : "") +
         (c.options.count("normalize_keys") ? " normalize_keys " + c.option("normalize_keys") : "") +
         (c.options.count("bonus") ? " bonus " + c.option("bonus") : "") +
         (c.options.count("householder") ? " householder " + c.option("householder") : "") +
         (c.options.count("snapshots") ? " snapshots " + c.option("snapshots") : "") +
         (c.option("heads_k").empty() || c.option("heads_k") == "0" ? "" : " heads_k " + c.option("heads_k")) +
         (c.option("dim_v").empty() || c.option("dim_v") == "0" ? "" : " dim_v " + c.option("dim_v")) +
         (c.option("lengths").empty() ? "" : " lengths " + c.option("lengths")) +
         [&] {
           std::string parts;
           for (const char* key : {"short_conv", "gates", "gate_rank", "output_gate", "attention", "decay_rank",
                                   "iclr_rank", "out_gate_rank", "bc_groups", "rope_fraction"})
             if (c.options.count(key)) parts += std::string(" ") + key + " " + c.option(key);
           return parts;
         }();
}

// A linear-attention case of `p`.
inline Case kernel_case(const Problem& p, const std::string& impl, Mode mode, const std::string& backend = "cpu",
                        const std::string& dtype = "float32") {
  Case c;
  c.op = &linear_attention_op();
  c.impl = impl;
  c.mode = mode;
  c.backend = backend;
  c.dtype = dtype;
  c.batch = p.batch;
  c.heads = p.heads;
  c.seq = p.seq;
  c.dim = p.dim;
  c.chunk = p.chunk;
  c.decay = to_string(p.decay);
  if (gated(p.decay)) c.options["gate_norm"] = "16";
  c.options["rule"] = to_string(p.rule);
  if (p.delta()) c.options["normalize_keys"] = "true";
  if (p.bonus) c.options["bonus"] = "true";
  if (p.householder > 1) c.options["householder"] = std::to_string(p.householder);
  // The shape keys of docs/spec.md section 1c, as a config writes them (settle_case's form).
  c.options["heads_k"] = std::to_string(p.qk_heads() == p.heads ? 0 : p.qk_heads());
  c.options["dim_v"] = std::to_string(p.value_dim() == p.dim ? 0 : p.value_dim());
  std::string lengths;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n)
    lengths += (lengths.empty() ? "" : "+") + std::to_string(p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  c.options["lengths"] = lengths;
  c.options["varlen"] = "";
  return c;
}

// The same with gates of this strength (gate_norm: 16 is the default, 1 strong).
inline Case gated_case(const Problem& p, const std::string& gate_norm, const std::string& impl, Mode mode,
                       const std::string& backend = "cpu") {
  Case c = kernel_case(p, impl, mode, backend);
  c.options["gate_norm"] = gate_norm;
  return c;
}

// A layer case of `p` (its form from p.chunked).
inline Case layer_case(const LayerProblem& p, Mode mode, const std::string& backend = "cpu") {
  Case c = kernel_case(p.linear, p.chunked ? "chunked" : "scan", mode, backend);
  c.op = &layer_op();
  c.window = p.window;
  c.options.clear();
  if (p.modern() && p.linear.dplr()) {  // RWKV-7's time mixing: its own keys replace the others
    c.options["rule"] = to_string(p.linear.rule);
    c.options["decay_rank"] = std::to_string(p.block.decay_rank);
    c.options["iclr_rank"] = std::to_string(p.block.iclr_rank);
    c.options["out_gate_rank"] = std::to_string(p.block.out_gate_rank);
  } else if (p.modern()) {  // the block's parts (docs/spec.md section 2b) as the config keys write them
    c.options["rule"] = to_string(p.linear.rule);
    c.options["short_conv"] = std::to_string(p.block.short_conv);
    c.options["gates"] = p.block.projected_gates ? "projected" : "input";
    if (p.block.projected_gates && p.linear.decay == Decay::vector)
      c.options["gate_rank"] = std::to_string(p.block.gate_rank);
    c.options["output_gate"] = p.block.norm_gate ? "norm" : "gate";
    c.options["attention"] = p.block.window ? "swa" : "none";
    if (p.linear.trapezoidal()) {  // Mamba-3's block (block/mamba3.hpp)
      c.options["bc_groups"] = std::to_string(p.block.bc_groups);
      c.options["rope_fraction"] = p.block.rope_fraction == 1.0 ? "1" : "0.5";
    }
  }
  return c;
}

// Shapes every test of the modern block covers (docs/spec.md section 2b): Gated DeltaNet, KDA and Mamba2
// blocks (projected gates, short convolution, gated norm, no window), and the kernel suite's
// rules and decays inside today's hybrid block (input gates, the window and its blend), each at
// T = 1 and at a T that is not a multiple of the chunk.
inline std::vector<LayerProblem> block_test_shapes() {
  const LayerBlock gdn{4, true, true, false, 0}, kda{4, true, true, false, 8}, hybrid{3, false, false, true, 0},
      plain_norm{0, false, true, false, 0};
  std::vector<LayerProblem> shapes;
  for (int seq : {1, 37}) {
    shapes.push_back({{1, 2, seq, 16, 16, Decay::scalar, Rule::delta}, 1, false, true, gdn});   // Gated DeltaNet
    shapes.push_back({{2, 2, seq, 8, 16, Decay::vector, Rule::delta}, 1, false, true, kda});    // KDA
    shapes.push_back({{1, 3, seq, 8, 16, Decay::scalar, Rule::additive}, 1, false, true, gdn}); // Mamba2
    shapes.push_back({{1, 2, seq, 8, 16, Decay::vector, Rule::delta}, 8, false, true, hybrid});  // KDA kernel, window
    shapes.push_back({{2, 1, seq, 16, 16, Decay::scalar, Rule::additive}, 5, false, true,
                      LayerBlock{0, false, false, true, 0}});                                      // gated kernel only
    shapes.push_back({{1, 2, seq, 8, 16, Decay::retnet, Rule::additive}, 1, false, true, plain_norm});
  }
  return shapes;
}

// Shapes every test of RWKV-7's time mixing covers (`rule: dplr`, docs/spec.md section 2b): a
// head dim under and at the vector width, batch 2 (the token shift restarts per sequence), three
// different low ranks, T = 1 (every gradient through the state is 0) and T ragged against the chunk.
inline std::vector<LayerProblem> rwkv7_test_shapes() {
  LayerBlock small{}, wide{};
  small.window = wide.window = false;
  small.decay_rank = 4, small.iclr_rank = 5, small.out_gate_rank = 6;
  wide.decay_rank = 3, wide.iclr_rank = 7, wide.out_gate_rank = 5;
  std::vector<LayerProblem> shapes;
  for (int seq : {1, 37}) {
    shapes.push_back({{1, 2, seq, 8, 16, Decay::vector, Rule::dplr}, 1, false, true, small});
    shapes.push_back({{2, 3, seq, 16, 16, Decay::vector, Rule::dplr}, 1, false, true, wide});
  }
  return shapes;
}

// Shapes every test of the Mamba-3 block covers (docs/spec.md section 2b, block/mamba3.hpp; rule
// trapezoidal, projected gates, the gate alone, no window): B and C shared by all heads (bc_groups
// 1, the authors' default), by pairs of heads, and one per head; half of their channels rotated, all
// of them, and a head dim whose half is odd (one pair of 6 channels); one and two sequences; each at
// T = 1 and at a T that is not a multiple of the chunk.
inline std::vector<LayerProblem> mamba3_test_shapes() {
  std::vector<LayerProblem> shapes;
  for (int seq : {1, 37}) {
    shapes.push_back({{1, 2, seq, 8, 16, Decay::scalar, Rule::trapezoidal}, 1, false, true,
                      LayerBlock{0, true, false, false, 0, 1, 0.5}});
    shapes.push_back({{2, 4, seq, 8, 16, Decay::scalar, Rule::trapezoidal}, 1, false, true,
                      LayerBlock{0, true, false, false, 0, 2, 1.0}});
    shapes.push_back({{1, 3, seq, 6, 16, Decay::scalar, Rule::trapezoidal}, 1, false, true,
                      LayerBlock{0, true, false, false, 0, 3, 0.5}});
  }
  return shapes;
}

// A sliding-window case: batch, heads, seq and dim of `p`, and `window`.
inline Case window_case(const Problem& p, int window, Mode mode, const std::string& backend = "cpu",
                        const std::string& dtype = "float32") {
  Case c = kernel_case(p, "blocked", mode, backend, dtype);
  c.op = &sliding_window_op();
  c.chunk = 0;
  c.decay = "none";
  c.options.clear();
  c.window = window;
  return c;
}

// Shapes every layer test covers (scan by default; tests set `chunked`). At T = 1, Lin = s (q.k) v
// points along v whatever q and k are, so RMSNorm(Lin) hardly depends on them: the true dwq and
// dwk are of order the norm's eps, float32 returns its rounding noise, and the check takes their
// error against dwv's scale (TensorSpec::error_floor, docs/harness.md). Two to three tokens of
// head_dim 2 are ill-conditioned for some seeds the same way.
inline std::vector<LayerProblem> layer_test_shapes() {
  return {
      {{1, 2, 1, 64, 128, Decay::none}, 1, false},      // one token: dwq, dwk of order eps
      {{1, 1, 8, 4, 4, Decay::none}, 1, false},
      {{1, 2, 9, 4, 4, Decay::retnet}, 1, false},       // window 1
      {{2, 3, 100, 16, 32, Decay::none}, 32, false},    // ragged chunks and query blocks
      {{1, 2, 150, 8, 64, Decay::retnet}, 200, false},  // window > T
      {{1, 4, 300, 64, 128, Decay::none}, 128, false},  // the suite's head dim and window
  };
}

// Shapes every kernel test covers: D = 1 and D = 128, T < C, T not a multiple of C, T = 1, C = 1,
// D not a multiple of the vector width; every decay, gated ones included (the test table adds
// strong gates, gate_norm 1, to each gated shape), under every rule (delta: DeltaNet, Gated
// DeltaNet, KDA and the delta rule with retnet's decay; dplr: RWKV-7's with each decay).
inline std::vector<Problem> kernel_test_shapes() {
  std::vector<Problem> shapes;
  for (Rule rule : {Rule::additive, Rule::delta, Rule::dplr})
    for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
      shapes.push_back({1, 1, 1, 1, 4, decay, rule});
      shapes.push_back({1, 2, 9, 1, 4, decay, rule});
      shapes.push_back({2, 3, 20, 8, 64, decay, rule});     // T < C
      shapes.push_back({1, 4, 100, 16, 32, decay, rule});   // ragged last chunk
      shapes.push_back({2, 1, 64, 5, 16, decay, rule});     // T a multiple of C, odd D
      shapes.push_back({1, 2, 37, 12, 1, decay, rule});     // C = 1
      shapes.push_back({1, 2, 300, 128, 128, decay, rule}); // D = 128, ragged
    }
  // RWKV-6's bonus form (docs/spec.md section 1g): the additive rule's vector-gated shapes again.
  for (std::size_t i = 0, n = shapes.size(); i < n; ++i)
    if (shapes[i].rule == Rule::additive && shapes[i].decay == Decay::vector) {
      Problem p = shapes[i];
      p.bonus = true;
      shapes.push_back(p);
    }
  // DeltaProduct (docs/spec.md section 1h): 2 and 3 writes per token under the delta rule, the decays
  // it takes (none, scalar, vector); T n past one chunk and ragged.
  for (Decay decay : {Decay::none, Decay::scalar, Decay::vector})
    for (int n : {2, 3}) {
      for (Problem p : {Problem{1, 2, 9, 1, 4, decay, Rule::delta}, Problem{2, 3, 20, 8, 64, decay, Rule::delta},
                        Problem{1, 4, 100, 16, 32, decay, Rule::delta}, Problem{1, 2, 150, 128, 128, decay, Rule::delta}}) {
        p.householder = n;
        shapes.push_back(p);
      }
    }
  return shapes;
}

// Shapes every sliding-window test covers: T = 1, window 1, window = T, window > T, T not a
// multiple of the query block, odd D.
struct WindowShape {
  Problem p;
  int window;
};
inline std::vector<WindowShape> window_test_shapes() {
  return {
      {{1, 1, 1, 1, 1, Decay::none}, 1},        // T = 1
      {{1, 2, 37, 8, 1, Decay::none}, 1},       // window 1: each query sees itself only
      {{2, 1, 100, 16, 1, Decay::none}, 7},     // T not a multiple of the query block
      {{1, 2, 150, 8, 1, Decay::none}, 32},     // window = query block (32), ragged last block
      {{1, 1, 130, 5, 1, Decay::none}, 33},     // odd D, window just over a block
      {{1, 1, 100, 4, 1, Decay::none}, 64},     // window two blocks
      {{1, 2, 90, 16, 1, Decay::none}, 90},     // window = T
      {{1, 1, 70, 8, 1, Decay::none}, 1000},    // window > T: plain causal softmax
      {{1, 1, 200, 64, 1, Decay::none}, 128},   // the layer's head dim and window
      {{1, 1, 600, 16, 1, Decay::none}, 100},   // three groups of 8 query blocks, the last ragged
      {{2, 1, 530, 32, 1, Decay::none}, 128},   // two groups, V read in place
  };
}

// A decode-step case of `p` (docs/spec.md section 1d).
inline Case decode_case(const DecodeProblem& p, const std::string& backend = "cpu", const std::string& dtype = "float32") {
  Case c;
  c.op = &decode_op();
  c.impl = "step";
  c.backend = backend;
  c.dtype = dtype;
  c.batch = p.batch;
  c.heads = p.heads;
  c.seq = p.tokens;
  c.dim = p.dim;
  c.decay = to_string(p.decay);
  c.options["rule"] = to_string(p.rule);
  c.options["snapshots"] = std::to_string(p.snapshots);
  // As the plan settles them: a shape key equal to heads or dim is its default, 0.
  c.options["heads_k"] = std::to_string(p.qk_heads() == p.heads ? 0 : p.qk_heads());
  c.options["dim_v"] = std::to_string(p.value_dim() == p.dim ? 0 : p.value_dim());
  c.options["state_slots"] = std::to_string(p.state_slots);
  c.options["state_dtype"] = p.state_bf16 ? "bf16" : "float32";
  if (p.bonus) c.options["bonus"] = "true";
  if (p.householder > 1) c.options["householder"] = std::to_string(p.householder);
  // Warm: a cold case rotates over copies past twice the last-level cache, too much for every test
  // shape; the tests of cold cases set it themselves.
  c.options["cache"] = "warm";
  return c;
}

// Shapes every decode test covers, under every rule and decay: one token and several, snapshots
// 1, fewer than the tokens and more, D = 1, D not a multiple of any vector width, D over one strip
// with a ragged last strip, D = 128; few heads (a thread's work item is one strip) and many (a
// whole head); states over 4 MiB (the CPU walks them in strips as wide as the rows); grouped heads
// and Dk x Dv states (docs/spec.md section 1c): Dv under, over and not a multiple of the strips,
// one q/k head for all (Mamba2) and half as many as the value heads (Qwen3-Next); states in a pool
// of slots, gathered through the seeded index.
inline std::vector<DecodeProblem> decode_test_shapes() {
  std::vector<DecodeProblem> shapes;
  for (Rule rule : {Rule::additive, Rule::delta, Rule::dplr})
    for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}) {
      shapes.push_back({1, 1, 1, 1, 1, decay, rule});
      shapes.push_back({2, 3, 1, 37, 1, decay, rule});    // ragged strip
      shapes.push_back({1, 2, 4, 16, 2, decay, rule});    // snapshots < tokens
      shapes.push_back({2, 2, 3, 64, 4, decay, rule});    // snapshots > tokens: all of them
      shapes.push_back({1, 2, 8, 128, 3, decay, rule});
      shapes.push_back({4, 8, 2, 40, 2, decay, rule});    // 32 heads: a work item is a head
      shapes.push_back({3, 1, 2, 5, 2, decay, rule});     // odd D
      // States over 4 MiB, which the CPU walks in strips as wide as the rows (kernels/decode/cpu.cpp)
      shapes.push_back({4, 17, 2, 128, 2, decay, rule});
      shapes.push_back({8, 17, 1, 100, 1, decay, rule});  // a ragged wide strip
      shapes.push_back({2, 4, 1, 32, 1, decay, rule, 2, 16});    // Dv = Dk / 2: a half strip
      shapes.push_back({1, 4, 3, 16, 2, decay, rule, 1, 32});    // one q/k head, Dv = 2 Dk
      shapes.push_back({2, 6, 2, 20, 3, decay, rule, 3, 40});    // Dv a ragged strip
      shapes.push_back({1, 2, 2, 5, 2, decay, rule, 1, 10});     // odd Dk
      shapes.push_back({3, 12, 2, 96, 2, decay, rule, 4, 320});  // over 4 MiB, a ragged wide strip
      shapes.push_back({2, 3, 1, 37, 1, decay, rule, 0, 0, 7});  // a pool of 7 slots for 2 sequences
      shapes.push_back({3, 2, 3, 16, 2, decay, rule, 1, 24, 4}); // a pool one slot larger, grouped heads
    }
  // RWKV-6's bonus form (docs/spec.md section 1g): the additive rule's vector-gated shapes again.
  for (std::size_t i = 0, n = shapes.size(); i < n; ++i)
    if (shapes[i].rule == Rule::additive && shapes[i].decay == Decay::vector) {
      DecodeProblem p = shapes[i];
      p.bonus = true;
      shapes.push_back(p);
    }
  // DeltaProduct (docs/spec.md section 1h): 2 and 3 writes per token, one token and a draft with
  // snapshots, grouped heads and Dk != Dv, a pool of slots.
  for (Decay decay : {Decay::none, Decay::scalar, Decay::vector})
    for (int n : {2, 3})
      for (DecodeProblem p : {DecodeProblem{2, 3, 1, 37, 1, decay, Rule::delta}, DecodeProblem{1, 2, 4, 16, 3, decay, Rule::delta},
                              DecodeProblem{2, 6, 2, 20, 3, decay, Rule::delta, 3, 40},
                              DecodeProblem{2, 3, 2, 16, 2, decay, Rule::delta, 0, 0, 5}}) {
        p.householder = n;
        shapes.push_back(p);
      }
  return shapes;
}

}  // namespace lattn::test

// The layer suite's keys, tensors, inputs, flop model and float64 reference for the parts of the
// modern block (docs/spec.md section 2b; block.hpp), which kernels/layer/hybrid/op.cpp adds to its row.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/op.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {

// The block's parts a case sets (its options; defaults where it has none).
LayerBlock layer_block(const Case& kase);
// Whether a case runs the block of section 2b (LayerProblem::modern).
bool layer_is_modern(const Case& kase);
// rule, short_conv, attention, gates, gate_rank, output_gate and RWKV-7's ranks (block/rwkv7_op.hpp; the
// decay is the row's own key).
Axis attention_axis();
std::vector<Axis> block_axes();
bool layer_window_applies(const Case& kase);
// Today's blend weight beta (and dbeta) exists only with `output_gate: gate`, and not in Mamba-3's block.
bool layer_has_blend(const Case& kase);
// wq and wk: M x M, but M x (bc_groups head_dim) in Mamba-3's block (C's and B's projections).
std::vector<std::size_t> layer_qk_weight_shape(const Case& kase);
// The norm weight g [M] exists unless the block has no output norm (Mamba-3's gate alone).
bool layer_has_norm_weight(const Case& kase);
std::vector<TensorSpec> block_tensors();
// Adds the inputs of the case's parts to `set` (docs/spec.md section 2b's initialisation).
void add_block_inputs(const Case& kase, std::uint64_t seed, TensorSet& set);
Reference block_reference(const Case& kase, const TensorSet& inputs, bool backward);
double block_flops(const Case& kase);
// Why a combination of parts is not one the block defines, or nothing.
std::optional<std::string> block_limit(const Case& kase);

}  // namespace lattn

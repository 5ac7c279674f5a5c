// RWKV-7's time mixing in the layer suite's row (`rule: dplr`; docs/spec.md section 2b; the block is
// block/rwkv7.hpp): its keys, tensors, inputs, flop model and limits, which block/op.cpp adds to the
// modern block's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/op.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {

// Whether a layer case is RWKV-7's time mixing (rule dplr), and its negation (the keys it replaces).
bool rwkv7_block(const Case& kase);
bool not_rwkv7_block(const Case& kase);
// Its parts of the LayerBlock: the three low ranks, and no window.
void add_rwkv7_block(const Case& kase, LayerBlock& block);
// decay_rank, iclr_rank, out_gate_rank.
std::vector<Axis> rwkv7_axes();
std::vector<TensorSpec> rwkv7_tensors();
void add_rwkv7_inputs(const Case& kase, std::uint64_t seed, TensorSet& set);
double rwkv7_flops(const Case& kase);
std::optional<std::string> rwkv7_limit(const Case& kase);

}  // namespace lattn

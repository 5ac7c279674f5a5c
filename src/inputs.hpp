// Deterministic inputs (SPEC section 3): every value is a function of (seed, tensor, index) alone,
// so the same seed gives the same tensors on every backend, thread count and machine.
#pragma once

#include <cstdint>
#include <vector>

#include "config.hpp"
#include "problem.hpp"

namespace lattn {

enum class TensorId : std::uint64_t { q = 1, k, v, h0, dO, dhT, x, wq, wk, wv, wo, beta, dOut };

// Standard normal values, counter-based (splitmix64 + Box-Muller).
void fill_normal(std::vector<float>& out, std::uint64_t seed, TensorId tensor, double stddev = 1.0);

struct KernelTensors;
struct LayerTensors;
// q, k, v, h0 always; dO and dhT for fwd_bwd.
KernelTensors make_kernel_inputs(const Problem& problem, Mode mode, std::uint64_t seed);
// x, wq, wk, wv, wo (N(0, 1/M), M = heads * dim), g = 1, beta always; dOut for fwd_bwd. `problem`
// is the layer's linear-branch problem: dim is the head dim.
LayerTensors make_layer_inputs(const Problem& problem, Mode mode, std::uint64_t seed);

}  // namespace lattn

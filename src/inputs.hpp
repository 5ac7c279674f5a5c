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

// bfloat16 (round to nearest even; NaN stays NaN): the bits, and the float it stands for. A bf16
// case's q, k, v and dO are rounded to bf16 before the backend and the float64 reference see them,
// so rel_err measures the kernel, not the rounding of its inputs (docs/cuda.md).
std::uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(std::uint16_t bits);
void round_to_bf16(std::vector<float>& values);

struct KernelTensors;
struct LayerTensors;
// q, k, v, h0 always; dO and dhT for fwd_bwd.
KernelTensors make_kernel_inputs(const Problem& problem, Mode mode, std::uint64_t seed);
// x, wq, wk, wv, wo (N(0, 1/M), M = heads * dim), g = 1, beta always; dOut for fwd_bwd. `problem`
// is the layer's linear-branch problem: dim is the head dim.
LayerTensors make_layer_inputs(const Problem& problem, Mode mode, std::uint64_t seed);

}  // namespace lattn

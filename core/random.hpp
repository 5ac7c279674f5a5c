// Deterministic inputs (docs/spec.md section 3): every value is a function of (seed, stream, index) alone,
// so the same seed gives the same tensors on every backend, thread count and machine. Each input
// tensor has its own stream number, fixed in its op's table (kernels/<op>/op.cpp): a number, once
// given, never changes, or results stop comparing with older files.
#pragma once

#include <cstdint>
#include <vector>

namespace lattn {

// Standard normal values times `stddev`, counter-based (splitmix64 + Box-Muller).
void fill_normal(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream, double stddev = 1.0);

// Uniform values in (0, 1], counter-based (splitmix64): what seeded draws other than the tensors
// take (a packed batch's document lengths).
void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream);

// bfloat16 (round to nearest even; NaN stays NaN): the bits, and the float it stands for. A bf16
// case's token tensors are rounded to bf16 before the backend and the float64 reference see them,
// so rel_err measures the kernel, not the rounding of its inputs (docs/cuda.md).
std::uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(std::uint16_t bits);
void round_to_bf16(std::vector<float>& values);

}  // namespace lattn

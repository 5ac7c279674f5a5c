#include "inputs.hpp"

#include <cmath>
#include <cstring>

#include "backend.hpp"

namespace lattn {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// (0, 1]: never 0, so the logarithm below is finite.
double unit_interval(std::uint64_t bits) { return (double(bits >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

std::uint16_t float_to_bf16_bits(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t(bits >> 16);
}

float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t wide = std::uint32_t(bits) << 16;
  float x = 0;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

void round_to_bf16(std::vector<float>& values) {
  for (float& x : values) x = bf16_bits_to_float(float_to_bf16_bits(x));
}

void fill_normal(std::vector<float>& out, std::uint64_t seed, TensorId tensor, double stddev) {
  const std::uint64_t stream = splitmix64(seed ^ splitmix64(std::uint64_t(tensor)));
  const long n = long(out.size());
#pragma omp parallel for schedule(static)
  for (long pair = 0; pair < (n + 1) / 2; ++pair) {
    const std::uint64_t base = splitmix64(stream + std::uint64_t(pair));
    const double radius = std::sqrt(-2.0 * std::log(unit_interval(base)));
    const double angle = 2.0 * M_PI * unit_interval(splitmix64(base));
    out[std::size_t(2 * pair)] = float(stddev * radius * std::cos(angle));
    if (2 * pair + 1 < n) out[std::size_t(2 * pair + 1)] = float(stddev * radius * std::sin(angle));
  }
}

KernelTensors make_kernel_inputs(const Problem& p, Mode mode, std::uint64_t seed) {
  KernelTensors t;
  auto make = [&](std::vector<float>& v, std::size_t n, TensorId id) {
    v.resize(n);
    fill_normal(v, seed, id);
  };
  make(t.q, p.token_elems(), TensorId::q);
  make(t.k, p.token_elems(), TensorId::k);
  make(t.v, p.token_elems(), TensorId::v);
  make(t.h0, p.state_elems(), TensorId::h0);
  if (mode == Mode::fwd_bwd) {
    make(t.dO, p.token_elems(), TensorId::dO);
    make(t.dhT, p.state_elems(), TensorId::dhT);
  }
  return t;
}

LayerTensors make_layer_inputs(const Problem& p, Mode mode, std::uint64_t seed) {
  LayerTensors t;
  const std::size_t M = std::size_t(p.heads) * p.dim, tokens = std::size_t(p.batch) * p.seq * M;
  auto make = [&](std::vector<float>& v, std::size_t n, TensorId id, double stddev) {
    v.resize(n);
    fill_normal(v, seed, id, stddev);
  };
  const double w_std = 1.0 / std::sqrt(double(M));
  make(t.x, tokens, TensorId::x, 1.0);
  make(t.wq, M * M, TensorId::wq, w_std);
  make(t.wk, M * M, TensorId::wk, w_std);
  make(t.wv, M * M, TensorId::wv, w_std);
  make(t.wo, M * M, TensorId::wo, w_std);
  t.g.assign(M, 1.0f);
  make(t.beta, std::size_t(p.heads), TensorId::beta, 1.0);
  if (mode == Mode::fwd_bwd) make(t.dOut, tokens, TensorId::dOut, 1.0);
  return t;
}

}  // namespace lattn

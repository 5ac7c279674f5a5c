#include "core/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/cancel.hpp"

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

void fill_normal(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream_id, double stddev) {
  const std::uint64_t stream = splitmix64(seed ^ splitmix64(stream_id));
  const long n = long(out.size()), pairs = (n + 1) / 2;
  // In blocks of pairs, the run's stop request polled before each (core/cancel.hpp): the inputs of
  // a long sequence take seconds. Every value is a function of its index alone, so the blocks'
  // order and threads do not change the numbers.
  constexpr long kBlock = 1 << 16;
#pragma omp parallel for schedule(static)
  for (long block = 0; block < (pairs + kBlock - 1) / kBlock; ++block) {
    if (stop_requested()) continue;
    for (long pair = block * kBlock; pair < std::min(pairs, (block + 1) * kBlock); ++pair) {
      const std::uint64_t base = splitmix64(stream + std::uint64_t(pair));
      const double radius = std::sqrt(-2.0 * std::log(unit_interval(base)));
      const double angle = 2.0 * M_PI * unit_interval(splitmix64(base));
      out[std::size_t(2 * pair)] = float(stddev * radius * std::cos(angle));
      if (2 * pair + 1 < n) out[std::size_t(2 * pair + 1)] = float(stddev * radius * std::sin(angle));
    }
  }
  throw_if_stop_requested();
}

void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t stream_id) {
  const std::uint64_t stream = splitmix64(seed ^ splitmix64(stream_id));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(unit_interval(splitmix64(stream + i)));
}

}  // namespace lattn

// The shape of one causal linear-attention problem and the tensor layouts every backend shares.
//
// Layouts (row-major, contiguous):
//   q, k, v, o, dO, dq, dk, dv : [batch][heads][seq][dim]   (row t is token t)
//   h0, hT, dhT, dh0           : [batch][heads][dim][dim]   (rows: key dim, columns: value dim)
// The mathematics is in docs/kernels.md (SPEC section 1). The op's table row (tensors, inputs,
// flop model) is op.cpp beside this file.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lattn {

// How the state decays between tokens (SPEC section 1): `none` (gamma 1) or `retnet` (gamma_h =
// 1 - 2^(-5-h) for head h).
enum class Decay { none, retnet };

// The decays' names, in enum order: what configs and records write.
const std::vector<std::string>& decay_names();
std::string to_string(Decay decay);
// Throws RuntimeFailure for a name decay_names() does not hold.
Decay decay_from(const std::string& name);

struct Problem {
  int batch = 1;
  int heads = 1;
  int seq = 1;
  int dim = 1;
  int chunk = 64;  // only the chunked form reads it
  Decay decay = Decay::none;

  std::size_t heads_total() const { return std::size_t(batch) * heads; }
  std::size_t token_elems() const { return heads_total() * seq * dim; }   // one of q, k, v, o
  std::size_t state_elems() const { return heads_total() * dim * dim; }  // one of h0, hT
  std::size_t head_token_elems() const { return std::size_t(seq) * dim; }
  std::size_t head_state_elems() const { return std::size_t(dim) * dim; }
  int chunks() const { return (seq + chunk - 1) / chunk; }
};

// gamma_h of SPEC section 1: 1 for `none`, 1 - 2^(-5-h) for `retnet`.
inline double decay_gamma(Decay decay, int head) {
  return decay == Decay::none ? 1.0 : 1.0 - std::ldexp(1.0, -5 - head);
}

inline double attention_scale(int dim) { return 1.0 / std::sqrt(double(dim)); }

// Pointers of one forward call. Outputs are fully overwritten.
template <class T>
struct ForwardArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* h0;
  T* o;
  T* hT;
};

// Pointers of one backward call: the forward's inputs, the cotangents, and the gradients (overwritten).
template <class T>
struct BackwardArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* h0;
  const T* dO;
  const T* dhT;
  T* dq;
  T* dk;
  T* dv;
  T* dh0;
};

}  // namespace lattn

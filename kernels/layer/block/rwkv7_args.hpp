// The tensors of RWKV-7's time mixing (block/rwkv7.hpp) beyond the layer's own x, wq (the receptance
// projection), wk, wv, wo and g (the group norm's weight), and their binding by name.
#pragma once

#include <string>

namespace lattn {

// Layouts (row-major; M = heads * head_dim, the ranks rw, ra, rg of LayerBlock):
//   mix [6][M]    the token shift's lerp weights of r, w, k, v, a, g (in that order)
//   w0 [M], w1 [M][rw], w2 [rw][M]    the decay's bias and low-rank factors
//   a0 [M], a1 [M][ra], a2 [ra][M]    the in-context learning rate's
//   g1 [M][rg], g2 [rg][M]            the output gate's
//   k_k, k_a [M]   the key's scale before its L2 norm, and how far the learning rate scales the key
//   r_k [M]        the bonus weights ([H][Dh]), ln_b [M] the group norm's bias
// Each d<name> is the gradient of the same shape.
template <class T>
struct Rwkv7Args {
  const T *mix = nullptr, *w0 = nullptr, *w1 = nullptr, *w2 = nullptr, *a0 = nullptr, *a1 = nullptr, *a2 = nullptr;
  const T *g1 = nullptr, *g2 = nullptr, *k_k = nullptr, *k_a = nullptr, *r_k = nullptr, *ln_b = nullptr;
  T *dmix = nullptr, *dw0 = nullptr, *dw1 = nullptr, *dw2 = nullptr, *da0 = nullptr, *da1 = nullptr, *da2 = nullptr;
  T *dg1 = nullptr, *dg2 = nullptr, *dk_k = nullptr, *dk_a = nullptr, *dr_k = nullptr, *dln_b = nullptr;
};

namespace block {

// The tensor names, in Rwkv7Args' order (block/op.cpp declares them; each gradient is "d" + name).
inline constexpr const char* kRwkv7Names[13] = {"mix", "w0", "w1", "w2", "a0", "a1", "a2",
                                                "g1",  "g2", "k_k", "k_a", "r_k", "ln_b"};

template <class T, class Get>
Rwkv7Args<T> bind_rwkv7_args(Get get) {
  Rwkv7Args<T> a;
  const T** inputs[13] = {&a.mix, &a.w0, &a.w1, &a.w2, &a.a0, &a.a1, &a.a2, &a.g1, &a.g2, &a.k_k, &a.k_a, &a.r_k, &a.ln_b};
  T** grads[13] = {&a.dmix, &a.dw0, &a.dw1, &a.dw2, &a.da0, &a.da1, &a.da2,
                   &a.dg1,  &a.dg2, &a.dk_k, &a.dk_a, &a.dr_k, &a.dln_b};
  for (int i = 0; i < 13; ++i) {
    *inputs[i] = get(kRwkv7Names[i]);
    *grads[i] = get((std::string("d") + kRwkv7Names[i]).c_str());
  }
  return a;
}

}  // namespace block
}  // namespace lattn

// The tensors of one call of the modern layer block (block.hpp), and their binding by name.
#pragma once

#include "kernels/layer/block/rwkv7_args.hpp"
#include "kernels/layer/problem.hpp"

namespace lattn {

// Every tensor of a block call; null where the case has none (block/op.cpp lists which exist).
// Layouts (row-major): conv [3M][w] (channel c of [q k v], tap i multiplies row t - (w - 1) + i);
// wz [M][M]; wa, wb [M][H]; wd [M][r]; wu [r][M]; a_log, d_skip [H]; dt_bias [H] (scalar) or [M]
// (vector); lin_g, lin_beta as the kernel suite's g and beta; g [M] the norm's weight; beta [H] the
// blend of section 2.
template <class T>
struct BlockArgs {
  const T *x = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr, *g = nullptr, *beta = nullptr;
  const T *conv = nullptr, *wz = nullptr, *wa = nullptr, *wd = nullptr, *wu = nullptr, *wb = nullptr;
  const T *a_log = nullptr, *dt_bias = nullptr, *d_skip = nullptr, *lin_g = nullptr, *lin_beta = nullptr;
  // Mamba-3 (block/mamba3.hpp): wda, wtrap [M][H]; wangle [M][nA]; b_bias, c_bias [H][Dh]; b_norm, c_norm [Dh].
  const T *wda = nullptr, *wtrap = nullptr, *wangle = nullptr, *b_bias = nullptr, *c_bias = nullptr;
  const T *b_norm = nullptr, *c_norm = nullptr;
  const T* dOut = nullptr;
  T* out = nullptr;
  T *dx = nullptr, *dwq = nullptr, *dwk = nullptr, *dwv = nullptr, *dwo = nullptr, *dg = nullptr, *dbeta = nullptr;
  T *dconv = nullptr, *dwz = nullptr, *dwa = nullptr, *dwd = nullptr, *dwu = nullptr, *dwb = nullptr;
  T *da_log = nullptr, *ddt_bias = nullptr, *dd_skip = nullptr, *dlin_g = nullptr, *dlin_beta = nullptr;
  Rwkv7Args<T> rwkv7;  // RWKV-7's own tensors (rule dplr, block/rwkv7.hpp)
  T *dwda = nullptr, *dwtrap = nullptr, *dwangle = nullptr, *db_bias = nullptr, *dc_bias = nullptr;
  T *db_norm = nullptr, *dc_norm = nullptr;
};

}  // namespace lattn

namespace lattn::block {

// BlockArgs from a lookup by tensor name (the op's names, block/op.cpp): `get(name)` returns the
// tensor's buffer, or null where the case has no such tensor.
template <class T, class Get>
BlockArgs<T> bind_args(Get get) {
  BlockArgs<T> a;
  const struct {
    const char* name;
    const T* BlockArgs<T>::*field;
  } inputs[] = {{"x", &BlockArgs<T>::x},           {"wq", &BlockArgs<T>::wq},         {"wk", &BlockArgs<T>::wk},
                {"wv", &BlockArgs<T>::wv},         {"wo", &BlockArgs<T>::wo},         {"g", &BlockArgs<T>::g},
                {"beta", &BlockArgs<T>::beta},     {"conv", &BlockArgs<T>::conv},     {"wz", &BlockArgs<T>::wz},
                {"wa", &BlockArgs<T>::wa},         {"wd", &BlockArgs<T>::wd},         {"wu", &BlockArgs<T>::wu},
                {"wb", &BlockArgs<T>::wb},         {"a_log", &BlockArgs<T>::a_log},   {"dt_bias", &BlockArgs<T>::dt_bias},
                {"d_skip", &BlockArgs<T>::d_skip}, {"lin_g", &BlockArgs<T>::lin_g},   {"lin_beta", &BlockArgs<T>::lin_beta},
                {"wda", &BlockArgs<T>::wda},       {"wtrap", &BlockArgs<T>::wtrap},   {"wangle", &BlockArgs<T>::wangle},
                {"b_bias", &BlockArgs<T>::b_bias}, {"c_bias", &BlockArgs<T>::c_bias}, {"b_norm", &BlockArgs<T>::b_norm},
                {"c_norm", &BlockArgs<T>::c_norm}, {"dOut", &BlockArgs<T>::dOut}};
  const struct {
    const char* name;
    T* BlockArgs<T>::*field;
  } outputs[] = {{"out", &BlockArgs<T>::out},         {"dx", &BlockArgs<T>::dx},           {"dwq", &BlockArgs<T>::dwq},
                 {"dwk", &BlockArgs<T>::dwk},         {"dwv", &BlockArgs<T>::dwv},         {"dwo", &BlockArgs<T>::dwo},
                 {"dg", &BlockArgs<T>::dg},           {"dbeta", &BlockArgs<T>::dbeta},     {"dconv", &BlockArgs<T>::dconv},
                 {"dwz", &BlockArgs<T>::dwz},         {"dwa", &BlockArgs<T>::dwa},         {"dwd", &BlockArgs<T>::dwd},
                 {"dwu", &BlockArgs<T>::dwu},         {"dwb", &BlockArgs<T>::dwb},         {"da_log", &BlockArgs<T>::da_log},
                 {"ddt_bias", &BlockArgs<T>::ddt_bias}, {"dd_skip", &BlockArgs<T>::dd_skip},
                 {"dlin_g", &BlockArgs<T>::dlin_g},   {"dlin_beta", &BlockArgs<T>::dlin_beta},
                 {"dwda", &BlockArgs<T>::dwda},       {"dwtrap", &BlockArgs<T>::dwtrap},   {"dwangle", &BlockArgs<T>::dwangle},
                 {"db_bias", &BlockArgs<T>::db_bias}, {"dc_bias", &BlockArgs<T>::dc_bias}, {"db_norm", &BlockArgs<T>::db_norm},
                 {"dc_norm", &BlockArgs<T>::dc_norm}};
  for (const auto& f : inputs) a.*f.field = get(f.name);
  for (const auto& f : outputs) a.*f.field = get(f.name);
  a.rwkv7 = bind_rwkv7_args<T>(get);
  return a;
}

}  // namespace lattn::block

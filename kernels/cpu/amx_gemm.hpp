// bf16 products on AMX tiles with float32 accumulation, written once for both tile policies of
// kernels/cpu/amx.hpp (the hardware and the emulation):
//   C (M x N float32, ldc floats a row) = C (when `accumulate`; else 0) + A B
// A: M x K bf16, row-major (lda elements a row); B: K x N bf16 as VNNI pairs, row p of ldb 32-bit
// words holding (B[2p][c], B[2p + 1][c]) for every column c. M and N multiples of 16, K a multiple
// of 32 (the caller zero-pads): every tile is 16 rows of 64 bytes, so one configuration serves all.
// Tiles 0-3 accumulate a 32 x 32 block of C (2 x 2 tiles of 16 x 16), 4-5 hold two 16-row slices of
// A and 6-7 two 16-column slices of B: each A and B tile loaded feeds two tdpbf16ps. The caller
// loads the configuration once per thread (configure) and releases it when done.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/amx.hpp"

namespace lattn::cpu::amx {

constexpr int kTileRows = 16;   // rows of every tile; C's tile columns (16 float32)
constexpr int kTileDepth = 32;  // bf16 of the reduction a tdpbf16ps takes (16 pairs)

template <class Tiles>
void configure() {
  Tiles::load_config(uniform_config(kTiles, kMaxRows, kMaxRowBytes));
}

// One block of C: MT x NT tiles (each 1 or 2) at c, the reduction `steps` x 32 deep.
template <class Tiles, int MT, int NT>
void gemm_block(int steps, const std::uint16_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb, float* c,
                std::size_t ldc, bool accumulate) {
  const std::size_t a_stride = lda * 2, b_stride = ldb * 4, c_stride = ldc * 4;
  float* c1 = c + kTileRows;
  float* c2 = c + std::size_t(kTileRows) * ldc;
  if (accumulate) {
    Tiles::template load<0>(c, c_stride);
    if constexpr (NT == 2) Tiles::template load<1>(c1, c_stride);
    if constexpr (MT == 2) Tiles::template load<2>(c2, c_stride);
    if constexpr (MT == 2 && NT == 2) Tiles::template load<3>(c2 + kTileRows, c_stride);
  } else {
    Tiles::template zero<0>();
    if constexpr (NT == 2) Tiles::template zero<1>();
    if constexpr (MT == 2) Tiles::template zero<2>();
    if constexpr (MT == 2 && NT == 2) Tiles::template zero<3>();
  }
  for (int s = 0; s < steps; ++s) {
    const std::uint16_t* as = a + std::size_t(s) * kTileDepth;
    const std::uint32_t* bs = b + std::size_t(s) * (kTileDepth / 2) * ldb;
    Tiles::template load<4>(as, a_stride);
    if constexpr (MT == 2) Tiles::template load<5>(as + kTileRows * lda, a_stride);
    Tiles::template load<6>(bs, b_stride);
    if constexpr (NT == 2) Tiles::template load<7>(bs + kTileRows, b_stride);
    Tiles::template dpbf16ps<0, 4, 6>();
    if constexpr (NT == 2) Tiles::template dpbf16ps<1, 4, 7>();
    if constexpr (MT == 2) Tiles::template dpbf16ps<2, 5, 6>();
    if constexpr (MT == 2 && NT == 2) Tiles::template dpbf16ps<3, 5, 7>();
  }
  Tiles::template store<0>(c, c_stride);
  if constexpr (NT == 2) Tiles::template store<1>(c1, c_stride);
  if constexpr (MT == 2) Tiles::template store<2>(c2, c_stride);
  if constexpr (MT == 2 && NT == 2) Tiles::template store<3>(c2 + kTileRows, c_stride);
}

template <class Tiles>
void gemm(int M, int N, int K, const std::uint16_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
          float* c, std::size_t ldc, bool accumulate) {
  const int steps = K / kTileDepth;
  for (int m = 0; m < M; m += 2 * kTileRows) {
    const bool two_rows = m + 2 * kTileRows <= M;
    const std::uint16_t* am = a + std::size_t(m) * lda;
    for (int n = 0; n < N; n += 2 * kTileRows) {
      const bool two_cols = n + 2 * kTileRows <= N;
      float* cm = c + std::size_t(m) * ldc + n;
      const std::uint32_t* bn = b + n;
      if (two_rows && two_cols)
        gemm_block<Tiles, 2, 2>(steps, am, lda, bn, ldb, cm, ldc, accumulate);
      else if (two_rows)
        gemm_block<Tiles, 2, 1>(steps, am, lda, bn, ldb, cm, ldc, accumulate);
      else if (two_cols)
        gemm_block<Tiles, 1, 2>(steps, am, lda, bn, ldb, cm, ldc, accumulate);
      else
        gemm_block<Tiles, 1, 1>(steps, am, lda, bn, ldb, cm, ldc, accumulate);
    }
  }
}

}  // namespace lattn::cpu::amx

// Intel AMX (palette 1: eight tile registers of up to 16 rows of 64 bytes) for the bf16 kernels, as
// a small tile-ops interface that two policies implement:
//   amx::Emulated  portable C++ on every CPU: the tile configuration with ldtilecfg's checks, the
//                  tile registers per thread, tileloadd, tilestored, tilezero and tdpbf16ps with the
//                  instruction's arithmetic (below); the AMX kernels' tests run through it anywhere;
//   amx::Hardware  the intrinsics; declared only in a file compiled with -mamx-tile -mamx-bf16
//                  (LATTN_AMX_INTRINSICS, set by CMakeLists.txt where the compiler takes the flags).
// A kernel is written once as a template on the policy (kernels/cpu/amx_gemm.hpp) and instantiated
// for both. Tile indices are template arguments: the instructions encode their registers.
//
// tdpbf16ps C, A, B as the silicon computes it (measured on an AMX-BF16 Xeon, bit for bit over
// 51,200 random elements with denormals; docs/kernels.md): C is m x n float32 (C.colsb / 4 = n
// columns), A is m rows of k bf16 pairs (A.colsb / 4 = k), B is k rows of n bf16 pairs (VNNI: row
// p holds (X[2p][c], X[2p + 1][c]) for every column c). For each row m, two float32 partial sums per
// column n, one over the pairs' low halves and one over their high halves, start at zero and take
// one fused multiply-add per pair p in order; then C[m][n] = C[m][n] + (low + high): the halves are
// added to each other first, not (C + low) + high as a reading of the SDM's pseudo-code suggests.
// Every step rounds to nearest even, treats denormal inputs as zero and flushes denormal results to
// zero (DAZ, FTZ), whatever MXCSR says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#if defined(LATTN_AMX_INTRINSICS)
#include <immintrin.h>
#endif

namespace lattn::cpu::amx {

constexpr int kTiles = 8, kMaxRows = 16, kMaxRowBytes = 64;

// The 64-byte operand of ldtilecfg.
struct TileConfig {
  std::uint8_t palette = 0;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};  // bytes per row of tile i
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Every tile 0 .. tiles - 1 of the same shape, the rest unconfigured.
TileConfig uniform_config(int tiles, int rows, int colsb);

// Why ldtilecfg would fault on `c` (palette 1 only: palette 0 releases the tiles), or nothing.
std::optional<std::string> config_error(const TileConfig& c);

// ---- The emulation ----

namespace emulated {
// The calling thread's tile state. Each call checks what the instruction checks and throws
// std::logic_error naming the instruction and the fault where the hardware would raise #GP or #UD.
void load_config(const TileConfig& c);
void release();
void load(int tile, const void* base, std::size_t stride);
void store(int tile, void* base, std::size_t stride);
void zero(int tile);
void dpbf16ps(int c, int a, int b);
}  // namespace emulated

// tdpbf16ps's arithmetic on one output element: c + the dot product of `pairs` bf16 pairs of a and
// b (a[2p], a[2p + 1] against b[2p], b[2p + 1]), exactly as the emulated instruction computes it.
float dpbf16_element(float c, const std::uint16_t* a, const std::uint16_t* b, int pairs);

struct Emulated {
  static constexpr const char* name = "emulated";
  static void load_config(const TileConfig& c) { emulated::load_config(c); }
  static void release() { emulated::release(); }
  template <int T>
  static void load(const void* base, std::size_t stride) {
    emulated::load(T, base, stride);
  }
  template <int T>
  static void store(void* base, std::size_t stride) {
    emulated::store(T, base, stride);
  }
  template <int T>
  static void zero() {
    emulated::zero(T);
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C != A && C != B && A != B, "tdpbf16ps takes three distinct tiles");
    emulated::dpbf16ps(C, A, B);
  }
};

#if defined(LATTN_AMX_INTRINSICS)
// The intrinsics are macros that paste their tile numbers into the instruction's text, so each
// template argument is spelled out as a literal here.
#define LATTN_AMX_TILE_CASES(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
struct Hardware {
  static constexpr const char* name = "hardware";
  static void load_config(const TileConfig& c) { _tile_loadconfig(&c); }
  static void release() { _tile_release(); }
  template <int T>
  static void load(const void* base, std::size_t stride) {
    static_assert(T >= 0 && T < kTiles);
#define LATTN_AMX_LOAD(t) \
  if constexpr (T == (t)) _tile_loadd(t, base, stride);
    LATTN_AMX_TILE_CASES(LATTN_AMX_LOAD)
#undef LATTN_AMX_LOAD
  }
  template <int T>
  static void store(void* base, std::size_t stride) {
    static_assert(T >= 0 && T < kTiles);
#define LATTN_AMX_STORE(t) \
  if constexpr (T == (t)) _tile_stored(t, base, stride);
    LATTN_AMX_TILE_CASES(LATTN_AMX_STORE)
#undef LATTN_AMX_STORE
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < kTiles);
#define LATTN_AMX_ZERO(t) \
  if constexpr (T == (t)) _tile_zero(t);
    LATTN_AMX_TILE_CASES(LATTN_AMX_ZERO)
#undef LATTN_AMX_ZERO
  }
  // The (C, A, B) triples kernels/cpu/amx_gemm.hpp uses: its 2 x 2 block of accumulators.
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert((C == 0 && A == 4 && B == 6) || (C == 1 && A == 4 && B == 7) || (C == 2 && A == 5 && B == 6) ||
                      (C == 3 && A == 5 && B == 7),
                  "a tile triple amx_gemm.hpp does not use: spell it out here");
    if constexpr (C == 0) _tile_dpbf16ps(0, 4, 6);
    if constexpr (C == 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (C == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (C == 3) _tile_dpbf16ps(3, 5, 7);
  }
};
#undef LATTN_AMX_TILE_CASES
#endif

// ---- This CPU ----

// Why the hardware path cannot run here, or nothing: no AMX-TILE / AMX-BF16 in CPUID, the OS not
// enabling the tile state (XCR0), the build's compiler without the AMX intrinsics, or Linux refusing
// the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM; asked once per process).
const std::optional<std::string>& hardware_refusal();

// tdpbf16ps on registers only (four accumulators, no loads in the loop), all `threads` OpenMP
// threads at once, best of `reps` rounds after a warm-up: GFLOP/s at 2 x 16 x 16 x 32 flops an
// instruction. Nothing where hardware_refusal() gives a reason.
std::optional<double> measure_amx_gflops(int threads, int reps);

// amx::gemm (kernels/cpu/amx_gemm.hpp) on the hardware's tiles, configured and released around it,
// for the tests that hold the hardware to the emulation; false (nothing done) where
// hardware_refusal() gives a reason.
bool hardware_gemm(int M, int N, int K, const std::uint16_t* a, std::size_t lda, const std::uint32_t* b,
                   std::size_t ldb, float* c, std::size_t ldc, bool accumulate);

}  // namespace lattn::cpu::amx

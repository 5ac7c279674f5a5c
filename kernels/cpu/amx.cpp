// The AMX tile configuration's checks, the emulated tile registers and instructions, and this CPU's
// AMX: detection, the tile data permission, and the registers-only tdpbf16ps rate
// (kernels/cpu/amx.hpp; tests/kernels/test_amx.cpp). Compiled with -mamx-tile -mamx-bf16 where the
// compiler has them (LATTN_AMX_INTRINSICS): only Hardware's functions and the rate's loop use them,
// and those run only after hardware_refusal() found nothing against it.
#include "kernels/cpu/amx.hpp"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/amx_gemm.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lattn::cpu::amx {

TileConfig uniform_config(int tiles, int rows, int colsb) {
  TileConfig c;
  c.palette = 1;
  for (int t = 0; t < tiles; ++t) {
    c.rows[t] = std::uint8_t(rows);
    c.colsb[t] = std::uint16_t(colsb);
  }
  return c;
}

// ldtilecfg's checks for palette 1 (Intel SDM, LDTILECFG): a palette it knows, reserved bytes zero,
// each of the eight tiles within 16 rows of 64 bytes and either configured in both or in neither,
// tiles 8 .. 15 unconfigured. start_row is for restarting an interrupted load; nothing here restarts
// one, so the emulation takes 0 only.
std::optional<std::string> config_error(const TileConfig& c) {
  if (c.palette != 1) return "palette " + std::to_string(c.palette) + " (palette 1 only)";
  if (c.start_row != 0) return "start_row " + std::to_string(c.start_row) + " (0 only)";
  for (std::uint8_t r : c.reserved)
    if (r != 0) return std::string("a reserved byte is not zero");
  for (int t = 0; t < 16; ++t) {
    const std::string tile = "tile " + std::to_string(t);
    if (t >= kTiles && (c.rows[t] != 0 || c.colsb[t] != 0)) return tile + " configured: palette 1 has 8 tiles";
    if (c.rows[t] > kMaxRows) return tile + " has " + std::to_string(c.rows[t]) + " rows (at most 16)";
    if (c.colsb[t] > kMaxRowBytes) return tile + " has " + std::to_string(c.colsb[t]) + " bytes a row (at most 64)";
    if ((c.rows[t] == 0) != (c.colsb[t] == 0)) return tile + " has rows or bytes a row but not both";
  }
  return std::nullopt;
}

namespace {

float bits_float(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// DAZ on an input, FTZ on a result: a denormal becomes a zero of its sign.
float flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

float bf16_float(std::uint16_t x) { return flushed(bits_float(std::uint32_t(x) << 16)); }

struct TileState {
  TileConfig config;
  bool configured = false;
  alignas(64) std::uint8_t data[kTiles][kMaxRows * kMaxRowBytes];
};
thread_local TileState state;

[[noreturn]] void fault(const char* instruction, const std::string& why) {
  throw std::logic_error(std::string("emulated ") + instruction + ": " + why);
}

int checked_tile(const char* instruction, int tile) {
  if (!state.configured) fault(instruction, "no tile configuration loaded (ldtilecfg first)");
  if (tile < 0 || tile >= kTiles) fault(instruction, "no tile " + std::to_string(tile));
  if (state.config.rows[tile] == 0) fault(instruction, "tile " + std::to_string(tile) + " is not configured");
  return tile;
}

// The bytes of a tile row past its configured width, and its rows past its configured height, read
// zero after any instruction writes the tile.
void zero_upper(int t) {
  const int rows = state.config.rows[t], colsb = state.config.colsb[t];
  for (int r = 0; r < kMaxRows; ++r) {
    std::uint8_t* row = state.data[t] + std::size_t(r) * kMaxRowBytes;
    std::memset(row + (r < rows ? colsb : 0), 0, std::size_t(kMaxRowBytes - (r < rows ? colsb : 0)));
  }
}

}  // namespace

float dpbf16_element(float c, const std::uint16_t* a, const std::uint16_t* b, int pairs) {
  float low = 0.0f, high = 0.0f;
  for (int p = 0; p < pairs; ++p) {
    low = flushed(std::fma(bf16_float(a[2 * std::size_t(p)]), bf16_float(b[2 * std::size_t(p)]), low));
    high = flushed(std::fma(bf16_float(a[2 * std::size_t(p) + 1]), bf16_float(b[2 * std::size_t(p) + 1]), high));
  }
  // The silicon adds the two halves to each other first, then to C (measured: docs/kernels.md).
  return flushed(flushed(c) + flushed(low + high));
}

namespace emulated {

void load_config(const TileConfig& c) {
  if (auto why = config_error(c)) fault("ldtilecfg", *why);
  state.config = c;
  state.configured = true;
  std::memset(state.data, 0, sizeof state.data);
}

void release() {
  state.configured = false;
  state.config = TileConfig{};
  std::memset(state.data, 0, sizeof state.data);
}

void load(int tile, const void* base, std::size_t stride) {
  const int t = checked_tile("tileloadd", tile);
  for (int r = 0; r < state.config.rows[t]; ++r)
    std::memcpy(state.data[t] + std::size_t(r) * kMaxRowBytes,
                static_cast<const std::uint8_t*>(base) + std::size_t(r) * stride, state.config.colsb[t]);
  zero_upper(t);
}

void store(int tile, void* base, std::size_t stride) {
  const int t = checked_tile("tilestored", tile);
  for (int r = 0; r < state.config.rows[t]; ++r)
    std::memcpy(static_cast<std::uint8_t*>(base) + std::size_t(r) * stride,
                state.data[t] + std::size_t(r) * kMaxRowBytes, state.config.colsb[t]);
}

void zero(int tile) {
  const int t = checked_tile("tilezero", tile);
  std::memset(state.data[t], 0, sizeof state.data[t]);
}

// The shape checks of tdpbf16ps (#UD): C is m x n float32, A m x k pairs, B k x n pairs.
void dpbf16ps(int c, int a, int b) {
  checked_tile("tdpbf16ps", c);
  checked_tile("tdpbf16ps", a);
  checked_tile("tdpbf16ps", b);
  if (c == a || c == b || a == b) fault("tdpbf16ps", "the three tiles must be distinct");
  const TileConfig& k = state.config;
  if (k.colsb[c] % 4 || k.colsb[a] % 4 || k.colsb[b] % 4)
    fault("tdpbf16ps", "a tile's bytes a row are not a multiple of 4");
  if (k.rows[c] != k.rows[a]) fault("tdpbf16ps", "C and A differ in rows");
  if (k.colsb[a] / 4 != k.rows[b]) fault("tdpbf16ps", "A's pairs a row differ from B's rows");
  if (k.colsb[c] != k.colsb[b]) fault("tdpbf16ps", "C and B differ in bytes a row");
  const int m_rows = k.rows[c], n_cols = k.colsb[c] / 4, pairs = k.colsb[a] / 4;
  for (int m = 0; m < m_rows; ++m) {
    std::uint16_t arow[2 * kMaxRowBytes / 4];
    std::memcpy(arow, state.data[a] + std::size_t(m) * kMaxRowBytes, 4 * std::size_t(pairs));
    for (int n = 0; n < n_cols; ++n) {
      std::uint16_t bcol[2 * kMaxRowBytes / 4];
      for (int p = 0; p < pairs; ++p)
        std::memcpy(bcol + 2 * std::size_t(p), state.data[b] + std::size_t(p) * kMaxRowBytes + 4 * std::size_t(n), 4);
      float* out = reinterpret_cast<float*>(state.data[c] + std::size_t(m) * kMaxRowBytes) + n;
      *out = dpbf16_element(*out, arow, bcol, pairs);
    }
  }
  zero_upper(c);
}

}  // namespace emulated

// ---- This CPU ----

namespace {

std::optional<std::string> find_refusal() {
#if !defined(__x86_64__)
  return std::string("no AMX-BF16 on this CPU (not x86-64)");
#else
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return std::string("no AMX-BF16 on this CPU");
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
  if (!(edx & kAmxBf16) || !(edx & kAmxTile)) return std::string("no AMX-BF16 on this CPU");
  // The OS must enable the tile state: XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17))
    return std::string("AMX-BF16 present but the OS does not enable the tile state (XCR0)");
#if !defined(LATTN_AMX_INTRINSICS)
  return std::string("AMX-BF16 present but this build's compiler has no AMX intrinsics (-mamx-tile -mamx-bf16)");
#elif defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::string(
               "AMX-BF16 present but Linux refused the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  return std::nullopt;
#else
  return std::nullopt;
#endif
#endif
}

#if defined(LATTN_AMX_INTRINSICS)
double amx_loop_seconds(long iterations) {
  const TileConfig config = uniform_config(kTiles, kMaxRows, kMaxRowBytes);
  alignas(64) static const std::uint16_t operands[kMaxRows * kMaxRowBytes / 2] =
      {};  // the rate does not depend on the values
  Hardware::load_config(config);
  Hardware::load<4>(operands, kMaxRowBytes);
  Hardware::load<5>(operands, kMaxRowBytes);
  Hardware::load<6>(operands, kMaxRowBytes);
  Hardware::load<7>(operands, kMaxRowBytes);
  Hardware::zero<0>();
  Hardware::zero<1>();
  Hardware::zero<2>();
  Hardware::zero<3>();
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    Hardware::dpbf16ps<0, 4, 6>();
    Hardware::dpbf16ps<1, 4, 7>();
    Hardware::dpbf16ps<2, 5, 6>();
    Hardware::dpbf16ps<3, 5, 7>();
  }
  alignas(64) float sink[kMaxRows * kMaxRowBytes / 4];
  Hardware::store<0>(sink, kMaxRowBytes);  // the loop's results are used: it cannot be dropped
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Hardware::release();
  volatile float keep = sink[0];
  (void)keep;
  return seconds;
}
#endif

}  // namespace

const std::optional<std::string>& hardware_refusal() {
  static const std::optional<std::string> why = find_refusal();
  return why;
}

std::optional<double> measure_amx_gflops(int threads, int reps) {
  if (hardware_refusal()) return std::nullopt;
#if defined(LATTN_AMX_INTRINSICS)
  constexpr long kIters = 100000;  // 400k tdpbf16ps a thread and round: ~2 ms at 16 cycles each
  std::vector<double> slowest(std::size_t(reps + 1), 0.0);
  std::mutex mutex;
#pragma omp parallel num_threads(threads)
  for (int r = 0; r <= reps; ++r) {  // round 0: warm-up
#pragma omp barrier
    const double seconds = amx_loop_seconds(kIters);
    const std::lock_guard<std::mutex> lock(mutex);
    slowest[std::size_t(r)] = std::max(slowest[std::size_t(r)], seconds);
  }
  const double best = *std::min_element(slowest.begin() + 1, slowest.end());
  constexpr double kFlopsPerInstruction = 2.0 * 16 * 16 * 32;
  return kFlopsPerInstruction * 4 * kIters * threads / best * 1e-9;
#else
  (void)threads;
  (void)reps;
  return std::nullopt;
#endif
}

bool hardware_gemm(int M, int N, int K, const std::uint16_t* a, std::size_t lda, const std::uint32_t* b,
                   std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  if (hardware_refusal()) return false;
#if defined(LATTN_AMX_INTRINSICS)
  configure<Hardware>();
  gemm<Hardware>(M, N, K, a, lda, b, ldb, c, ldc, accumulate);
  Hardware::release();
  return true;
#else
  (void)M, (void)N, (void)K, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc, (void)accumulate;
  return false;
#endif
}

}  // namespace lattn::cpu::amx

// The runtime choices that set the CPU kernels' speed, per kernel: a few candidates each at every
// vector width, today's choice among them as the default. The kernels read the value in force at
// the active width (cpu/vec.hpp) when they are called; backends/cpu/tuning.hpp decides the values
// once per process (a table shipped per microarchitecture, a calibration cached per CPU, or these
// defaults) before the first case runs. Every candidate computes the same result up to float32
// rounding order: the test table runs each against the float64 reference (tests/test_ops.cpp).
//
// The choices (docs/performance.md, "Tuning per CPU"):
//   scan         tokens_per_walk  tokens applied to a row of the state while it is in registers
//                column_block     state columns per walked block (one or two vectors)
//                prefetch_rows    whether a tile's first column block prefetches the next group's rows
//   packed_gemm  micro_rows       rows of the register micro-tile (its columns are the panel's)
//                depth_block      depth of a packed A block and B panel (KC)
//                row_tiles        micro-tiles of rows per packed A block (MC = row_tiles x micro_rows)
//   tile_products prefetch_next   where the chunked kernels' tile products prefetch the rows the
//                                 caller reads next (the next chunk's): 1 L2, 2 L1, 0 not at all
// and two structural ones, which pick the code a product runs rather than a constant inside it:
//   chunked      products         the additive rule's chunked form (no decay, retnet): its chunk
//                                 products on the register-tiled kernels (chunked_tiled, AVX-512
//                                 only) or on OpenBLAS's sgemm (chunked_blas)
//   layer        products         the hybrid layer's projections on the packed products
//                                 (cpu/packed_gemm.hpp) or on OpenBLAS's sgemm
// A structural knob's values have names (value_label): the cache and the records write those.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "kernels/cpu/vec.hpp"

namespace lattn::cpu::tuning {

enum class Knob {
  scan_tokens_per_walk,
  scan_column_block,
  scan_prefetch_rows,
  gemm_micro_rows,
  gemm_depth_block,
  gemm_row_tiles,
  tile_prefetch_next,
  chunked_products,
  layer_products,
};
inline constexpr int kKnobs = 9;
inline constexpr std::array<Knob, kKnobs> kAllKnobs = {
    Knob::scan_tokens_per_walk, Knob::scan_column_block,  Knob::scan_prefetch_rows,
    Knob::gemm_micro_rows,      Knob::gemm_depth_block,   Knob::gemm_row_tiles,
    Knob::tile_prefetch_next,   Knob::chunked_products,   Knob::layer_products};

// The structural knobs' values.
inline constexpr int kProductsPacked = 0;  // this project's kernels: the register tiles, the packed products
inline constexpr int kProductsBlas = 1;    // OpenBLAS's sgemm

// The kernel a knob belongs to ("scan", "packed_gemm") and its own name ("tokens_per_walk").
const char* kernel_of(Knob knob);
const char* name_of(Knob knob);
// A structural knob's name for a value ("packed", "blas"); null for a knob whose values are numbers.
const char* value_label(Knob knob, int value);
// The value a label names, or -1 (a numeric knob's label is its number).
int value_from_label(Knob knob, const std::string& label);
// What the cache and records write: the label, else the number.
std::string value_text(Knob knob, int value);

// The values a knob may take at a width, and the default among them (what the kernels ran before
// the choices were made at run time, and what a CPU with no shipped or calibrated entry gets).
const std::vector<int>& candidates(Knob knob, Vec vec);
int default_value(Knob knob, Vec vec);

// One value per knob, at one width.
struct Setting {
  std::array<int, kKnobs> values{};
  int operator[](Knob knob) const { return values[std::size_t(knob)]; }
  int& operator[](Knob knob) { return values[std::size_t(knob)]; }
  bool operator==(const Setting& other) const { return values == other.values; }
};
Setting defaults(Vec vec);
// Empty when every value is one of its knob's candidates at vec, else what is wrong (one line).
std::string invalid(const Setting& setting, Vec vec);

// The setting in force at a width (the defaults until set). Not thread-safe against running kernels:
// set it before the cases run, outside parallel regions.
const Setting& current(Vec vec);
void set(Vec vec, const Setting& setting);  // throws std::invalid_argument when invalid(...) says so
// The value in force at the active width: what a kernel reads.
int value(Knob knob);

// Tests: one setting at one width for the scope, the previous one restored after.
class Scoped {
 public:
  Scoped(Vec vec, const Setting& setting) : vec_(vec), saved_(current(vec)) { set(vec, setting); }
  ~Scoped() { set(vec_, saved_); }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  Vec vec_;
  Setting saved_;
};

}  // namespace lattn::cpu::tuning

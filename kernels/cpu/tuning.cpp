#include "kernels/cpu/tuning.hpp"

#include <stdexcept>

namespace lattn::cpu::tuning {
namespace {

struct KnobTable {
  const char* kernel;
  const char* name;
  // Candidates per width (generic, avx2, avx512), the default first.
  std::array<std::vector<int>, 3> candidates;
};

// Why these candidates:
// - tokens_per_walk: each token held in registers takes 2 x (columns / lanes) of them for its column
//   operand and output; 6 fills AVX-512's 32 with two rows and their broadcasts, fewer leave room
//   but load and store each row for fewer updates. AVX2's 16 registers take 2 at most.
// - column_block: two vectors per row (the default) or one (twice the row walks, half the state
//   in flight: a smaller L1 or fewer load ports may prefer it).
// - prefetch_rows: on where the row walk outruns the hardware prefetchers, off where they keep up.
// - micro_rows: 14 x 32 needs 28 accumulators and 14 broadcasts per 2 panel loads; fewer rows load
//   the panel more often per FMA, which a CPU with more load ports than FMA ports can afford.
// - depth_block / row_tiles: the KC x 32 panel in L1 and the MC x KC block of A in L2, whose sizes
//   differ between microarchitectures.
// - prefetch_next: the tile products (AVX-512 only) spread prefetches of the next chunk's rows over
//   their micro-tiles, into L2 (the default); into L1 or not at all are the others.
// - chunked.products: the register tiles skip the causal zeros and fuse products, but sgemm may
//   run a wider or better-scheduled kernel on a CPU with two 512-bit FMA ports; the tiles exist at
//   AVX-512 only, so the narrower widths have sgemm alone.
// - layer.products: the packed products (measured 1.03-1.10x OpenBLAS on Zen 4 at AVX-512) or
//   OpenBLAS's own kernels, which at AVX2 the 6 x 16 micro-tile was not shown to beat (the
//   default there); the generic width has no packed kernel.
const std::array<KnobTable, kKnobs>& table() {
  static const std::array<KnobTable, kKnobs> t = {{
      {"scan", "tokens_per_walk", {{{1}, {2, 1}, {6, 5, 4}}}},
      {"scan", "column_block", {{{64}, {16, 8}, {32, 16}}}},
      {"scan", "prefetch_rows", {{{1}, {1, 0}, {1, 0}}}},
      {"packed_gemm", "micro_rows", {{{4}, {6, 4}, {14, 12, 8}}}},
      {"packed_gemm", "depth_block", {{{256}, {256, 128, 384}, {256, 128, 384}}}},
      {"packed_gemm", "row_tiles", {{{16}, {20, 10, 40}, {10, 5, 20}}}},
      {"tile_products", "prefetch_next", {{{1}, {1}, {1, 2, 0}}}},
      {"chunked", "products", {{{kProductsBlas}, {kProductsBlas}, {kProductsPacked, kProductsBlas}}}},
      {"layer", "products", {{{kProductsBlas}, {kProductsBlas, kProductsPacked}, {kProductsPacked, kProductsBlas}}}},
  }};
  return t;
}

std::size_t width_index(Vec vec) { return std::size_t(vec); }

std::array<Setting, 3>& settings() {
  static std::array<Setting, 3> s = {defaults(Vec::generic), defaults(Vec::avx2), defaults(Vec::avx512)};
  return s;
}

}  // namespace

const char* kernel_of(Knob knob) { return table()[std::size_t(knob)].kernel; }
const char* name_of(Knob knob) { return table()[std::size_t(knob)].name; }

const char* value_label(Knob knob, int value) {
  if (knob != Knob::chunked_products && knob != Knob::layer_products) return nullptr;
  if (value == kProductsPacked) return "packed";
  if (value == kProductsBlas) return knob == Knob::layer_products ? "openblas" : "blas";
  return nullptr;
}

int value_from_label(Knob knob, const std::string& label) {
  for (int v : {kProductsPacked, kProductsBlas})
    if (const char* l = value_label(knob, v); l && label == l) return v;
  if (knob == Knob::chunked_products || knob == Knob::layer_products) return -1;
  for (const std::vector<int>& width : table()[std::size_t(knob)].candidates)
    for (int v : width)
      if (std::to_string(v) == label) return v;
  return -1;
}

std::string value_text(Knob knob, int value) {
  const char* label = value_label(knob, value);
  return label ? std::string(label) : std::to_string(value);
}

const std::vector<int>& candidates(Knob knob, Vec vec) {
  return table()[std::size_t(knob)].candidates[width_index(vec)];
}

int default_value(Knob knob, Vec vec) { return candidates(knob, vec).front(); }

Setting defaults(Vec vec) {
  Setting s;
  for (Knob k : kAllKnobs) s[k] = default_value(k, vec);
  return s;
}

std::string invalid(const Setting& setting, Vec vec) {
  for (Knob k : kAllKnobs) {
    const std::vector<int>& c = candidates(k, vec);
    bool found = false;
    for (int v : c) found = found || v == setting[k];
    if (!found) {
      std::string list;
      for (int v : c) list += (list.empty() ? "" : ", ") + value_text(k, v);
      return std::string(kernel_of(k)) + "." + name_of(k) + " " + value_text(k, setting[k]) + " is not one of " +
             to_string(vec) + "'s candidates (" + list + ")";
    }
  }
  return "";
}

const Setting& current(Vec vec) { return settings()[width_index(vec)]; }

void set(Vec vec, const Setting& setting) {
  const std::string why = invalid(setting, vec);
  if (!why.empty()) throw std::invalid_argument(why);
  settings()[width_index(vec)] = setting;
}

int value(Knob knob) { return current(active_vec())[knob]; }

}  // namespace lattn::cpu::tuning

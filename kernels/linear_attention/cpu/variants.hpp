// The CPU's kernel variants of the linear-attention op, one table per form (cpu/variants.cpp).
// scan_forward, chunked_forward and the rest of kernels.hpp run the first row of their form's table
// that takes the problem; the backend's impl rows skip a case no row takes, with the table's reason.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"
#include "kernels/linear_attention/variants.hpp"

namespace lattn::cpu {

// keep / kept: the chunk states a forward leaves for the backward (kept_states_bytes of them,
// allocated by the caller), or null; a variant whose kept_states_bytes is 0 takes null only.
// A row whose takes.shapes is false runs the shapes of docs/spec.md section 1c (grouped q/k heads,
// Dk != Dv, packed documents) through the gather adapter (cpu/shape_gather.hpp).
struct CpuVariant {
  std::string name;  // what records and --list-cases show ("chunked_tiled")
  VariantTakes takes;
  std::function<void(const Problem&, const ForwardArgs<float>&, Allocator&, float* keep)> forward = nullptr;
  std::function<void(const Problem&, const BackwardArgs<float>&, Allocator&, const float* kept)> backward = nullptr;
  // Peak scratch of one call in closed form (tests hold the kernels to it).
  std::function<std::size_t(const Problem&, bool keep)> forward_workspace_bytes = nullptr;
  std::function<std::size_t(const Problem&, bool kept)> backward_workspace_bytes = nullptr;
  // The chunk states the forward can keep for the backward; null: it keeps none.
  std::function<std::size_t(const Problem&)> kept_states_bytes = nullptr;
};

// The table of `form` ("scan" or "chunked"); empty for any other name.
const std::vector<CpuVariant>& cpu_variants(const std::string& form);

// Puts `row` first in `form`'s table, so that it runs every problem it takes: how a test registers
// a variant of its own (tests/kernels/test_variants.cpp). Not thread-safe: call it before cases run, and
// remove_cpu_variant after.
void add_cpu_variant(const std::string& form, CpuVariant row);
void remove_cpu_variant(const std::string& form, const std::string& name);

// The row of `form`'s table that runs `problem`, or null with `why` set to the table's reason.
const CpuVariant* cpu_variant(const std::string& form, const Problem& problem, std::string* why = nullptr);

// What runs `problem`: the row that takes it, wrapped in the gather adapter when the problem is not
// square dense and the row does not take its shape itself. Throws std::logic_error with the
// table's reason when no row takes it (the impl rows skip such cases first, so only a direct
// caller can meet it).
CpuVariant cpu_variant_for(const std::string& form, const Problem& problem);

}  // namespace lattn::cpu

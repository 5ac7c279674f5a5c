// What a kernel variant of the linear-attention op takes: the rules and decays it computes, and a
// check of everything else (the shape keys, the machine's vector width). Each backend keeps one
// table of variants per form (cpu/variants.cpp, cuda/variants.cpp); its impl rows ask the table,
// and a case no variant takes is skipped with the reason the table gives, never run by a variant
// that does not compute it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/linear_attention/problem.hpp"

namespace lattn {

struct VariantTakes {
  std::vector<Rule> rules;
  std::vector<Decay> decays;
  // Why the variant cannot take a problem whose rule and decay it computes (its dim, the machine),
  // or nothing; null: it takes every such problem.
  std::optional<std::string> (*limits)(const Problem&) = nullptr;
  // Whether it takes the shapes of docs/spec.md section 1c (grouped q/k heads, dim_v != dim,
  // packed documents); false: square dense problems only.
  bool shapes = false;
  // Whether it computes RWKV-6's bonus form (Problem::bonus, docs/spec.md section 1g).
  bool bonus = false;
  // Whether it takes DeltaProduct's n > 1 writes per token (Problem::householder) itself.
  bool householder = false;
};

// Why `takes` refuses `problem` (its rule, its decay, or the limits' reason), or nothing.
inline std::optional<std::string> variant_refusal(const VariantTakes& takes, const Problem& problem) {
  const auto has = [](const auto& list, auto value) {
    for (auto v : list)
      if (v == value) return true;
    return false;
  };
  const auto names = [](const auto& list) {
    std::string out;
    for (auto v : list) out += (out.empty() ? "" : ", ") + to_string(v);
    return out;
  };
  if (!has(takes.rules, problem.rule)) return "rule " + names(takes.rules) + " only";
  if (!has(takes.decays, problem.decay)) return "decay " + names(takes.decays) + " only";
  if (problem.bonus && !takes.bonus) return std::string("no bonus (RWKV-6) form");
  if (problem.householder > 1 && !takes.householder) return std::string("one Householder write per token only");
  if (!takes.shapes && !problem.square_dense())
    return std::string("square dense problems only (heads_k = heads, dim_v = dim, no packed documents)");
  return takes.limits ? takes.limits(problem) : std::nullopt;
}

// The first row of `table` that takes `problem`, or null with `why` set to the table's reason:
// "no <what> variant takes <rule, decay>: NAME (refusal); ...". Rows have `name` and `takes`.
template <class Row>
const Row* choose_variant(const std::vector<Row>& table, const Problem& problem, const std::string& what,
                          std::string* why) {
  if (!why) {
    for (const Row& row : table)
      if (!variant_refusal(row.takes, problem)) return &row;
    return nullptr;
  }
  std::string refusals;
  for (const Row& row : table) {
    const std::optional<std::string> refused = variant_refusal(row.takes, problem);
    if (!refused) return &row;
    refusals += (refusals.empty() ? "" : "; ") + row.name + " (" + *refused + ")";
  }
  *why = "no " + what + " variant takes rule " + to_string(problem.rule) + ", decay " + to_string(problem.decay) +
           ", dim " + std::to_string(problem.dim) + (refusals.empty() ? ": the table is empty" : ": " + refusals);
  return nullptr;
}

}  // namespace lattn

// The CPU's variants of the linear-attention op: which kernel runs which (rule, decay) in each
// form, and the entry points of kernels.hpp, which ask these tables. A new decay or rule is a row
// here naming its kernel file's functions; a case no row takes is refused with the table's
// reason. Rows are tried in order: the first that takes the problem runs it.
#include "kernels/linear_attention/cpu/variants.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/tuning.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_tiled.hpp"
#include "kernels/linear_attention/cpu/delta.hpp"
#include "kernels/linear_attention/cpu/dplr.hpp"
#include "kernels/linear_attention/cpu/householder.hpp"
#include "kernels/linear_attention/householder.hpp"
#include "kernels/linear_attention/cpu/scan/scan.hpp"
#include "kernels/linear_attention/cpu/shape_gather.hpp"
#include "kernels/linear_attention/cpu/trapezoidal.hpp"

namespace lattn::cpu {
namespace {

constexpr Decay kAllDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};
const std::vector<Decay> all_decays(std::begin(kAllDecays), std::end(kAllDecays));

std::size_t bytes(std::size_t floats) { return floats * sizeof(float); }

// The register-tiled products need AVX-512 compiled in and active, and the tuning's chunked.products
// (kernels/cpu/tuning.hpp) to choose them; OpenBLAS runs the rest.
bool tiled_products() { return tiles_active() && tuning::value(tuning::Knob::chunked_products) == tuning::kProductsPacked; }
std::optional<std::string> needs_tiles(const Problem&) {
  if (tiled_products()) return std::nullopt;
  if (tiles_active()) return std::string("the tuning's chunked.products is blas");
  return std::string("the AVX-512 register tiles are not active at vector width ") + to_string(active_vec());
}
std::optional<std::string> without_tiles(const Problem&) {
  if (!tiled_products()) return std::nullopt;
  return std::string("chunked_tiled runs where the AVX-512 register tiles are active and chosen");
}

// RWKV-6's bonus form (docs/spec.md section 1g) is computed for vector gates only.
std::optional<std::string> bonus_vector_gates(const Problem& p) {
  if (!p.bonus || p.decay == Decay::vector) return std::nullopt;
  return std::string("the bonus form with vector gates only");
}

std::vector<CpuVariant> scan_table() {
  return {
      {"scan_dplr", {{Rule::dplr}, all_decays, nullptr, true},
       [](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float*) { scan_dplr_forward(p, a, m); },
       [](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float*) { scan_dplr_backward(p, a, m); },
       [](const Problem& p, bool) { return bytes(scan_dplr_forward_floats(p)); },
       [](const Problem& p, bool) { return bytes(scan_dplr_backward_floats(p)); }},
      {"scan_delta", {{Rule::delta}, all_decays, nullptr, true},
       [](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float*) { scan_delta_forward(p, a, m); },
       [](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float*) { scan_delta_backward(p, a, m); },
       [](const Problem& p, bool) { return bytes(scan_delta_forward_floats(p)); },
       [](const Problem& p, bool) { return bytes(scan_delta_backward_floats(p)); }},
      {"scan_columns", {{Rule::additive}, all_decays, bonus_vector_gates, true, true},
       [](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float*) { scan_columns_forward(p, a, m); },
       [](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float*) { scan_columns_backward(p, a, m); },
       [](const Problem& p, bool) { return bytes(scan_columns_forward_floats(p)); },
       [](const Problem& p, bool) { return bytes(scan_columns_backward_floats(p)); }},
  };
}

std::vector<CpuVariant> chunked_table() {
  return {
      // It keeps no chunk states: its backward recomputes them, one slice at a time per thread.
      {"chunked_dplr", {{Rule::dplr}, all_decays, nullptr, true},
       [](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep) {
         if (keep) throw std::logic_error("chunked_dplr keeps no chunk states");
         chunked_dplr_forward(p, a, m);
       },
       [](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept) {
         if (kept) throw std::logic_error("chunked_dplr takes no kept chunk states");
         chunked_dplr_backward(p, a, m);
       },
       [](const Problem& p, bool) { return bytes(chunked_dplr_forward_floats(p)); },
       [](const Problem& p, bool) { return bytes(chunked_dplr_backward_floats(p)); }},
      {"chunked_delta", {{Rule::delta}, all_decays, nullptr, true}, chunked_delta_forward, chunked_delta_backward,
       [](const Problem& p, bool) { return bytes(chunked_delta_forward_floats(p)); },
       [](const Problem& p, bool kept) { return bytes(chunked_delta_backward_floats(p, kept)); },
       [](const Problem& p) { return bytes(chunked_delta_kept_states_floats(p)); }},
      {"chunked_gated", {{Rule::additive}, {Decay::scalar, Decay::vector}, bonus_vector_gates, true, true},
       chunked_gated_forward,
       chunked_gated_backward, [](const Problem& p, bool) { return bytes(chunked_gated_forward_floats(p)); },
       [](const Problem& p, bool kept) { return bytes(chunked_gated_backward_floats(p, kept)); },
       [](const Problem& p) { return bytes(chunked_gated_kept_states_floats(p)); }},
      {"chunked_tiled", {{Rule::additive}, {Decay::none, Decay::retnet}, needs_tiles, true}, chunked_tiled_forward,
       chunked_tiled_backward, [](const Problem& p, bool keep) { return bytes(chunked_tiled_forward_floats(p, keep)); },
       [](const Problem& p, bool kept) { return bytes(chunked_tiled_backward_floats(p, kept)); },
       [](const Problem& p) { return bytes(chunked_tiled_kept_states_floats(p)); }},
      // One thread's scratch per head-parallel thread; it keeps no chunk states.
      {"chunked_blas", {{Rule::additive}, {Decay::none, Decay::retnet}, without_tiles},
       [](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep) {
         if (keep) throw std::logic_error("chunked_blas keeps no chunk states");
         chunked_blas_forward(p, a, m);
       },
       [](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept) {
         if (kept) throw std::logic_error("chunked_blas takes no kept chunk states");
         chunked_blas_backward(p, a, m);
       },
       [](const Problem& p, bool) { return std::size_t(head_parallel_threads(p)) * bytes(chunked_blas_forward_floats(p)); },
       [](const Problem& p, bool) { return std::size_t(head_parallel_threads(p)) * bytes(chunked_blas_backward_floats(p)); }},
  };
}

// The trapezoidal rule's row of a table: the rule on the table's row `inner` (cpu/trapezoidal.hpp).
std::vector<CpuVariant> with_trapezoidal(std::vector<CpuVariant> rows, const std::string& name, const std::string& inner) {
  for (const CpuVariant& row : rows)
    if (row.name == inner) {
      rows.insert(rows.begin(), trapezoidal_variant(name, row));
      return rows;
    }
  throw std::logic_error("no CPU variant " + inner + " for " + name);
}

std::vector<CpuVariant>& table_of(const std::string& form) {
  static std::vector<CpuVariant> scan = with_trapezoidal(scan_table(), "scan_trapezoidal", "scan_columns"),
                                 chunked = with_trapezoidal(chunked_table(), "chunked_trapezoidal", "chunked_gated"),
                                 none;
  if (form == "scan") return scan;
  if (form == "chunked") return chunked;
  none.clear();
  return none;
}

}  // namespace

const std::vector<CpuVariant>& cpu_variants(const std::string& form) { return table_of(form); }

void add_cpu_variant(const std::string& form, CpuVariant row) {
  if (form != "scan" && form != "chunked") throw std::logic_error("add_cpu_variant: no form " + form);
  std::vector<CpuVariant>& table = table_of(form);
  table.insert(table.begin(), std::move(row));
}

void remove_cpu_variant(const std::string& form, const std::string& name) {
  std::vector<CpuVariant>& table = table_of(form);
  table.erase(std::remove_if(table.begin(), table.end(), [&](const CpuVariant& v) { return v.name == name; }),
              table.end());
}

// A row that does not take a shape itself runs it through the gather adapter, as the square dense
// problem the adapter hands it: the row is chosen by that problem.
// DeltaProduct's problems (householder > 1) are the delta rule's over their interleaved steps: the row
// that takes those runs them, through cpu/householder.hpp's adapter.
const CpuVariant* cpu_variant(const std::string& form, const Problem& problem, std::string* why) {
  if (problem.householder > 1) return cpu_variant(form, householder_steps(problem), why);
  const CpuVariant* native = choose_variant(cpu_variants(form), problem, "CPU " + form, nullptr);
  if (native || problem.square_dense()) return native ? native : choose_variant(cpu_variants(form), problem, "CPU " + form, why);
  return choose_variant(cpu_variants(form), gathered_problem(problem), "CPU " + form, why);
}

CpuVariant cpu_variant_for(const std::string& form, const Problem& problem) {
  if (problem.householder > 1) return householder_stepped(cpu_variant_for(form, householder_steps(problem)));
  std::string why;
  const CpuVariant* v = cpu_variant(form, problem, &why);
  if (!v) throw std::logic_error(why);
  if (problem.square_dense() || v->takes.shapes) return *v;
  return gathered(*v);
}

// ---- kernels.hpp's entry points ----

bool chunked_uses_tiles() { return tiled_products(); }

void scan_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  cpu_variant_for("scan", p).forward(p, a, allocator, nullptr);
}
void scan_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  cpu_variant_for("scan", p).backward(p, a, allocator, nullptr);
}
std::size_t scan_forward_workspace_bytes(const Problem& p) {
  return cpu_variant_for("scan", p).forward_workspace_bytes(p, false);
}
std::size_t scan_backward_workspace_bytes(const Problem& p) {
  return cpu_variant_for("scan", p).backward_workspace_bytes(p, false);
}

std::size_t chunked_kept_states_bytes(const Problem& p) {
  const CpuVariant v = cpu_variant_for("chunked", p);
  return v.kept_states_bytes ? v.kept_states_bytes(p) : 0;
}
void chunked_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  cpu_variant_for("chunked", p).forward(p, a, allocator, keep);
}
void chunked_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator, const float* kept) {
  cpu_variant_for("chunked", p).backward(p, a, allocator, kept);
}
std::size_t chunked_forward_workspace_bytes(const Problem& p, bool keep) {
  return cpu_variant_for("chunked", p).forward_workspace_bytes(p, keep);
}
std::size_t chunked_backward_workspace_bytes(const Problem& p, bool kept) {
  return cpu_variant_for("chunked", p).backward_workspace_bytes(p, kept);
}
std::size_t chunked_forward_backward_workspace_bytes(const Problem& p) {
  const std::size_t kept = chunked_kept_states_bytes(p);
  return kept + std::max(chunked_forward_workspace_bytes(p, kept > 0), chunked_backward_workspace_bytes(p, kept > 0));
}

}  // namespace lattn::cpu

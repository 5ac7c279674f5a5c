// The CPU's bf16 variants of the linear-attention op (cpu/bf16.hpp): the native rows of each form,
// tried in order, then every float32 variant behind the converter; and which AMX path runs.
#include <stdexcept>
#include <vector>

#include "kernels/cpu/amx.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {
namespace {

std::optional<bool> forced_support;
std::optional<AmxPath> forced_amx;

// The native chunked forwards keep no chunk states: their backward recomputes them, the row's own
// where it has one for the problem, else the float32 table's, converted.
// own: the row's own backward where `own.takes` says so (its scratch own.floats), else the
// converted float32 one.
struct OwnBackward {
  std::function<bool(const Problem&)> takes = nullptr;
  std::function<void(const Problem&, const Bf16BackwardArgs&, Allocator&)> run = nullptr;
  std::function<std::size_t(const Problem&)> floats = nullptr;
};

CpuBf16Variant native_forward(const std::string& name, std::optional<std::string> (*limits)(const Problem&),
                              const std::function<void(const Problem&, const Bf16ForwardArgs&, Allocator&)>& forward,
                              const std::function<std::size_t(const Problem&)>& forward_floats,
                              const OwnBackward& own = {}) {
  CpuBf16Variant v;
  v.name = name;
  v.takes = {{Rule::additive}, {Decay::none, Decay::retnet, Decay::scalar}, limits, true};
  v.forward = [name, forward](const Problem& p, const Bf16ForwardArgs& a, Allocator& m, float* keep) {
    if (keep) throw std::logic_error(name + " keeps no chunk states");
    forward(p, a, m);
  };
  v.backward = [name, own](const Problem& p, const Bf16BackwardArgs& a, Allocator& m, const float* kept) {
    if (kept) throw std::logic_error(name + " takes no kept chunk states");
    if (own.takes && own.takes(p)) return own.run(p, a, m);
    bf16_converted(cpu_variant_for("chunked", p)).backward(p, a, m, nullptr);
  };
  v.forward_workspace_bytes = [forward_floats](const Problem& p, bool) { return forward_floats(p) * sizeof(float); };
  v.backward_workspace_bytes = [own](const Problem& p, bool) {
    if (own.takes && own.takes(p)) return own.floats(p) * sizeof(float);
    return bf16_converted(cpu_variant_for("chunked", p)).backward_workspace_bytes(p, false);
  };
  v.own_backward = own.takes;
  return v;
}

std::optional<std::string> chunked_amx_takes(const Problem& p) {
  if (auto why = chunked_amx_limits(p)) return why;
  return amx_refusal();
}

std::optional<std::string> chunked_amx_gated_takes(const Problem& p) {
  if (auto why = chunked_amx_gated_limits(p)) return why;
  return amx_refusal();
}

std::optional<std::string> chunked_amx_delta_takes(const Problem& p) {
  if (auto why = chunked_amx_delta_limits(p)) return why;
  return amx_refusal();
}

CpuBf16Variant taking(CpuBf16Variant v, std::vector<Rule> rules, std::vector<Decay> decays) {
  v.takes.rules = std::move(rules);
  v.takes.decays = std::move(decays);
  return v;
}

// AMX tiles first where the CPU has them (or a test forces the emulation): the additive rule with
// decays none, retnet and scalar, then with vector gates, then the delta rule; then AVX512-BF16.
std::vector<CpuBf16Variant> native_chunked() {
  return {
      native_forward(
          "chunked_amx", chunked_amx_takes,
          [](const Problem& p, const Bf16ForwardArgs& a, Allocator& m) { chunked_amx_forward(p, a, m, amx_path()); },
          chunked_amx_forward_floats,
          {chunked_amx_backward_takes,
           [](const Problem& p, const Bf16BackwardArgs& a, Allocator& m) { chunked_amx_backward(p, a, m, amx_path()); },
           chunked_amx_backward_floats}),
      taking(native_forward("chunked_amx_gated", chunked_amx_gated_takes,
                            [](const Problem& p, const Bf16ForwardArgs& a, Allocator& m) {
                              chunked_amx_gated_forward(p, a, m, amx_path());
                            },
                            chunked_amx_gated_forward_floats,
                            {[](const Problem&) { return true; },
                             [](const Problem& p, const Bf16BackwardArgs& a, Allocator& m) {
                               chunked_amx_gated_backward(p, a, m, amx_path());
                             },
                             chunked_amx_gated_backward_floats}),
             {Rule::additive}, {Decay::vector}),
      taking(native_forward("chunked_amx_delta", chunked_amx_delta_takes,
                            [](const Problem& p, const Bf16ForwardArgs& a, Allocator& m) {
                              chunked_amx_delta_forward(p, a, m, amx_path());
                            },
                            chunked_amx_delta_forward_floats,
                            {chunked_amx_delta_backward_takes,
                             [](const Problem& p, const Bf16BackwardArgs& a, Allocator& m) {
                               chunked_amx_delta_backward(p, a, m, amx_path());
                             },
                             chunked_amx_delta_backward_floats}),
             {Rule::delta}, {Decay::none, Decay::retnet, Decay::scalar, Decay::vector}),
      native_forward("chunked_bf16", chunked_bf16_limits, chunked_bf16_forward, chunked_bf16_forward_floats)};
}

const std::vector<CpuBf16Variant>& native_table(const std::string& form) {
  static const std::vector<CpuBf16Variant> chunked = native_chunked(), none;
  return form == "chunked" ? chunked : none;
}

}  // namespace

bool bf16_supported() {
  if (forced_support) return *forced_support;
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

void set_bf16_override(std::optional<bool> supported) { forced_support = supported; }

std::optional<std::string> amx_refusal() {
  if (forced_amx == AmxPath::emulated) return std::nullopt;
  if (forced_amx == AmxPath::none) return std::string("AMX turned off (set_amx_override)");
  return amx::hardware_refusal();
}

AmxPath amx_path() { return forced_amx == AmxPath::emulated ? AmxPath::emulated : AmxPath::hardware; }

void set_amx_override(std::optional<AmxPath> path) { forced_amx = path; }

std::optional<std::string> cpu_bf16_refusal(const std::string& form, const Problem& problem) {
  if (!bf16_supported()) return std::string("bf16 on the CPU needs AVX512-BF16, which this CPU lacks");
  if (choose_variant(native_table(form), problem, "CPU bf16 " + form, nullptr)) return std::nullopt;
  std::string why;
  if (!cpu_variant(form, problem, &why)) return why;
  return std::nullopt;
}

std::optional<CpuBf16Variant> cpu_amx_chunked_variant(const Problem& problem, std::string* why) {
  static const std::vector<CpuBf16Variant> amx_rows = [] {
    std::vector<CpuBf16Variant> rows;
    for (const CpuBf16Variant& v : native_table("chunked"))
      if (v.name.rfind("chunked_amx", 0) == 0) rows.push_back(v);
    return rows;
  }();
  const CpuBf16Variant* v = choose_variant(amx_rows, problem, "CPU bf16 chunked on AMX tiles", why);
  if (!v) return std::nullopt;
  if (!(v->own_backward && v->own_backward(problem))) {
    if (why) *why = v->name + " has no backward of its own for this problem";
    return std::nullopt;
  }
  return *v;
}

CpuBf16Variant cpu_bf16_variant_for(const std::string& form, const Problem& problem) {
  if (auto why = cpu_bf16_refusal(form, problem)) throw std::logic_error(*why);
  if (const CpuBf16Variant* native = choose_variant(native_table(form), problem, "CPU bf16 " + form, nullptr)) {
    CpuBf16Variant v = *native;
    if (!(v.own_backward && v.own_backward(problem)))
      v.backward_name = bf16_converted(cpu_variant_for(form, problem)).name;
    return v;
  }
  return bf16_converted(cpu_variant_for(form, problem));
}

}  // namespace lattn::cpu

// The CPU's bf16 variants of the linear-attention op (cpu/bf16.hpp): the native rows of each form,
// tried in order, then every float32 variant behind the converter.
#include <stdexcept>
#include <vector>

#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"

namespace lattn::cpu {
namespace {

std::optional<bool> forced_support;

// The native chunked forward keeps no chunk states: its backward is the float32 table's, converted,
// recomputing them.
std::vector<CpuBf16Variant> native_chunked() {
  CpuBf16Variant v;
  v.name = "chunked_bf16";
  v.takes = {{Rule::additive}, {Decay::none, Decay::retnet, Decay::scalar}, chunked_bf16_limits, true};
  v.forward = [](const Problem& p, const Bf16ForwardArgs& a, Allocator& m, float* keep) {
    if (keep) throw std::logic_error("chunked_bf16 keeps no chunk states");
    chunked_bf16_forward(p, a, m);
  };
  v.backward = [](const Problem& p, const Bf16BackwardArgs& a, Allocator& m, const float* kept) {
    if (kept) throw std::logic_error("chunked_bf16 takes no kept chunk states");
    bf16_converted(cpu_variant_for("chunked", p)).backward(p, a, m, nullptr);
  };
  v.forward_workspace_bytes = [](const Problem& p, bool) { return chunked_bf16_forward_floats(p) * sizeof(float); };
  v.backward_workspace_bytes = [](const Problem& p, bool) {
    return bf16_converted(cpu_variant_for("chunked", p)).backward_workspace_bytes(p, false);
  };
  return {v};
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

std::optional<std::string> cpu_bf16_refusal(const std::string& form, const Problem& problem) {
  if (!bf16_supported()) return std::string("bf16 on the CPU needs AVX512-BF16, which this CPU lacks");
  if (choose_variant(native_table(form), problem, "CPU bf16 " + form, nullptr)) return std::nullopt;
  std::string why;
  if (!cpu_variant(form, problem, &why)) return why;
  return std::nullopt;
}

CpuBf16Variant cpu_bf16_variant_for(const std::string& form, const Problem& problem) {
  if (auto why = cpu_bf16_refusal(form, problem)) throw std::logic_error(*why);
  if (const CpuBf16Variant* native = choose_variant(native_table(form), problem, "CPU bf16 " + form, nullptr)) {
    CpuBf16Variant v = *native;
    v.backward_name = bf16_converted(cpu_variant_for(form, problem)).name;
    return v;
  }
  return bf16_converted(cpu_variant_for(form, problem));
}

}  // namespace lattn::cpu

// bf16 cases of the linear-attention op on the CPU (docs/spec.md section 3): q, k, v and dO arrive
// as bf16 (raw 16-bit patterns, the upper half of the float32 they stand for); h0, dhT, the gates,
// beta and every output are float32, as the op's table says (kernels/linear_attention/op.cpp), and
// every product accumulates in float32 with the state kept in float32.
//
// Each form has its own bf16 table (cpu/bf16_variants.cpp), tried in order: the native kernels
// first (on AMX tiles where the CPU has AMX-BF16: cpu/chunked/chunked_amx.cpp for the additive rule's
// decays none, retnet and scalar, chunked_amx_gated.cpp for vector gates, chunked_amx_delta.cpp for
// the delta rule; then cpu/chunked/chunked_bf16.cpp: the additive rule's chunked forward on
// AVX512-BF16 dot products),
// then, for every problem the float32 table takes, that float32 variant behind a converter
// (cpu/bf16_convert.cpp): the bf16 token tensors are widened into float32 scratch from the
// allocator before the float32 kernel runs, and the records name it "<float32 variant>+bf16cvt".
// bf16 runs only where the CPU has AVX512-BF16; elsewhere every bf16 case is declined with the
// reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/workspace.hpp"
#include "kernels/linear_attention/problem.hpp"
#include "kernels/linear_attention/variants.hpp"

namespace lattn::cpu {

using Bf16 = std::uint16_t;  // a bfloat16's bits

struct Bf16ForwardArgs {
  const Bf16* q;
  const Bf16* k;
  const Bf16* v;
  const float* h0;
  float* o;
  float* hT;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* a = nullptr;  // rule dplr's a and b (float32, as g and beta)
  const float* b = nullptr;
  const float* dt = nullptr;  // rule trapezoidal's (float32, as g)
  const float* trap = nullptr;
  const float* u = nullptr;  // RWKV-6's bonus (Problem::bonus), float32 as g
};

struct Bf16BackwardArgs {
  const Bf16* q;
  const Bf16* k;
  const Bf16* v;
  const float* h0;
  const Bf16* dO;
  const float* dhT;
  float* dq;
  float* dk;
  float* dv;
  float* dh0;
  const float* g = nullptr;
  float* dg = nullptr;
  const float* beta = nullptr;
  float* dbeta = nullptr;
  const float* a = nullptr;  // rule dplr's a and b and their gradients
  const float* b = nullptr;
  float* da = nullptr;
  float* db = nullptr;
  const float* dt = nullptr;  // rule trapezoidal's inputs and gradients
  const float* trap = nullptr;
  float* ddt = nullptr;
  float* dtrap = nullptr;
  const float* u = nullptr;  // RWKV-6's bonus and its gradient (Problem::bonus)
  float* du = nullptr;
};

// A bf16 variant: as CpuVariant (cpu/variants.hpp), its calls taking bf16 token tensors.
struct CpuBf16Variant {
  std::string name;
  VariantTakes takes;
  std::function<void(const Problem&, const Bf16ForwardArgs&, Allocator&, float* keep)> forward = nullptr;
  std::function<void(const Problem&, const Bf16BackwardArgs&, Allocator&, const float* kept)> backward = nullptr;
  std::function<std::size_t(const Problem&, bool keep)> forward_workspace_bytes = nullptr;
  std::function<std::size_t(const Problem&, bool kept)> backward_workspace_bytes = nullptr;
  std::function<std::size_t(const Problem&)> kept_states_bytes = nullptr;
  // The variant whose backward this one's backward is, where it is another's (the native chunked
  // forward's backward is the float32 table's, converted); empty: its own. A fwd_bwd record names
  // both, "<name>/<backward_name>".
  std::string backward_name = {};
  // For a native row whose backward is its own for some problems and the converted float32 one
  // for the rest: whether `problem`'s is its own (null: never).
  std::function<bool(const Problem&)> own_backward = nullptr;
};

// Whether this CPU has AVX512-BF16 (the bf16 kernels' dot products and conversions), unless a test
// has forced an answer with set_bf16_override (std::nullopt restores the CPU's own).
bool bf16_supported();
void set_bf16_override(std::optional<bool> supported);

// Why `form` ("scan" or "chunked") cannot run `problem` in bf16 on this CPU, or nothing.
std::optional<std::string> cpu_bf16_refusal(const std::string& form, const Problem& problem);

// What runs `problem` in bf16: the first native row that takes it, else the float32 variant of
// cpu_variant_for behind the converter. Throws std::logic_error with the reason where
// cpu_bf16_refusal gives one.
CpuBf16Variant cpu_bf16_variant_for(const std::string& form, const Problem& problem);

// `inner` (a float32 variant) run on bf16 token tensors widened into float32 scratch
// (cpu/bf16_convert.cpp); named "<inner>+bf16cvt". Its scratch: the widened copies (q, k, v in the
// forward; q, k, v, dO in the backward) beside the inner call's.
struct CpuVariant;
CpuBf16Variant bf16_converted(const CpuVariant& inner);
std::size_t bf16_converted_forward_floats(const Problem& problem);
std::size_t bf16_converted_backward_floats(const Problem& problem);

// bf16 -> float32 (exact) of n elements, on the calling thread's OpenMP team where there is one.
void widen_bf16(const Bf16* in, float* out, std::size_t n);

// The additive rule's chunked forward with bf16 products (cpu/chunked/chunked_bf16.cpp): decays none,
// retnet and scalar; Dk and Dv multiples of 32, the chunk a multiple of 32 up to 256; every shape
// of docs/spec.md section 1c. It keeps no chunk states (its row's backward, the converted float32
// one, recomputes them). Its scratch in floats, all threads'.
std::optional<std::string> chunked_bf16_limits(const Problem& problem);
void chunked_bf16_forward(const Problem& problem, const Bf16ForwardArgs& args, Allocator& allocator);
std::size_t chunked_bf16_forward_floats(const Problem& problem);

// The additive rule's chunked forward with every product on AMX tiles (cpu/chunked/chunked_amx.cpp):
// what chunked_bf16 takes, on the hardware's tiles or on the emulation's (kernels/cpu/amx.hpp). It
// keeps no chunk states; its backward (cpu/chunked/chunked_amx_backward.cpp, on AMX tiles too)
// recomputes them, for every decay the forward takes. Scratch in floats, all threads'.
// The tiles a kernel runs on: the hardware's, the emulation's, or amx::Counted's (kernels/cpu/
// amx_counted.hpp: no arithmetic, only counts, so the outputs are not results); none: the AMX rows
// decline.
enum class AmxPath { hardware, emulated, counted, none };
std::optional<std::string> chunked_amx_limits(const Problem& problem);
void chunked_amx_forward(const Problem& problem, const Bf16ForwardArgs& args, Allocator& allocator, AmxPath path);
std::size_t chunked_amx_forward_floats(const Problem& problem);
bool chunked_amx_backward_takes(const Problem& problem);
void chunked_amx_backward(const Problem& problem, const Bf16BackwardArgs& args, Allocator& allocator, AmxPath path);
std::size_t chunked_amx_backward_floats(const Problem& problem);

// The additive rule with vector gates (GLA) in the chunked form, forward and backward, every big
// product on AMX tiles (cpu/chunked/chunked_amx_gated.cpp); and the delta rule's chunked form, every
// decay (cpu/chunked/chunked_amx_delta.cpp). Any Dk, Dv and chunk up to 256, every shape of
// docs/spec.md section 1c; no kept chunk states (the backwards recompute them). Scratch in floats,
// all threads'.
std::optional<std::string> chunked_amx_gated_limits(const Problem& problem);
void chunked_amx_gated_forward(const Problem& problem, const Bf16ForwardArgs& args, Allocator& allocator,
                               AmxPath path);
std::size_t chunked_amx_gated_forward_floats(const Problem& problem);
void chunked_amx_gated_backward(const Problem& problem, const Bf16BackwardArgs& args, Allocator& allocator,
                                AmxPath path);
std::size_t chunked_amx_gated_backward_floats(const Problem& problem);
std::optional<std::string> chunked_amx_delta_limits(const Problem& problem);
void chunked_amx_delta_forward(const Problem& problem, const Bf16ForwardArgs& args, Allocator& allocator,
                               AmxPath path);
std::size_t chunked_amx_delta_forward_floats(const Problem& problem);
bool chunked_amx_delta_backward_takes(const Problem& problem);
void chunked_amx_delta_backward(const Problem& problem, const Bf16BackwardArgs& args, Allocator& allocator,
                                AmxPath path);
std::size_t chunked_amx_delta_backward_floats(const Problem& problem);

// The path the chunked_amx row runs: the hardware where amx::hardware_refusal() finds nothing
// against it, none elsewhere (the row declines with that reason); a test or the command line
// (LATTN_AMX, amx_path_from_name) may force one with set_amx_override (std::nullopt restores the
// CPU's own): the emulation or the counted tiles (the AMX rows then run on any CPU, AVX512-BF16 or
// not), none (the row declines, so that chunked_bf16's tests test it on an AMX host too), or the
// hardware, which still declines where it is refused.
std::optional<std::string> amx_refusal();
AmxPath amx_path();
void set_amx_override(std::optional<AmxPath> path);
// "hardware", "emulated", "counted", "none" (amx_path_name's names), or nothing for any other name.
std::optional<AmxPath> amx_path_from_name(const std::string& name);
std::string amx_path_name(AmxPath path);

// The AMX row of the chunked bf16 table that runs `problem` forward and backward on tiles
// (chunked_amx, chunked_amx_gated or chunked_amx_delta), or nothing, with the rows' reasons in
// `why`: the layer's bf16 chunked branch (kernels/layer/) runs only on these. Unlike
// cpu_bf16_variant_for it does not ask for AVX512-BF16: the AMX rows do not use it.
std::optional<CpuBf16Variant> cpu_amx_chunked_variant(const Problem& problem, std::string* why = nullptr);

}  // namespace lattn::cpu

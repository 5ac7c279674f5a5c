// An op is a table row: everything the harness needs to plan, feed, check and count one kind of
// computation, whatever backend runs it. Each op's row is in kernels/<op>/op.cpp, beside its float64
// reference and its kernels; src/config/ops.cpp lists the rows. Backends refer to an op's forms by name
// in their own impl tables (src/run/backend.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/case.hpp"
#include "core/tensor_set.hpp"

namespace lattn {

// One named tensor of the op: its role and its shape as a function of the case.
struct TensorSpec {
  std::string name;
  Role role = Role::input;
  std::vector<std::size_t> (*shape)(const Case&) = nullptr;
  // Stored in the case's dtype (bf16 cases round it to bf16 before any backend or the reference
  // sees it); every other tensor is float32 whatever the dtype.
  bool in_case_dtype = false;
  // Whether a case has this tensor at all beyond its role (a decay's gates exist only for that
  // decay); null: every case of the role's modes has it.
  bool (*exists)(const Case&) = nullptr;
  // An output whose true value can be far below the scale float32 computes it at names the output
  // that shows that scale: its error is then taken against max(||ref||, ||that output's ref||)
  // rather than ||ref|| alone (docs/harness.md, "Tolerances"); null: against ||ref||.
  const char* error_floor = nullptr;

  bool in(const Case& kase) const { return present_in(role, kase.mode) && (!exists || exists(kase)); }
};

// A form of the op (an impl name configs and records use: "scan", "chunked") and its flop model:
// the work that algorithm does (docs/performance.md), which every record's GFLOP/s is taken from.
struct Form {
  std::string name;
  double (*flops)(const Case&) = nullptr;
};

// The case fields a config key can set; `option` is one of the op's own (Case::options).
enum class Param { batch, heads, seq, dim, chunk, window, decay, impl, mode, option };

// How an option's values are written and checked.
enum class Kind { integer, real, boolean, name, text };

// One config key of the op's suite: the field it sets, its default values (written as in a config
// file), the range of an integer or the names a named key accepts (impl: the op's forms, mode:
// fwd and fwd_bwd, whatever `choices` says), and the help line of its flag.
struct Axis {
  std::string key;
  Param param;
  std::vector<std::string> defaults;
  std::string help;
  long lo = 1, hi = 0;
  std::vector<std::string> choices = {};
  Kind kind = Kind::integer;          // an option's kind; the other params' kinds are fixed
  double real_lo = 0, real_hi = 0;    // Kind::real: values in (real_lo, real_hi]
  // Kind::text: the value's canonical text, or std::invalid_argument with a one-line reason.
  std::string (*canonical)(const std::string& text) = nullptr;
  // Whether records write the key when the case has its default value; false for a key whose
  // default means "not used" (heads_k 0: one q/k head per value head), so that records of cases
  // without it keep comparing with those written before the key existed.
  bool recorded_at_default = true;
  // Whether the key means anything for a case whose earlier axes are set (a decay's gate strength
  // only for gated decays); null: always. The plan does not vary a key that does not apply, and
  // its records leave it out.
  bool (*applies)(const Case&) = nullptr;
};

// Whether records write an option's value: always, but at its default for an axis whose default
// means "not used" (recorded_at_default false).
inline bool option_recorded(const Axis& axis, const std::string& value) {
  return axis.recorded_at_default || axis.defaults.size() != 1 || axis.defaults[0] != value;
}

struct Op {
  std::string name;   // "linear_attention"
  std::string suite;  // its config section and the records' "suite" ("kernel")
  std::vector<Axis> axes;  // the suite's keys; the plan varies the first slowest
  std::vector<Form> forms;
  std::vector<TensorSpec> tensors;  // in the order dumps and checks list them
  // Every input and cotangent of a fwd_bwd case (docs/spec.md section 3), deterministic from the seed.
  TensorSet (*make_inputs)(const Case&, std::uint64_t seed) = nullptr;
  // The float64 outputs (and with `backward` the gradients) on these inputs.
  Reference (*reference)(const Case&, const TensorSet& inputs, bool backward) = nullptr;
  // The largest rel_err a correct float32 / bf16 result may show (docs/harness.md).
  double (*tolerance)(const std::string& dtype) = nullptr;
  // Where a case's own keys loosen it (the decode step's bf16 state): the tolerance of that case,
  // which then stands in for tolerance(dtype); null: tolerance(dtype) for every case.
  double (*case_tolerance)(const Case&) = nullptr;
  // Why a case is too large to plan beyond its tensors' sizes (the layer's width), or nothing.
  std::optional<std::string> (*limit)(const Case&) = nullptr;
  // A memory-bound op's byte model: the bytes one call moves at the least (the decode step's state
  // in and out). Its records then carry bandwidth figures (gbytes_per_s from this model,
  // bandwidth_fraction, tokens_per_s, us_per_token) and the stdout table shows those instead of
  // GFLOP/s; null: bytes are the case's inputs and outputs, and the table shows GFLOP/s.
  double (*bytes)(const Case&) = nullptr;
  // Sets the fields one key decides from another's value, once the plan has set them all (a packed
  // batch's seq and batch from its lengths); the plan keeps one of any cases this makes equal.
  void (*settle)(Case&) = nullptr;
  // Record keys beyond the case's own fields (the layer's head_dim and model_dim).
  std::vector<std::pair<std::string, long>> (*extra_identity)(const Case&) = nullptr;
  // The case of the first (sequence, head) pairs of `kase`, at least `pairs` of them where the
  // heads' grouping allows (whole sequences once past one), whose every input and output tensor is
  // the first elements of `kase`'s, element for element: a run's `check_heads` checks those
  // elements against a float64 reference made for that case alone (docs/harness.md, "A part
  // checked"). nullopt where the op cannot cut the case so (packed documents) or the part is the
  // whole; null for an op whose pairs are not independent.
  std::optional<Case> (*check_part)(const Case& kase, int pairs) = nullptr;

  const Form* form(const std::string& impl) const;
  // The form whose flop model an impl is credited with: its own form; for a plugin's impl
  // (NAME:IMPL, is_plugin_impl_name) the form named IMPL, else the op's first form, since a
  // plugin's algorithm is its own and the op's first form is its baseline; null otherwise.
  const Form* credited_form(const std::string& impl) const;
  bool has(Param param) const;
  // The credited form's flop model; 0 for an impl it has none of.
  double flops(const Case& kase) const;
};

// The `cache` key every suite has (docs/harness.md, "Cold and warm"): "cold", each timed call reads
// inputs no cache holds (the backend rotates over copies or evicts between calls, outside the timed
// region), or "warm", each call finds what the call before it left in the caches. `default_value`
// is the suite's: cold for the decode step (an engine steps each layer's states after every other
// layer's have streamed through), warm elsewhere. A warm default is not written in records, so that
// records of those suites keep comparing with those written before the key existed.
Axis cache_axis(const std::string& default_value);
// Whether the case's inputs are to be read cold (its `cache` key is "cold").
bool cache_cold(const Case& kase);

// Whether `name` is a plugin's or a plugin impl's name: [a-z0-9_]+.
bool is_plugin_name(const std::string& name);
// Whether `impl` is written as a plugin's impl is, NAME:IMPL with both parts [a-z0-9_]+ (docs/plugins.md;
// src/plugins/plugins.hpp loads them). Only the name's form: whether a plugin provides it is the loader's.
bool is_plugin_impl_name(const std::string& impl);
// The IMPL part of a plugin's NAME:IMPL; "" for any other impl.
std::string plugin_impl_part(const std::string& impl);

// The case's options that set it apart from the op's plain form: those not at their key's one
// default value (the additive rule, keys normalised, gate_norm 16). Case names, Google Benchmark
// names and the summary's lines show only these, so that a case is named as it was before a key
// with a default was added, and a plain case's name does not spell out every default.
std::vector<std::pair<std::string, std::string>> distinguishing_options(const Case& kase);

// The op's inputs for `kase`, rounded to bf16 where the case's dtype says so.
TensorSet make_case_inputs(const Case& kase, std::uint64_t seed);

// Output and gradient tensors of `kase`, zero-filled, shaped by the op.
TensorSet make_case_outputs(const Case& kase);

// Elements of the case's input (and cotangent) tensors, or of its outputs (and gradients): those of
// its mode, or with `fwd_bwd_superset` those of fwd_bwd whatever its mode.
std::size_t case_input_elems(const Case& kase, bool fwd_bwd_superset = false);
std::size_t case_output_elems(const Case& kase, bool fwd_bwd_superset = false);

}  // namespace lattn

#include "core/op.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/random.hpp"

namespace lattn {

const Form* Op::form(const std::string& impl) const {
  for (const Form& f : forms)
    if (f.name == impl) return &f;
  return nullptr;
}

const Form* Op::credited_form(const std::string& impl) const {
  if (const Form* f = form(impl)) return f;
  if (!is_plugin_impl_name(impl)) return nullptr;
  if (const Form* f = form(plugin_impl_part(impl))) return f;
  return forms.empty() ? nullptr : &forms.front();
}

Axis cache_axis(const std::string& default_value) {
  Axis a{"cache", Param::option, {default_value}, "cold (each timed call reads inputs no cache holds) or warm", 1, 0,
         {"cold", "warm"}};
  a.kind = Kind::name;
  a.recorded_at_default = default_value != "warm";
  return a;
}

bool cache_cold(const Case& kase) { return kase.option("cache") == "cold"; }

bool is_plugin_name(const std::string& name) {
  if (name.empty()) return false;
  for (char ch : name)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  return true;
}

bool is_plugin_impl_name(const std::string& impl) {
  const auto colon = impl.find(':');
  return colon != std::string::npos && is_plugin_name(impl.substr(0, colon)) &&
         is_plugin_name(impl.substr(colon + 1));
}

std::string plugin_impl_part(const std::string& impl) {
  return is_plugin_impl_name(impl) ? impl.substr(impl.find(':') + 1) : std::string();
}

bool Op::has(Param param) const {
  for (const Axis& a : axes)
    if (a.param == param) return true;
  return false;
}

double Op::flops(const Case& kase) const {
  const Form* f = credited_form(kase.impl);
  return f ? f->flops(kase) : 0.0;
}

std::vector<std::pair<std::string, std::string>> distinguishing_options(const Case& kase) {
  std::vector<std::pair<std::string, std::string>> shown;
  for (const auto& option : kase.options) {
    const std::string& key = option.first;
    const auto axis = std::find_if(kase.op->axes.begin(), kase.op->axes.end(),
                                   [&](const Axis& a) { return a.param == Param::option && a.key == key; });
    const bool at_default =
        axis != kase.op->axes.end() && axis->defaults.size() == 1 && axis->defaults[0] == option.second;
    if (!at_default) shown.push_back(option);
  }
  return shown;
}

TensorSet make_case_inputs(const Case& kase, std::uint64_t seed) {
  TensorSet inputs = kase.op->make_inputs(kase, seed);
  if (kase.dtype == "bf16")
    for (const TensorSpec& spec : kase.op->tensors)
      if (spec.in_case_dtype && is_input(spec.role))
        if (Tensor* t = inputs.find(spec.name)) round_to_bf16(t->data);
  return inputs;
}

TensorSet make_case_outputs(const Case& kase) {
  TensorSet outputs;
  for (const TensorSpec& spec : kase.op->tensors)
    if (!is_input(spec.role) && spec.in(kase)) outputs.add(spec.name, spec.role, spec.shape(kase));
  return outputs;
}

namespace {
std::size_t elems_where(const Case& kase, bool inputs, bool superset) {
  Case as = kase;
  if (superset) as.mode = Mode::fwd_bwd;
  std::size_t n = 0;
  for (const TensorSpec& spec : kase.op->tensors)
    if (is_input(spec.role) == inputs && spec.in(as)) n += elems_of(spec.shape(as));
  return n;
}
}  // namespace

std::size_t case_input_elems(const Case& kase, bool superset) { return elems_where(kase, true, superset); }
std::size_t case_output_elems(const Case& kase, bool superset) { return elems_where(kase, false, superset); }

}  // namespace lattn

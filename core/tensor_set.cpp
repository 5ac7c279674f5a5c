#include "core/tensor_set.hpp"

#include "core/error.hpp"

namespace lattn {

bool is_input(Role role) { return role == Role::input || role == Role::cotangent; }

bool present_in(Role role, Mode mode) {
  return mode == Mode::fwd_bwd || role == Role::input || role == Role::output;
}

std::size_t elems_of(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (std::size_t extent : shape) n *= extent;
  return n;
}

Tensor& TensorSet::add(const std::string& name, Role role, std::vector<std::size_t> shape) {
  if (find(name)) throw RuntimeFailure("tensor set: '" + name + "' added twice");
  Tensor tensor;
  tensor.name = name;
  tensor.role = role;
  tensor.data.assign(elems_of(shape), 0.0f);
  tensor.shape = std::move(shape);
  tensors_.push_back(std::move(tensor));
  return tensors_.back();
}

const Tensor* TensorSet::find(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Tensor* TensorSet::find(const std::string& name) {
  for (Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const Tensor& TensorSet::at(const std::string& name) const {
  if (const Tensor* t = find(name)) return *t;
  throw RuntimeFailure("tensor set: no tensor '" + name + "'");
}

Tensor& TensorSet::at(const std::string& name) {
  if (Tensor* t = find(name)) return *t;
  throw RuntimeFailure("tensor set: no tensor '" + name + "'");
}

TensorSet TensorSet::inputs_for(Mode mode) const {
  TensorSet out;
  for (const Tensor& t : tensors_)
    if (is_input(t.role) && present_in(t.role, mode)) out.tensors_.push_back(t);
  return out;
}

std::vector<double> widened(const TensorSet& set, const std::string& name) {
  const auto& v = set.at(name).data;
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace lattn

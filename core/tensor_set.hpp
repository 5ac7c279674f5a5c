// The named, shaped float32 buffers of one case: what the runner makes (inputs), hands to a
// backend, reads back (outputs), checks against the float64 reference, dumps (--dump) and sizes
// (arg_mb, out_mb), the same way for every op.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"

namespace lattn {

// input: made before the call; cotangent: an input of fwd_bwd only (dO, dhT); output: written by
// every call; gradient: written by fwd_bwd only.
enum class Role { input, cotangent, output, gradient };

bool is_input(Role role);
// Whether a tensor of `role` belongs to a case of `mode`.
bool present_in(Role role, Mode mode);

struct Tensor {
  std::string name;
  Role role = Role::input;
  std::vector<std::size_t> shape;
  std::vector<float> data;  // row-major, shape's product elements; bf16 cases hold bf16 values

  std::size_t elems() const { return data.size(); }
  std::size_t bytes() const { return data.size() * sizeof(float); }
};

std::size_t elems_of(const std::vector<std::size_t>& shape);

class TensorSet {
 public:
  // A zero-filled tensor; the name must be new to the set.
  Tensor& add(const std::string& name, Role role, std::vector<std::size_t> shape);
  const Tensor* find(const std::string& name) const;
  Tensor* find(const std::string& name);
  // Throws RuntimeFailure naming the tensor when the set has none of that name.
  const Tensor& at(const std::string& name) const;
  Tensor& at(const std::string& name);
  const float* data(const std::string& name) const { return at(name).data.data(); }
  float* data(const std::string& name) { return at(name).data.data(); }

  // The tensors a case of `mode` takes as inputs (copies): fwd cases carry no cotangents.
  TensorSet inputs_for(Mode mode) const;

  const std::vector<Tensor>& tensors() const { return tensors_; }
  std::vector<Tensor>::const_iterator begin() const { return tensors_.begin(); }
  std::vector<Tensor>::const_iterator end() const { return tensors_.end(); }
  bool empty() const { return tensors_.empty(); }

 private:
  std::vector<Tensor> tensors_;  // in the order the op lists them
};

// A tensor's values in float64, for a reference to compute on.
std::vector<double> widened(const TensorSet& set, const std::string& name);

// The float64 values a case's outputs are checked against, by tensor name.
struct Reference {
  std::map<std::string, std::vector<double>> values;
  bool has_backward = false;  // the gradients are there too
};

}  // namespace lattn

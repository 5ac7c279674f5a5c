// One planned case: which op, which of its forms (the impl), which mode, dtype and backend, and the
// shape parameters. Every op reads the parameters it has (the sliding window has no chunk or decay;
// the layer's `dim` is its head dim) and ignores the rest, so that one flat struct serves them all.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace lattn {

struct Op;

enum class Mode { fwd, fwd_bwd };

std::string to_string(Mode mode);
const std::vector<std::string>& mode_names();   // in enum order

struct Case {
  const Op* op = nullptr;
  std::string impl;  // the name of one of the op's forms ("scan", "chunked")
  Mode mode = Mode::fwd;
  std::string backend = "cpu";
  std::string dtype = "float32";
  int batch = 1;
  int heads = 1;
  int seq = 1;
  int dim = 1;     // the head dim
  int chunk = 0;   // the chunked form's chunk size
  int window = 0;  // the sliding window's keys per query
  std::string decay = "none";  // one of the op's decay kinds (kernels/linear_attention/problem.hpp)
  // The op's own keys (Param::option axes) that apply to this case, as a config writes them
  // ("16", "true", "delta"); the op's kernels read them.
  std::map<std::string, std::string> options;
  std::size_t plan_index = 0;

  bool backward() const { return mode == Mode::fwd_bwd; }
  // An option's text, or "" when the case has no such option.
  std::string option(const std::string& key) const {
    const auto it = options.find(key);
    return it == options.end() ? std::string() : it->second;
  }
};

}  // namespace lattn

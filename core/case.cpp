#include "core/case.hpp"

namespace lattn {

const std::vector<std::string>& mode_names() {
  static const std::vector<std::string> names = {"fwd", "fwd_bwd"};
  return names;
}

std::string to_string(Mode mode) { return mode_names()[std::size_t(mode)]; }

}  // namespace lattn

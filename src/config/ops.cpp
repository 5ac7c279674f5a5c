// The op table: one line per op; each row is written beside its kernels (kernels/<op>/op.cpp).
#include "src/config/ops.hpp"

#include "kernels/decode/op.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/op.hpp"

namespace lattn {

const std::vector<const Op*>& all_ops() {
  static const std::vector<const Op*> ops = {&linear_attention_op(), &layer_op(), &sliding_window_op(), &decode_op()};
  return ops;
}

const Op* op_for_suite(const std::string& suite) {
  for (const Op* op : all_ops())
    if (!op->suite.empty() && op->suite == suite) return op;
  return nullptr;
}

const Op* find_op(const std::string& name) {
  for (const Op* op : all_ops())
    if (op->name == name) return op;
  return nullptr;
}

}  // namespace lattn

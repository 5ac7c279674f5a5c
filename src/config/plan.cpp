// The plan: every case of the selected suites, in the order the op's axes give (the first varying
// slowest), and the checks that need the whole config (sizes no machine here could hold).
#include "src/config/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <regex>
#include <set>

#include "core/error.hpp"

namespace lattn {
namespace {

// One tensor of a case may not exceed this many elements (8 GiB of float32).
constexpr std::size_t kMaxTensorElems = std::size_t(1) << 31;
// A plan is held in memory whole; sweeps beyond this belong in several runs or shards.
constexpr long kMaxPlanCases = 100000;

// Every case of one suite's settings, in plan order: the op's axes, the first varying slowest.
// `fixed` pins the given params to their first value (validation needs no impl or mode variants).
std::vector<Case> expand_suite(const SuiteConfig& suite, const RunSettings& run, const std::vector<Param>& fixed = {}) {
  const Op& op = *suite.op;
  std::vector<Case> cases;
  std::set<std::string> seen;  // cases settle() made equal are planned once
  Case kase;
  kase.op = &op;
  kase.backend = run.backend;
  kase.dtype = run.dtype;
  std::function<void(std::size_t)> walk = [&](std::size_t axis_index) {
    if (axis_index == op.axes.size()) {
      Case settled = kase;
      if (op.settle) op.settle(settled);
      std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}", settled.impl, to_string(settled.mode), settled.batch,
                                    settled.heads, settled.seq, settled.dim, settled.chunk, settled.window, settled.decay);
      for (const auto& [name, value] : settled.options) key += "|" + name + "=" + value;
      if (seen.insert(key).second) cases.push_back(std::move(settled));
      return;
    }
    const Axis& axis = op.axes[axis_index];
    const AxisValues& values = suite.values.at(axis.key);
    const bool pinned = std::find(fixed.begin(), fixed.end(), axis.param) != fixed.end();
    const std::size_t count = values.names.size() + values.numbers.size();
    // A key that means nothing for this case is neither varied nor recorded.
    if (axis.param == Param::option && axis.applies && !axis.applies(kase)) {
      kase.options.erase(axis.key);
      walk(axis_index + 1);
      return;
    }
    for (std::size_t i = 0; i < (pinned ? std::min<std::size_t>(count, 1) : count); ++i) {
      switch (axis.param) {
        case Param::batch: kase.batch = int(values.numbers[i]); break;
        case Param::heads: kase.heads = int(values.numbers[i]); break;
        case Param::seq: kase.seq = int(values.numbers[i]); break;
        case Param::dim: kase.dim = int(values.numbers[i]); break;
        case Param::chunk: kase.chunk = int(values.numbers[i]); break;
        case Param::window: kase.window = int(values.numbers[i]); break;
        case Param::impl: kase.impl = values.names[i]; break;
        case Param::mode: kase.mode = Mode(std::find(mode_names().begin(), mode_names().end(), values.names[i]) - mode_names().begin()); break;
        case Param::decay: kase.decay = values.names[i]; break;
        case Param::option: kase.options[axis.key] = values.names[i]; break;
      }
      walk(axis_index + 1);
    }
  };
  walk(0);
  return cases;
}

double suite_case_count(const SuiteConfig& suite) {
  double count = 1;
  for (const auto& [key, values] : suite.values) count *= double(values.numbers.size() + values.names.size());
  return count;
}

std::string describe_shape(const Case& c) {
  const Op& op = *c.op;
  std::string out = op.suite + " case batch " + std::to_string(c.batch) + " heads " + std::to_string(c.heads) +
                    " seq " + std::to_string(c.seq) + " dim " + std::to_string(c.dim);
  if (op.has(Param::window)) out += " window " + std::to_string(c.window);
  return out;
}

}  // namespace

void validate_config(const Config& c) {
  double cases = 0;
  for (const SuiteConfig& suite : c.suite_configs) cases += suite_case_count(suite);
  // Checked before the loops below, which walk these products.
  if (cases > double(kMaxPlanCases))
    throw UsageError(c.source, "the suites expand to " + std::to_string(long(cases)) + " cases; at most " +
                                   std::to_string(kMaxPlanCases) + " fit in one run (use --shard or fewer values)");
  for (const SuiteConfig& suite : c.suite_configs)
    for (Case kase : expand_suite(suite, c.run, {Param::impl, Param::mode})) {
      if (suite.op->limit)
        if (auto why = suite.op->limit(kase)) throw UsageError(c.source, *why);
      kase.mode = Mode::fwd_bwd;
      for (const TensorSpec& spec : suite.op->tensors)
        if (spec.in(kase) && elems_of(spec.shape(kase)) > kMaxTensorElems)
          throw UsageError(c.source, describe_shape(kase) + " needs tensors of over 2^31 elements (8 GiB each; " +
                                         spec.name + " is one); no machine here holds that");
    }
}

std::vector<Case> expand_plan(const Config& c) {
  std::vector<Case> plan;
  for (const auto& name : c.suites)
    for (Case& kase : expand_suite(c.suite(name), c.run)) {
      kase.plan_index = plan.size();
      plan.push_back(std::move(kase));
    }
  return plan;
}

std::string case_slug(const Case& c) {
  const Op& op = *c.op;
  std::string slug = fmt::format("{:03d}-{}-{}-{}-b{}h{}t{}d{}", c.plan_index, op.suite, c.impl, to_string(c.mode),
                                 c.batch, c.heads, c.seq, c.dim);
  if (op.has(Param::chunk)) slug += fmt::format("c{}", c.chunk);
  if (op.has(Param::window)) slug += fmt::format("w{}", c.window);
  if (op.has(Param::decay)) slug += "-" + c.decay;
  for (const auto& [name, value] : distinguishing_options(c)) slug += "-" + name + value;
  return slug;
}

std::vector<Case> filter_plan(const std::vector<Case>& plan, const std::string& filter) {
  if (filter.empty()) return plan;
  std::regex pattern;
  try {
    pattern = std::regex(filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError("--filter", "not a regular expression: '" + filter + "' (" + e.what() + ")");
  }
  std::vector<Case> kept;
  for (const Case& c : plan)
    if (std::regex_search(case_slug(c), pattern)) kept.push_back(c);
  return kept;
}

}  // namespace lattn

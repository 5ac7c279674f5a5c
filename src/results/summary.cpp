#include "src/results/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/op.hpp"

namespace lattn {

std::string shape_key(const Case& c, bool with_seq) {
  const Op& op = *c.op;
  std::string key = fmt::format("{}|{}|{}|{}|b{}|h{}|d{}", op.suite, to_string(c.mode), c.backend, c.dtype, c.batch,
                                c.heads, c.dim);
  if (op.has(Param::decay)) key += "|" + c.decay;
  if (op.has(Param::chunk)) key += fmt::format("|c{}", c.chunk);
  if (op.has(Param::window)) key += fmt::format("|w{}", c.window);
  for (const auto& [name, value] : c.options) key += "|" + name + "=" + value;
  if (with_seq) key += fmt::format("|t{}", c.seq);
  return key;
}

bool passed(const CaseRecord& r) { return r.status == Status::ok && r.measured && !r.measured->samples_ms.empty(); }

std::string why_not_passed(const CaseRecord& r) {
  if (passed(r)) return {};
  if (!r.skip_reason.empty()) return r.skip_reason;
  if (r.measured && !r.measured->unchecked.empty()) return r.measured->unchecked;
  if (r.measured && !r.measured->check_failure.empty()) return r.measured->check_failure;
  if (!r.error.empty()) return r.error;
  if (r.measured && r.measured->samples_ms.empty()) return "no samples";
  return "not measured";
}

Summary build_summary(const std::vector<CaseRecord>& records) {
  Summary summary;
  std::map<std::string, std::vector<const CaseRecord*>> by_shape;
  std::vector<std::string> shape_order;
  for (const CaseRecord& r : records) {
    if (!passed(r)) {
      summary.not_compared.push_back(&r);
      continue;
    }
    const std::string key = shape_key(r.kase, true);
    if (!by_shape.count(key)) shape_order.push_back(key);
    by_shape[key].push_back(&r);
  }

  std::map<std::string, std::vector<std::size_t>> by_series;  // shape without seq -> comparisons
  std::vector<std::string> series_order;
  for (const auto& key : shape_order) {
    auto shape = by_shape[key];
    if (shape.size() < 2) continue;
    std::stable_sort(shape.begin(), shape.end(),
                     [](auto* a, auto* b) { return a->measured->median_ms < b->measured->median_ms; });
    Comparison c{shape[0], shape[1],
                 shape[1]->measured->median_ms / std::max(shape[0]->measured->median_ms, 1e-300)};
    if (shape.size() > 2) c.ranking = shape;
    const std::string series = shape_key(c.fastest->kase, false);
    if (!by_series.count(series)) series_order.push_back(series);
    by_series[series].push_back(summary.comparisons.size());
    summary.comparisons.push_back(c);
  }

  for (const auto& series : series_order) {
    std::vector<const Comparison*> points;
    for (std::size_t i : by_series[series]) points.push_back(&summary.comparisons[i]);
    if (points.size() < 2) continue;
    std::stable_sort(points.begin(), points.end(),
                     [](auto* a, auto* b) { return a->fastest->kase.seq < b->fastest->kase.seq; });
    Crossover x;
    x.series = points.front()->fastest;
    for (std::size_t i = 0; i < points.size(); ++i) {
      x.winners.emplace_back(points[i]->fastest->kase.seq, points[i]->fastest->kase.impl);
      if (i > 0 && points[i]->fastest->kase.impl != points[i - 1]->fastest->kase.impl)
        x.changes.push_back({points[i - 1]->fastest->kase.seq, points[i]->fastest->kase.seq,
                             points[i - 1]->fastest->kase.impl, points[i]->fastest->kase.impl});
    }
    summary.crossovers.push_back(std::move(x));
  }
  return summary;
}

namespace {

std::string label(const Case& c, bool with_seq) {
  const Op& op = *c.op;
  std::string out = fmt::format("{} {} batch={} heads={}", op.suite, to_string(c.mode), c.batch, c.heads);
  if (with_seq) out += fmt::format(" seq={}", c.seq);
  // The head dim under its suite's own key: the layer's is head_dim (its dim is the model width).
  std::string dim_key = "dim";
  for (const Axis& axis : op.axes)
    if (axis.param == Param::dim) dim_key = axis.key;
  out += fmt::format(" {}={}", dim_key, c.dim);
  if (op.has(Param::chunk)) out += fmt::format(" chunk={}", c.chunk);
  if (op.has(Param::window)) out += fmt::format(" window={}", c.window);
  if (op.has(Param::decay) && c.decay != "none") out += " decay=" + c.decay;
  for (const auto& [name, value] : distinguishing_options(c)) out += " " + name + "=" + value;
  if (c.dtype != "float32") out += " " + c.dtype;
  return out;
}

}  // namespace

bool is_tie(const Comparison& c) {
  // compare.py's interval of the factor from quartiles: runner-up q1 over fastest q3 at its low
  // end. At or below 1 the two middle halves overlap, and the order is within the noise.
  return c.other->measured->q1_ms <= c.fastest->measured->q3_ms;
}

namespace {

// A record's scratch in MiB, or "-" where it was not counted (temp_mb null in its record).
std::string temp_text(const Measurement& m) { return m.temp_unknown.empty() ? fmt::format("{:.3g}", m.temp_mb) : "-"; }

// The records out of the comparisons: each failed one with its shape and why; the skipped ones by
// impl and reason, counted (a run on a machine without the CUDA device skips a whole backend).
std::string format_not_compared(const std::vector<const CaseRecord*>& records) {
  std::string out;
  std::vector<std::pair<std::string, std::vector<const CaseRecord*>>> skipped;  // "impl: reason", records
  for (const CaseRecord* r : records) {
    if (r->status == Status::skipped) {
      const std::string key = r->kase.impl + ": " + why_not_passed(*r);
      auto group = std::find_if(skipped.begin(), skipped.end(), [&](const auto& g) { return g.first == key; });
      if (group == skipped.end())
        skipped.push_back({key, {r}});
      else
        group->second.push_back(r);
      continue;
    }
    out +=
        fmt::format("  {}: {} {}: {}\n", label(r->kase, true), r->kase.impl, to_string(r->status), why_not_passed(*r));
  }
  for (const auto& [key, group] : skipped) {
    if (group.size() == 1)
      out += fmt::format("  {}: {} skipped: {}\n", label(group[0]->kase, true), group[0]->kase.impl,
                         why_not_passed(*group[0]));
    else
      out +=
          fmt::format("  {} skipped in {} cases: {}\n", group[0]->kase.impl, group.size(), why_not_passed(*group[0]));
  }
  return out;
}

}  // namespace

std::string format_summary(const Summary& summary) {
  std::string out;
  const bool any_failed = std::any_of(summary.not_compared.begin(), summary.not_compared.end(),
                                      [](const CaseRecord* r) { return r->status != Status::skipped; });
  if (summary.comparisons.empty() && !any_failed) return out;
  if (!summary.comparisons.empty()) out += "\nFastest impl per shape and mode:\n";
  for (const Comparison& c : summary.comparisons) {
    if (is_tie(c))
      out += fmt::format("  {}: {} and {} tie (quartiles overlap; medians {:.4g} vs {:.4g} ms); temp {} vs {} MiB\n",
                         label(c.fastest->kase, true), c.fastest->kase.impl, c.other->kase.impl,
                         c.fastest->measured->median_ms, c.other->measured->median_ms, temp_text(*c.fastest->measured),
                         temp_text(*c.other->measured));
    else
      out += fmt::format("  {}: {} is {:.2f}x faster than {} ({:.4g} vs {:.4g} ms); temp {} vs {} MiB\n",
                         label(c.fastest->kase, true), c.fastest->kase.impl, c.speedup, c.other->kase.impl,
                         c.fastest->measured->median_ms, c.other->measured->median_ms, temp_text(*c.fastest->measured),
                         temp_text(*c.other->measured));
    for (std::size_t i = 2; i < c.ranking.size(); ++i)
      out += fmt::format("    then {} ({:.4g} ms, {:.2f}x the fastest's time; temp {} MiB)\n", c.ranking[i]->kase.impl,
                         c.ranking[i]->measured->median_ms,
                         c.ranking[i]->measured->median_ms / std::max(c.fastest->measured->median_ms, 1e-300),
                         temp_text(*c.ranking[i]->measured));
  }
  if (!summary.crossovers.empty()) out += "Crossover in seq:\n";
  for (const Crossover& x : summary.crossovers) {
    if (x.changes.empty()) {
      out += fmt::format("  {}: {} wins at every seq measured\n", label(x.series->kase, false), x.winners[0].second);
      continue;
    }
    for (const WinnerChange& ch : x.changes)
      out += fmt::format("  {}: {} wins up to seq {}, {} from seq {}\n", label(x.series->kase, false), ch.from,
                         ch.after_seq, ch.to, ch.by_seq);
  }
  if (!summary.not_compared.empty()) {
    out += "Not compared (did not pass):\n";
    out += format_not_compared(summary.not_compared);
  }
  return out;
}

std::string above_peak_warning(const std::vector<CaseRecord>& records, const ComputeCeiling& ceiling,
                               double fma_gflops, double sgemm_gflops) {
  const auto above = std::count_if(records.begin(), records.end(),
                                   [](const CaseRecord& r) { return r.measured && r.measured->above_ceiling; });
  if (above == 0) return {};
  return fmt::format(
      "{} case(s) ran above {:.2f} of the compute ceiling ({:.1f} GFLOP/s, the {}; FMA rate {:.1f}, sgemm {:.1f}): "
      "faster than the hardware can be, so the ceiling was measured in a busier stretch than they ran in "
      "(their records say above_ceiling); read blas_fraction_now",
      above, kAboveCeiling, ceiling.gflops, ceiling.source == "fma" ? "FMA rate" : "sgemm", fma_gflops, sgemm_gflops);
}

std::string peak_spread_warning(double peak_gflops, double median_gflops) {
  if (!(peak_gflops > 0.0) || !(median_gflops > 0.0) || median_gflops >= 0.9 * peak_gflops) return {};
  return fmt::format(
      "the start-up sgemm products spread: median {:.1f} against best {:.1f} GFLOP/s ({:.2f}); the machine's rate "
      "moved while sgemm was measured, so a case as fast as sgemm's median reads blas_fraction {:.2f}: read "
      "blas_fraction_now beside it",
      median_gflops, peak_gflops, median_gflops / peak_gflops, median_gflops / peak_gflops);
}

}  // namespace lattn

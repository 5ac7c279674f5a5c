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

Summary build_summary(const std::vector<CaseRecord>& records) {
  std::map<std::string, std::vector<const CaseRecord*>> by_shape;
  std::vector<std::string> shape_order;
  for (const CaseRecord& r : records) {
    if (!r.measured || r.status == Status::skipped) continue;
    const std::string key = shape_key(r.kase, true);
    if (!by_shape.count(key)) shape_order.push_back(key);
    by_shape[key].push_back(&r);
  }

  Summary summary;
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

std::string format_summary(const Summary& summary) {
  std::string out;
  if (summary.comparisons.empty()) return out;
  out += "\nFastest impl per shape and mode:\n";
  for (const Comparison& c : summary.comparisons) {
    if (is_tie(c))
      out += fmt::format("  {}: {} and {} tie (quartiles overlap; medians {:.4g} vs {:.4g} ms); temp {:.3g} vs {:.3g} MiB\n",
                         label(c.fastest->kase, true), c.fastest->kase.impl, c.other->kase.impl,
                         c.fastest->measured->median_ms, c.other->measured->median_ms, c.fastest->measured->temp_mb,
                         c.other->measured->temp_mb);
    else
      out += fmt::format("  {}: {} is {:.2f}x faster than {} ({:.4g} vs {:.4g} ms); temp {:.3g} vs {:.3g} MiB\n",
                         label(c.fastest->kase, true), c.fastest->kase.impl, c.speedup, c.other->kase.impl,
                         c.fastest->measured->median_ms, c.other->measured->median_ms, c.fastest->measured->temp_mb,
                         c.other->measured->temp_mb);
    for (std::size_t i = 2; i < c.ranking.size(); ++i)
      out += fmt::format("    then {} ({:.4g} ms, {:.2f}x the fastest's time; temp {:.3g} MiB)\n", c.ranking[i]->kase.impl,
                         c.ranking[i]->measured->median_ms,
                         c.ranking[i]->measured->median_ms / std::max(c.fastest->measured->median_ms, 1e-300),
                         c.ranking[i]->measured->temp_mb);
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

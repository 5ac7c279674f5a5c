#!/usr/bin/python3
"""Compare two lattnbench result files case by case, and say whether NEW regressed against BASE.

    compare.py BASE.json NEW.json [--threshold 5%] [--alpha 0.05] [--metric median_ms]
               [--ignore-device] [--ignore-backend] [--md FILE] [--json FILE]

Exit status: 0 no significant slowdown and no failed check (speed-ups never fail), 1 at least one
SLOWER or FAILED case, 2 bad input. Verdict rules and examples: docs/compare.md.
"""

import argparse
import json
import math
import sys
from dataclasses import dataclass

import lattn_results as lr

EXIT_OK = 0
EXIT_REGRESSION = 1

TIME_METRICS = ("median_ms", "mean_ms", "min_ms", "max_ms", "q1_ms", "q3_ms")

# The Mann-Whitney U test needs a few samples on each side to say anything.
MIN_SAMPLES_FOR_U = 3

VERDICT_ORDER = ("SLOWER", "FAILED", "FASTER", "SAME", "NEW", "GONE", "SKIPPED")
REGRESSIONS = {"SLOWER", "FAILED"}
TIMED_VERDICTS = {"SAME", "FASTER", "SLOWER"}


@dataclass
class Row:
    key: tuple
    label: str
    verdict: str
    base_value: float | None = None
    new_value: float | None = None
    test: str = ""
    p_value: float | None = None
    base_temp_mb: float | None = None
    new_temp_mb: float | None = None
    note: str = ""

    @property
    def ratio(self):
        if self.base_value and self.new_value is not None and self.base_value > 0:
            return self.new_value / self.base_value
        return None


@dataclass
class Comparison:
    base: lr.ResultFile
    new: lr.ResultFile
    metric: str
    threshold: float           # a fraction: 0.05 is 5%
    alpha: float
    backend_ignored_because: str | None
    devices_differ: bool
    rows: list
    winners: list
    crossovers: list

    @property
    def counts(self):
        counts = {v: 0 for v in VERDICT_ORDER}
        for row in self.rows:
            counts[row.verdict] += 1
        return counts

    @property
    def regressed(self):
        return any(row.verdict in REGRESSIONS for row in self.rows)

    @property
    def exit_status(self):
        return EXIT_REGRESSION if self.regressed else EXIT_OK

    @property
    def matched_ratios(self):
        # A failed case's time says nothing about speed, so only timed verdicts count.
        return [row.ratio for row in self.rows if row.verdict in TIMED_VERDICTS and row.ratio]

    @property
    def geomean_ratio(self):
        ratios = self.matched_ratios
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    @property
    def has_memory(self):
        return any(r.base_temp_mb is not None or r.new_temp_mb is not None for r in self.rows)

    def summary(self):
        counts = self.counts
        shown = ", ".join(f"{counts[v]} {v}" for v in VERDICT_ORDER if counts[v] or v in REGRESSIONS)
        head = "REGRESSION" if self.regressed else "no significant regression"
        return (f"{head}: {shown} ({self.metric}, threshold {format_pct(self.threshold)}, "
                f"alpha {self.alpha:g})")


def parse_threshold(text):
    """'5%' or '5' mean five percent; returned as the fraction 0.05."""
    digits = text.strip().removesuffix("%")
    try:
        value = float(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad threshold {text!r}: expected a percentage like 5%") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"bad threshold {text!r}: must be a percentage >= 0")
    return value / 100


def parse_alpha(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"bad alpha {text!r}: must be between 0 and 1")
    return value


def format_pct(fraction):
    return f"{fraction * 100:g}%"


def significance(base, new, alpha):
    """(significant, test label, p-value or None) for the difference between two records' times."""
    base_samples, new_samples = base.get("samples_ms"), new.get("samples_ms")
    if _usable_samples(base_samples) and _usable_samples(new_samples):
        # Imported here so that reading files and printing errors works without SciPy.
        try:
            from scipy.stats import mannwhitneyu
        except ImportError:
            raise lr.ResultFileError("SciPy is needed for the U test over samples_ms "
                                     "(Debian: apt-get install python3-scipy)") from None
        p = float(mannwhitneyu(base_samples, new_samples, alternative="two-sided").pvalue)
        label = f"U p={p:.3f}" if p >= 0.001 else "U p<0.001"
        return p < alpha, label, p
    quartiles = [lr.number(r.get(k)) for r in (base, new) for k in ("q1_ms", "q3_ms")]
    if None not in quartiles:
        base_q1, base_q3, new_q1, new_q3 = quartiles
        return new_q1 > base_q3 or new_q3 < base_q1, "IQR", None
    # Nothing about the spread was recorded: the threshold alone decides.
    return True, "none", None


def _usable_samples(samples):
    return (isinstance(samples, list) and len(samples) >= MIN_SAMPLES_FOR_U
            and all(lr.number(s) is not None for s in samples))


def failed_check(record):
    """Why the record's own correctness check failed, or '' when it passed."""
    if record.get("status") == "failed":
        return "status failed"
    rel_err, tolerance = lr.number(record.get("rel_err")), lr.number(record.get("tolerance"))
    if rel_err is not None and tolerance is not None and rel_err > tolerance:
        return f"rel_err {rel_err:.2e} > tolerance {tolerance:.2e}"
    return ""


def judge(key, base, new, metric, threshold, alpha, ignore):
    record = new if new is not None else base
    row = Row(key, lr.describe_case(record, ignore), verdict="SAME",
              base_temp_mb=lr.number(base.get("temp_mb")) if base else None,
              new_temp_mb=lr.number(new.get("temp_mb")) if new else None)
    if base is None:
        row.verdict, row.new_value = "NEW", lr.number(new.get(metric))
        return row
    row.base_value = lr.number(base.get(metric))
    if new is None:
        row.verdict = "GONE"
        return row
    row.new_value = lr.number(new.get(metric))
    row.note = failed_check(new)
    if row.note:
        row.verdict = "FAILED"
    elif row.base_value is None or row.new_value is None or row.base_value <= 0:
        row.verdict = "SKIPPED"
        row.note = new.get("skip_reason") or base.get("skip_reason") or f"no {metric} on one side"
    else:
        significant, row.test, row.p_value = significance(base, new, alpha)
        change = row.new_value / row.base_value - 1
        if abs(change) > threshold and significant:
            row.verdict = "SLOWER" if change > 0 else "FASTER"
        # Same case, different algorithm for the backward's chunk states: say so beside the verdict.
        if base.get("bwd_states") and new.get("bwd_states") and base["bwd_states"] != new["bwd_states"]:
            row.note = f"bwd_states {base['bwd_states']} -> {new['bwd_states']}"
    return row


def fastest_impls(result_file, metric, ignore):
    """Per shape and mode (the identity without impl): the fastest impl and its margin.

    Records whose check failed are left out: a kernel that computes the wrong answer wins nothing.
    """
    groups = {}
    for record in result_file.records:
        if record.get("status") == "ok" and not failed_check(record) and lr.number(record.get(metric)):
            groups.setdefault(lr.case_key(record, ignore | {"impl"}), []).append(record)
    winners = []
    for records in groups.values():
        if len({r.get("impl") for r in records}) < 2:
            continue
        best, runner_up = sorted(records, key=lambda r: r[metric])[:2]
        winners.append({
            "shape": lr.describe_case(best, ignore | {"impl"}),
            "series_key": lr.case_key(best, ignore | {"impl", "seq"}),
            "seq": best.get("seq"), "winner": best["impl"], "runner_up": runner_up["impl"],
            "factor": runner_up[metric] / best[metric],
            "winner_temp_mb": lr.number(best.get("temp_mb")),
            "runner_up_temp_mb": lr.number(runner_up.get("temp_mb")),
        })
    return winners


def crossovers(winners, ignore):
    """Where the fastest impl changes as seq grows, per series (the shape without seq)."""
    series = {}
    for w in winners:
        if lr.number(w["seq"]) is not None:
            series.setdefault(w["series_key"], []).append(w)
    found = []
    for series_key, points in series.items():
        if len(points) < 2:
            continue
        points.sort(key=lambda w: w["seq"])
        label = lr.describe_case(lr.key_as_dict(series_key), ignore | {"impl"})
        changes = [(a, b) for a, b in zip(points, points[1:]) if a["winner"] != b["winner"]]
        found.append({
            "series": label, "seqs": [w["seq"] for w in points],
            "changes": [{"from": a["winner"], "to": b["winner"], "last_seq_before": a["seq"],
                         "crossover_seq": b["seq"]} for a, b in changes],
            "winner": points[0]["winner"] if not changes else None,
        })
    return found


def compare(base, new, metric, threshold, alpha, ignore_backend, ignore_device):
    if not base.same_device(new) and not ignore_device:
        raise lr.ResultFileError(f"devices differ: BASE is {base.fingerprint}, NEW is {new.fingerprint} "
                                 "(pass --ignore-device to compare anyway)")
    reason = None
    if ignore_backend:
        reason = "--ignore-backend"
    elif base.is_reference or new.is_reference:
        which = " and ".join(n for n, f in (("BASE", base), ("NEW", new)) if f.is_reference)
        reason = f"{which} is a reference-format (JAX) file"
    ignore = {"backend"} if reason else set()

    base_index, new_index = lr.index_by_case(base, ignore), lr.index_by_case(new, ignore)
    keys = list(base_index) + [k for k in new_index if k not in base_index]
    rows = [judge(k, base_index.get(k), new_index.get(k), metric, threshold, alpha, ignore) for k in keys]
    winners = fastest_impls(new, metric, ignore)
    # True only under --ignore-device: differing devices were refused above otherwise.
    devices_differ = not base.same_device(new)
    return Comparison(base, new, metric, threshold, alpha, reason, devices_differ, rows, winners,
                      crossovers(winners, ignore))


# ---- output ------------------------------------------------------------------------------------

def _fmt(value):
    return "-" if value is None else f"{value:.4g}"


def _change(row):
    return "-" if row.ratio is None else f"{(row.ratio - 1) * 100:+.1f}%"


def table(comparison):
    """Header and rows of the per-case table; the last row is the geometric mean."""
    unit = comparison.metric
    header = ["case", f"base {unit}", f"new {unit}", "change", "test", "verdict"]
    if comparison.has_memory:
        header += ["base temp_mb", "new temp_mb"]
    header.append("note")
    rows = []
    for r in comparison.rows:
        cells = [r.label, _fmt(r.base_value), _fmt(r.new_value), _change(r), r.test, r.verdict]
        if comparison.has_memory:
            cells += [_fmt(r.base_temp_mb), _fmt(r.new_temp_mb)]
        rows.append(cells + [r.note])
    geomean = comparison.geomean_ratio
    cells = [f"geomean new/base over {len(comparison.matched_ratios)} matched cases", "", "",
             "-" if geomean is None else f"{(geomean - 1) * 100:+.1f}%", "",
             "-" if geomean is None else f"x{geomean:.3f}"]
    rows.append(cells + ([""] * 2 if comparison.has_memory else []) + [""])
    return header, rows


def winner_lines(comparison):
    lines = []
    for w in comparison.winners:
        memory = ""
        if w["winner_temp_mb"] is not None and w["runner_up_temp_mb"] is not None:
            memory = (f"; temp {w['winner_temp_mb']:.4g} MiB vs {w['runner_up_temp_mb']:.4g} MiB "
                      f"({w['winner_temp_mb'] - w['runner_up_temp_mb']:+.4g} MiB)")
        lines.append(f"{w['shape']}: {w['winner']} is {w['factor']:.2f}x faster than "
                     f"{w['runner_up']}{memory}")
    for c in comparison.crossovers:
        if c["changes"]:
            steps = ", ".join(f"{ch['from']} -> {ch['to']} at T={ch['crossover_seq']} "
                              f"(after T={ch['last_seq_before']})" for ch in c["changes"])
            lines.append(f"crossover {c['series']}: {steps}")
        else:
            lines.append(f"no crossover {c['series']}: {c['winner']} fastest at every T "
                         f"from {c['seqs'][0]} to {c['seqs'][-1]}")
    return lines


def header_lines(comparison):
    lines = [f"BASE {comparison.base.path} [{comparison.base.format_name}, {comparison.base.fingerprint}]",
             f"NEW  {comparison.new.path} [{comparison.new.format_name}, {comparison.new.fingerprint}]"]
    if comparison.backend_ignored_because:
        lines.append(f"backend ignored when matching cases: {comparison.backend_ignored_because}")
    if comparison.devices_differ:
        lines.append("devices differ (--ignore-device): the times come from different machines")
    return lines


def render_text(comparison):
    header, rows = table(comparison)
    widths = [max(len(str(line[i])) for line in [header] + rows) for i in range(len(header))]
    numeric = {1, 2, 3} | ({6, 7} if comparison.has_memory else set())

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = header_lines(comparison) + ["", line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows[:-1]] + [line(["-" * w for w in widths]), line(rows[-1])]
    winners = winner_lines(comparison)
    if winners:
        out += ["", f"Fastest impl in NEW per shape and mode ({comparison.metric}):"]
        out += [f"  {w}" for w in winners]
    out += ["", comparison.summary()]
    return "\n".join(out) + "\n"


def render_markdown(comparison):
    header, rows = table(comparison)
    icon = ":x:" if comparison.regressed else ":white_check_mark:"
    out = [f"{icon} **{comparison.summary()}**", ""]
    out += [f"`{line}`  " for line in header_lines(comparison)] + [""]

    def cell(text, column):
        text = str(text).replace("|", "\\|")
        if column == 0 and text and not text.startswith("geomean"):
            return f"`{text}`"
        if column == 5 and text in REGRESSIONS:
            return f"**{text}**"
        return text

    out.append("| " + " | ".join(header) + " |")
    text_columns = {0, 4, 5, len(header) - 1}
    out.append("|" + "|".join("---" if i in text_columns else "---:" for i in range(len(header))) + "|")
    for r in rows:
        out.append("| " + " | ".join(cell(c, i) for i, c in enumerate(r)) + " |")
    winners = winner_lines(comparison)
    if winners:
        out += ["", "<details><summary>Fastest impl in NEW per shape and mode</summary>", ""]
        out += [f"- {w}" for w in winners] + ["", "</details>"]
    return "\n".join(out) + "\n"


def render_json(comparison):
    def file_block(f):
        return {"path": f.path, "format": f.format_name, "device": f.fingerprint}

    doc = {
        "base": file_block(comparison.base), "new": file_block(comparison.new),
        "metric": comparison.metric, "threshold_pct": comparison.threshold * 100,
        "alpha": comparison.alpha, "backend_ignored_because": comparison.backend_ignored_because,
        "devices_differ": comparison.devices_differ,
        "cases": [{
            "case": lr.key_as_dict(r.key), "label": r.label, "verdict": r.verdict,
            "base": r.base_value, "new": r.new_value,
            "change_pct": None if r.ratio is None else (r.ratio - 1) * 100,
            "test": r.test, "p_value": r.p_value,
            "base_temp_mb": r.base_temp_mb, "new_temp_mb": r.new_temp_mb, "note": r.note,
        } for r in comparison.rows],
        "matched": len(comparison.matched_ratios), "geomean_ratio": comparison.geomean_ratio,
        "counts": comparison.counts,
        "winners": [{k: v for k, v in w.items() if k != "series_key"} for w in comparison.winners],
        "crossovers": comparison.crossovers,
        "summary": comparison.summary(), "exit_status": comparison.exit_status,
    }
    return json.dumps(doc, indent=2) + "\n"


def main(argv):
    parser = lr.ArgumentParser(description="Compare two lattnbench result files (docs/compare.md).")
    parser.add_argument("base", metavar="BASE.json")
    parser.add_argument("new", metavar="NEW.json")
    parser.add_argument("--threshold", type=parse_threshold, default=parse_threshold("5%"),
                        help="smallest change that counts, e.g. 5%% (default 5%%)")
    parser.add_argument("--alpha", type=parse_alpha, default=0.05,
                        help="significance level of the Mann-Whitney U test (default 0.05)")
    parser.add_argument("--metric", choices=TIME_METRICS, default="median_ms")
    parser.add_argument("--ignore-device", action="store_true", help="compare files from different devices")
    parser.add_argument("--ignore-backend", action="store_true", help="match cases across backends")
    parser.add_argument("--md", metavar="FILE", help="also write a markdown table for a PR comment")
    parser.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    args = parser.parse_args(argv)

    comparison = compare(lr.load(args.base), lr.load(args.new), args.metric, args.threshold,
                         args.alpha, args.ignore_backend, args.ignore_device)
    sys.stdout.write(render_text(comparison))
    if args.md:
        lr.write_text_atomic(args.md, render_markdown(comparison))
    if args.json:
        lr.write_text_atomic(args.json, render_json(comparison))
    return comparison.exit_status


if __name__ == "__main__":
    lr.run_cli(main)

#!/usr/bin/python3
"""Compare two lattnbench result files case by case, and say whether NEW regressed against BASE.

    compare.py BASE.json NEW.json [--threshold 10%] [--alpha 0.05] [--bootstrap 10000] [--strict]
               [--allow-gone] [--allow-new] [--metric median_ms] [--ignore-device] [--ignore-backend]
               [--md FILE] [--json FILE]

A case is SLOWER or FASTER only when its change is past the threshold and so is the whole
confidence interval of NEW/BASE (a seeded bootstrap over the two records' samples_ms); SAME only
when that interval lies inside the threshold; UNSURE otherwise, or when too few samples were
recorded to tell. Exit status: 0 no SLOWER, FAILED, GONE or NEW case (speed-ups never fail; UNSURE
fails only under --strict; GONE and NEW pass under --allow-gone and --allow-new), 1 otherwise, 2 bad
input. Rules: docs/compare.md.
"""

import argparse
import json
import math
import sys
import zlib
from dataclasses import dataclass

try:
    from . import lattn_results as lr  # as part of the lattnbench Python package (python/)
except ImportError:
    import lattn_results as lr  # as the script, beside lattn_results.py

EXIT_OK = 0
EXIT_REGRESSION = 1

TIME_METRICS = ("median_ms", "mean_ms", "min_ms", "max_ms", "q1_ms", "q3_ms")

DEFAULT_THRESHOLD = "10%"   # two runs on a shared VM drift 5-12% per case: docs/compare.md
DEFAULT_ALPHA = 0.05         # a 95% confidence interval
DEFAULT_BOOTSTRAP = 10000    # resamples per interval

# Below this many samples on either side the bootstrap's interval is mostly the samples' own
# extremes (with 3, a resampled median is the smallest sample a quarter of the time): no verdict.
MIN_SAMPLES = 5

# Every interval is drawn from its own generator, seeded from this and the case's name: the same
# two files give the same verdicts on every run, whatever other cases they hold.
BOOTSTRAP_SEED = 20240601

# The statistic each --metric is of, for resampling the samples.
_STATISTICS = {"median_ms": ("median", None), "mean_ms": ("mean", None), "min_ms": ("min", None),
               "max_ms": ("max", None), "q1_ms": ("percentile", 25), "q3_ms": ("percentile", 75)}

VERDICT_ORDER = ("SLOWER", "FAILED", "UNSURE", "FASTER", "SAME", "NEW", "GONE", "SKIPPED")
REGRESSIONS = {"SLOWER", "FAILED"}
TIMED_VERDICTS = {"SAME", "FASTER", "SLOWER", "UNSURE"}


@dataclass
class Row:
    key: tuple
    label: str
    verdict: str
    base_value: float | None = None
    new_value: float | None = None
    test: str = ""
    interval: tuple | None = None    # (low, high) bounds of NEW/BASE; see Interval
    interval_kind: str = ""
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
    bootstrap: int
    strict: bool
    backend_ignored_because: str | None
    devices_differ: bool
    rows: list
    winners: list
    crossovers: list
    # A case only in BASE (GONE) or only in NEW (NEW) fails the gate unless allowed: a run that
    # silently lost cases must not pass.
    allow_gone: bool = False
    allow_new: bool = False

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
    def unsure(self):
        return any(row.verdict == "UNSURE" for row in self.rows)

    @property
    def unmatched(self):
        """The verdicts, GONE and NEW, that fail the gate here."""
        return [v for v, allowed in (("GONE", self.allow_gone), ("NEW", self.allow_new))
                if not allowed and any(row.verdict == v for row in self.rows)]

    @property
    def exit_status(self):
        failing = self.regressed or self.unmatched or (self.strict and self.unsure)
        return EXIT_REGRESSION if failing else EXIT_OK

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
        shown = ", ".join(f"{counts[v]} {v}" for v in VERDICT_ORDER
                          if counts[v] or v in REGRESSIONS or v in self.unmatched)
        if self.regressed:
            head = "REGRESSION"
        elif self.unmatched:
            flags = " or ".join(f"--allow-{v.lower()}" for v in self.unmatched)
            head = f"CASES {' AND '.join(self.unmatched)} (not allowed without {flags})"
        elif self.unsure:
            head = "UNSURE (--strict)" if self.strict else "no significant regression, some cases UNSURE"
        else:
            head = "no significant regression"
        return (f"{head}: {shown} ({self.metric}, threshold {format_pct(self.threshold)}, "
                f"{format_pct(1 - self.alpha)} confidence)")


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


def parse_bootstrap(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 100:
        raise argparse.ArgumentTypeError(f"bad bootstrap count {text!r}: must be an integer >= 100")
    return value


def format_pct(fraction):
    return f"{fraction * 100:g}%"


@dataclass
class Options:
    metric: str
    threshold: float
    alpha: float
    bootstrap: int


@dataclass
class Interval:
    """What is known about the ratio of two records' metric (second over first).

    kind: "CI" (bootstrap confidence interval over samples_ms), "IQR" (a side without samples,
    quartiles on both: from the first's q3 and the second's q1 to the first's q1 and the second's
    q3, the ratio of two values each inside its record's middle half), or "none" (too few samples
    and no quartiles: nothing to say; `why` tells).
    """
    kind: str
    low: float | None = None
    high: float | None = None
    why: str = ""

    @property
    def known(self):
        return self.low is not None

    def label(self, alpha):
        if not self.known:
            return self.why
        name = f"{format_pct(1 - alpha)} CI" if self.kind == "CI" else "IQR"
        return f"{name} {(self.low - 1) * 100:+.1f}..{(self.high - 1) * 100:+.1f}%"


def _samples(record):
    samples = record.get("samples_ms")
    if not isinstance(samples, list):
        return None
    values = [lr.number(s) for s in samples]
    return values if values and all(v is not None and v > 0 for v in values) else None


def _statistic(values, metric):
    import numpy as np
    name, q = _STATISTICS[metric]
    if name == "percentile":
        return np.percentile(values, q, axis=1)
    return getattr(np, name)(values, axis=1)


def ratio_interval(first, second, options, seed_text):
    """The Interval of second's metric over first's."""
    a, b = _samples(first), _samples(second)
    if a is not None and b is not None and min(len(a), len(b)) >= MIN_SAMPLES:
        # Imported here so that reading files and printing errors works without numpy.
        try:
            import numpy as np
        except ImportError:
            raise lr.ResultFileError("numpy is needed for the bootstrap over samples_ms "
                                     "(Debian: apt-get install python3-numpy)") from None
        rng = np.random.default_rng([BOOTSTRAP_SEED, zlib.crc32(seed_text.encode("utf-8"))])
        a, b = np.asarray(a), np.asarray(b)
        first_stats = _statistic(a[rng.integers(0, len(a), (options.bootstrap, len(a)))], options.metric)
        second_stats = _statistic(b[rng.integers(0, len(b), (options.bootstrap, len(b)))], options.metric)
        low, high = np.quantile(second_stats / first_stats, [options.alpha / 2, 1 - options.alpha / 2])
        return Interval("CI", float(low), float(high))
    quartiles = [lr.number(r.get(k)) for r in (first, second) for k in ("q1_ms", "q3_ms")]
    # A side without samples (the reference file) is read by its quartiles, and so is the other.
    if (a is None or b is None) and None not in quartiles and min(quartiles) > 0:
        first_q1, first_q3, second_q1, second_q3 = quartiles
        return Interval("IQR", second_q1 / first_q3, second_q3 / first_q1)
    if a is not None or b is not None:
        counts = "+".join(str(len(s)) if s else "0" for s in (a, b))
        return Interval("none", why=f"too few samples ({counts}; {MIN_SAMPLES} a side decide)")
    return Interval("none", why="no spread recorded")


def verdict(ratio, interval, threshold):
    """SLOWER/FASTER: the change and its whole interval past the threshold; SAME: the interval
    inside it; UNSURE: anything else, including no interval at all."""
    if not interval.known:
        return "UNSURE"
    if ratio > 1 + threshold and interval.low > 1 + threshold:
        return "SLOWER"
    if ratio < 1 - threshold and interval.high < 1 - threshold:
        return "FASTER"
    if interval.low >= 1 - threshold and interval.high <= 1 + threshold:
        return "SAME"
    return "UNSURE"


def failed_check(record):
    """Why the record's own correctness check failed, or '' when it passed."""
    if record.get("status") == "failed":
        return "status failed"
    rel_err, tolerance = lr.number(record.get("rel_err")), lr.number(record.get("tolerance"))
    if rel_err is not None and tolerance is not None and rel_err > tolerance:
        return f"rel_err {rel_err:.2e} > tolerance {tolerance:.2e}"
    return ""


def judge(key, base, new, options, ignore):
    record = new if new is not None else base
    row = Row(key, lr.describe_case(record, ignore), verdict="SAME",
              base_temp_mb=lr.number(base.get("temp_mb")) if base else None,
              new_temp_mb=lr.number(new.get("temp_mb")) if new else None)
    metric = options.metric
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
        interval = ratio_interval(base, new, options, row.label)
        row.test = interval.label(options.alpha)
        row.interval = (interval.low, interval.high) if interval.known else None
        row.interval_kind = interval.kind
        row.verdict = verdict(row.ratio, interval, options.threshold)
        # A case a stop request cut short (stopped_on "interrupted") took fewer samples than its
        # rules asked for: its samples are real, but no verdict rests on a partial measurement.
        partial = [side for side, r in (("base", base), ("new", new)) if r.get("stopped_on") == "interrupted"]
        if partial:
            row.verdict = "UNSURE"
            row.note = " and ".join(partial) + " partial (interrupted)"
            return row
        # Same case, different algorithm for the backward's chunk states: say so beside the verdict.
        if base.get("bwd_states") and new.get("bwd_states") and base["bwd_states"] != new["bwd_states"]:
            row.note = f"bwd_states {base['bwd_states']} -> {new['bwd_states']}"
    return row


def fastest_impls(result_file, options, ignore):
    """Per shape and mode (the identity without impl): the fastest impl, its margin over the
    runner-up and how sure that is: `clear` when the interval of runner-up / fastest lies above 1,
    `tie` when it reaches down to 1 (the order is within noise), `unknown` without an interval.

    Records that did not pass (lr.passed: failed, skipped, without samples) are left out: a kernel
    that computes the wrong answer wins nothing.
    """
    metric = options.metric
    groups = {}
    for record in result_file.records:
        if lr.passed(record) and lr.number(record.get(metric)):
            groups.setdefault(lr.case_key(record, ignore | {"impl"}), []).append(record)
    winners = []
    for records in groups.values():
        if len({r.get("impl") for r in records}) < 2:
            continue
        best, runner_up = sorted(records, key=lambda r: r[metric])[:2]
        shape = lr.describe_case(best, ignore | {"impl"})
        interval = ratio_interval(best, runner_up, options, f"{shape} {best['impl']} {runner_up['impl']}")
        confidence = "unknown" if not interval.known else "clear" if interval.low > 1 else "tie"
        winners.append({
            "shape": shape,
            "series_key": lr.case_key(best, ignore | {"impl", "seq"}),
            "seq": best.get("seq"), "winner": best["impl"], "runner_up": runner_up["impl"],
            "factor": runner_up[metric] / best[metric],
            "confidence": confidence, "interval_kind": interval.kind,
            "factor_low": interval.low, "factor_high": interval.high,
            "winner_temp_mb": lr.number(best.get("temp_mb")),
            "runner_up_temp_mb": lr.number(runner_up.get("temp_mb")),
        })
    return winners


def crossovers(winners, ignore):
    """Where the fastest impl changes as seq grows, per series (the shape without seq).

    Only clear winners count: a tie (or a point without an interval) sits between two winners
    without making or breaking a crossover, and is listed under `ties`.
    """
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
        decided = [w for w in points if w["confidence"] == "clear"]
        changes = [(a, b) for a, b in zip(decided, decided[1:]) if a["winner"] != b["winner"]]
        found.append({
            "series": label, "seqs": [w["seq"] for w in points],
            "points": [{"seq": w["seq"], "fastest": w["winner"] if w["confidence"] == "clear" else w["confidence"]}
                       for w in points],
            "changes": [{"from": a["winner"], "to": b["winner"], "last_seq_before": a["seq"],
                         "crossover_seq": b["seq"]} for a, b in changes],
            "winner": decided[0]["winner"] if decided and not changes else None,
            "ties": [w["seq"] for w in points if w["confidence"] != "clear"],
        })
    return found


def compare(base, new, options, ignore_backend, ignore_device, strict=False, allow_gone=False, allow_new=False):
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
    rows = [judge(k, base_index.get(k), new_index.get(k), options, ignore) for k in keys]
    winners = fastest_impls(new, options, ignore)
    # True only under --ignore-device: differing devices were refused above otherwise.
    devices_differ = not base.same_device(new)
    return Comparison(base, new, options.metric, options.threshold, options.alpha, options.bootstrap, strict,
                      reason, devices_differ, rows, winners, crossovers(winners, ignore), allow_gone, allow_new)


# ---- output ------------------------------------------------------------------------------------

def _fmt(value):
    return "-" if value is None else f"{value:.4g}"


def _change(row):
    return "-" if row.ratio is None else f"{(row.ratio - 1) * 100:+.1f}%"


def table(comparison):
    """Header and rows of the per-case table; the last row is the geometric mean."""
    unit = comparison.metric
    header = ["case", f"base {unit}", f"new {unit}", "change", "interval", "verdict"]
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


def _factor_interval(w, alpha):
    if w["factor_low"] is None:
        return "no interval"
    name = f"{format_pct(1 - alpha)} CI" if w["interval_kind"] == "CI" else "IQR"
    return f"{name} {w['factor_low']:.2f}-{w['factor_high']:.2f}x"


def _seq_list(seqs):
    return ", ".join(f"T={s}" for s in seqs)


def winner_lines(comparison):
    lines = []
    for w in comparison.winners:
        memory = ""
        if w["winner_temp_mb"] is not None and w["runner_up_temp_mb"] is not None:
            memory = (f"; temp {w['winner_temp_mb']:.4g} MiB vs {w['runner_up_temp_mb']:.4g} MiB "
                      f"({w['winner_temp_mb'] - w['runner_up_temp_mb']:+.4g} MiB)")
        spread = _factor_interval(w, comparison.alpha)
        if w["confidence"] == "clear":
            lines.append(f"{w['shape']}: {w['winner']} is {w['factor']:.2f}x faster than "
                         f"{w['runner_up']} ({spread}){memory}")
        elif w["confidence"] == "tie":
            lines.append(f"{w['shape']}: tie: {w['winner']} and {w['runner_up']} within noise "
                         f"({w['factor']:.2f}x, {spread}){memory}")
        else:
            why = ratio_label_without_interval(w)
            lines.append(f"{w['shape']}: {w['winner']} {w['factor']:.2f}x ahead of {w['runner_up']}, "
                         f"unsure ({why}){memory}")
    for c in comparison.crossovers:
        ties = f"; tie or unsure at {_seq_list(c['ties'])}" if c["ties"] else ""
        if c["changes"]:
            steps = ", ".join(f"{ch['from']} -> {ch['to']} at T={ch['crossover_seq']} "
                              f"(after T={ch['last_seq_before']})" for ch in c["changes"])
            lines.append(f"crossover {c['series']}: {steps}{ties}")
        elif c["winner"] is not None and not c["ties"]:
            lines.append(f"no crossover {c['series']}: {c['winner']} fastest at every T "
                         f"from {c['seqs'][0]} to {c['seqs'][-1]}")
        elif c["winner"] is not None:
            won = [p["seq"] for p in c["points"] if p["fastest"] == c["winner"]]
            lines.append(f"no crossover {c['series']}: {c['winner']} fastest at {_seq_list(won)}{ties}")
        else:
            lines.append(f"no clear winner {c['series']}: tie or unsure at every T "
                         f"from {c['seqs'][0]} to {c['seqs'][-1]}")
    return lines


def ratio_label_without_interval(winner):
    return "too few samples" if winner["interval_kind"] == "none" else "no spread recorded"


def _tuning_choices(raw):
    """The device block's CPU kernel choices ("scan.tokens_per_walk" -> value), {} when not recorded."""
    device = raw.get("device") if isinstance(raw.get("device"), dict) else {}
    tuning = device.get("tuning") if isinstance(device.get("tuning"), dict) else {}
    choices = tuning.get("choices") if isinstance(tuning.get("choices"), dict) else {}
    return {f"{kernel}.{name}": value for kernel, values in choices.items() if isinstance(values, dict)
            for name, value in values.items()}


def tuning_line(base_raw, new_raw):
    """A line when the two runs' CPU kernels ran with different runtime choices (docs/performance.md,
    "Tuning per CPU"): then the times compare the choices as well as the code."""
    base, new = _tuning_choices(base_raw), _tuning_choices(new_raw)
    if not base or not new or base == new:
        return None
    differ = [f"{key} {base.get(key, '-')} -> {new.get(key, '-')}" for key in sorted(set(base) | set(new))
              if base.get(key) != new.get(key)]
    return "tuning differs (the CPU kernels' runtime choices, BASE -> NEW): " + ", ".join(differ)


def header_lines(comparison):
    lines = [f"BASE {comparison.base.path} [{comparison.base.format_name}; {comparison.base.fingerprint}]",
             f"NEW  {comparison.new.path} [{comparison.new.format_name}; {comparison.new.fingerprint}]"]
    # lattnbench's own warnings (a loaded machine, a spread sgemm peak): the likeliest reason a
    # whole run moved, printed where the verdicts are read.
    for name, f in (("BASE", comparison.base), ("NEW", comparison.new)):
        warnings = f.raw.get("warnings")
        for warning in warnings if isinstance(warnings, list) else []:
            lines.append(f"{name} warning: {warning}")
    if (line := tuning_line(comparison.base.raw, comparison.new.raw)) is not None:
        lines.append(line)
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
    icon = (":x:" if comparison.exit_status != EXIT_OK else
            ":grey_question:" if comparison.unsure else ":white_check_mark:")
    out = [f"{icon} **{comparison.summary()}**", ""]
    out += [f"`{line}`  " for line in header_lines(comparison)] + [""]

    def cell(text, column):
        text = str(text).replace("|", "\\|")
        if column == 0 and text and not text.startswith("geomean"):
            return f"`{text}`"
        if column == 5 and text in REGRESSIONS:
            return f"**{text}**"
        if column == 5 and text == "UNSURE":
            return f"_{text}_"
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
        return {"path": f.path, "format": f.format_name, "version": f.raw.get("version"),
                "schema_version": f.raw.get("schema_version"), "device": f.fingerprint,
                "warnings": f.raw.get("warnings") if isinstance(f.raw.get("warnings"), list) else []}

    doc = {
        "base": file_block(comparison.base), "new": file_block(comparison.new),
        "metric": comparison.metric, "threshold_pct": comparison.threshold * 100,
        "alpha": comparison.alpha, "confidence_pct": (1 - comparison.alpha) * 100,
        "bootstrap": comparison.bootstrap, "bootstrap_seed": BOOTSTRAP_SEED, "min_samples": MIN_SAMPLES,
        "strict": comparison.strict, "allow_gone": comparison.allow_gone, "allow_new": comparison.allow_new,
        "backend_ignored_because": comparison.backend_ignored_because,
        "devices_differ": comparison.devices_differ,
        "cases": [{
            "case": lr.key_as_dict(r.key), "label": r.label, "verdict": r.verdict,
            "base": r.base_value, "new": r.new_value,
            "change_pct": None if r.ratio is None else (r.ratio - 1) * 100,
            "test": r.test, "interval_kind": r.interval_kind,
            "interval_pct": None if r.interval is None else [(v - 1) * 100 for v in r.interval],
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
    parser.add_argument("--threshold", type=parse_threshold, default=parse_threshold(DEFAULT_THRESHOLD),
                        help="smallest change that counts, e.g. 5%% (default " + DEFAULT_THRESHOLD.replace("%", "%%") + ")")
    parser.add_argument("--alpha", type=parse_alpha, default=DEFAULT_ALPHA,
                        help=f"1 - the confidence level of the intervals (default {DEFAULT_ALPHA}: 95%%)")
    parser.add_argument("--bootstrap", type=parse_bootstrap, default=DEFAULT_BOOTSTRAP, metavar="N",
                        help=f"resamples per bootstrap interval (default {DEFAULT_BOOTSTRAP})")
    parser.add_argument("--strict", action="store_true", help="exit 1 on an UNSURE case too")
    parser.add_argument("--allow-gone", action="store_true",
                        help="cases of BASE missing from NEW (GONE) do not fail the run")
    parser.add_argument("--allow-new", action="store_true",
                        help="cases of NEW missing from BASE (NEW) do not fail the run")
    parser.add_argument("--metric", choices=TIME_METRICS, default="median_ms")
    parser.add_argument("--ignore-device", action="store_true", help="compare files from different devices")
    parser.add_argument("--ignore-backend", action="store_true", help="match cases across backends")
    parser.add_argument("--md", metavar="FILE", help="also write a markdown table for a PR comment")
    parser.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    args = parser.parse_args(argv)

    options = Options(args.metric, args.threshold, args.alpha, args.bootstrap)
    comparison = compare(lr.load(args.base), lr.load(args.new), options, args.ignore_backend,
                         args.ignore_device, args.strict, args.allow_gone, args.allow_new)
    sys.stdout.write(render_text(comparison))
    if args.md:
        lr.write_text_atomic(args.md, render_markdown(comparison))
    if args.json:
        lr.write_text_atomic(args.json, render_json(comparison))
    return comparison.exit_status


if __name__ == "__main__":
    lr.run_cli(main)

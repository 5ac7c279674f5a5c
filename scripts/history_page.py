"""The page `history.py html` writes: one self-contained HTML file (inline CSS and SVG, no script, no
font or image fetched: it opens from a file:// path with no network).

Per case key a plot of the median over commits with the quartile band, one series per device
fingerprint, each point marked with compare.py's verdict against the previous commit's run on the
same device; above the plots, a table of the latest verdicts with the slower cases first. Every
point's SVG <title> (a tooltip) names its commit, date, device and config. Verdicts are computed by
compare.compare itself on consecutive runs of one device, so the page and the CI gate never disagree.
"""

import html
import json
import math
from dataclasses import dataclass, field

try:
    from . import compare, lattn_results as lr  # as part of a package
except ImportError:
    import compare
    import lattn_results as lr

# Each plot area's frame, drawn in a colour nothing else on the page uses: the screenshot test finds
# the charts in a rendering by it (tests/python/history_screenshot_test.py).
FRAME_COLOUR = "#5b6b8c"
# Series colours, one per device; red, green and amber are left to the verdicts.
PALETTE = ("#1f77b4", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79")
VERDICT_COLOUR = {"SLOWER": "#d62728", "FASTER": "#2ca02c", "UNSURE": "#e6a700", "FAILED": "#000000"}
VERDICT_SHAPE = {"SLOWER": "up", "FASTER": "down", "UNSURE": "diamond", "FAILED": "cross"}

WIDTH, HEIGHT = 390, 196
LEFT, RIGHT, TOP, BOTTOM = 54, 380, 12, 158   # the plot area
X_PAD = 12                                      # keeps the points off the frame


@dataclass
class Series:
    """One device's runs, one per commit (the latest run of each), in commit order."""
    device: str
    label: str
    colour: str
    runs: list = field(default_factory=list)
    files: list = field(default_factory=list)
    indexes: list = field(default_factory=list)     # {case_key: record} per run
    rows: list = field(default_factory=list)        # {case_key: compare.Row} against the run before; {} first

    @property
    def latest_rows(self):
        return self.rows[-1] if len(self.runs) > 1 else {}


def build_series(runs, options):
    """(commits in order of their first run, [Series]) with every run judged against the one before."""
    first_seen = {}
    for run in sorted(runs, key=lambda r: r.date):
        first_seen.setdefault(run.commit, run.date)
    commits = sorted(first_seen, key=lambda c: (first_seen[c], c))
    order = {c: i for i, c in enumerate(commits)}
    latest = {}
    for run in runs:
        slot = (run.device, run.commit)
        if slot not in latest or run.date > latest[slot].date:
            latest[slot] = run
    by_device = {}
    for run in sorted(latest.values(), key=lambda r: (order[r.commit], r.date)):
        if run.device not in by_device:
            by_device[run.device] = Series(run.device, run.device_label, PALETTE[len(by_device) % len(PALETTE)])
        by_device[run.device].runs.append(run)
    series = list(by_device.values())
    # Every file is loaded before any case key is taken: keys span the identity keys of all of them.
    for s in series:
        s.files = [run.result_file() for run in s.runs]
    for s in series:
        s.indexes = [lr.index_by_case(f) for f in s.files]
        s.rows = [{}] + [{row.key: row for row in compare.compare(before, after, options, False, False).rows}
                         for before, after in zip(s.files, s.files[1:])]
    return commits, series


def case_keys(series):
    """Every case key of the history with a record to label it, in the order first recorded."""
    keys = {}
    for s in series:
        for index in s.indexes:
            for key, record in index.items():
                keys.setdefault(key, record)
    return keys


def render(runs, options, title, history_path):
    commits, series = build_series(runs, options)
    keys = case_keys(series)
    anchors = {key: f"case-{n}" for n, key in enumerate(keys, start=1)}
    labels = {key: lr.describe_case(record) for key, record in keys.items()}
    out = [_HEAD.format(title=_e(title))]
    out.append(f"<h1>{_e(title)}</h1>")
    out.append(_overview(runs, commits, series, options, history_path))
    out.append(_table(series, anchors, labels))
    out.append('<h2>Per case</h2><div class="charts">')
    for key in keys:
        out.append(_chart(key, anchors[key], labels[key], commits, series, options))
    out.append("</div>")
    out.append(_runs_table(series))
    out.append("</body></html>\n")
    return "\n".join(out)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 6px; }} h2 {{ font-size: 16px; margin: 18px 0 6px; }}
p, li {{ font-size: 13px; }} .legend span {{ margin-right: 14px; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; vertical-align: middle; margin-right: 4px; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; }} td.num {{ text-align: right; }}
.v-SLOWER {{ color: #d62728; font-weight: bold; }} .v-FASTER {{ color: #2ca02c; font-weight: bold; }}
.v-UNSURE {{ color: #b07d00; }} .v-FAILED {{ font-weight: bold; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 8px; }}
figure.chart {{ width: 396px; margin: 0; border: 1px solid #eee; padding: 2px; }}
figure.chart figcaption {{ font-size: 12px; font-weight: bold; padding: 2px 4px; }}
ul.latest {{ list-style: none; margin: 0; padding: 0 4px 2px; }} ul.latest li {{ font-size: 11px; }}
</style></head><body>"""


def _e(text):
    return html.escape(str(text), quote=True)


def _fmt_ms(value):
    return "-" if value is None else f"{value:.4g} ms"


def _change(row):
    return "-" if row.ratio is None else f"{(row.ratio - 1) * 100:+.1f}%"


def _overview(runs, commits, series, options, history_path):
    dates = sorted(r.date for r in runs)
    legend = "".join(f'<span><i class="swatch" style="background:{s.colour}"></i>{_e(s.label)} '
                     f'<small>[{_e(s.device)}]</small>: {len(s.runs)} commit{"s" if len(s.runs) != 1 else ""}</span>'
                     for s in series)
    markers = "".join(f'<span>{_marker_svg(v)} {v}</span>' for v in ("SLOWER", "FASTER", "UNSURE", "FAILED"))
    confidence = compare.format_pct(1 - options.alpha)
    def count(n, word):
        return f"{n} {word}" + ("" if n == 1 else "s")

    return (f"<p>{count(len(runs), 'run')} of {count(len(commits), 'commit')} on {count(len(series), 'device')}, "
            f"{_e(dates[0])} to {_e(dates[-1])}, from <code>{_e(history_path)}</code>.</p>"
            f'<p class="legend">{legend}</p>'
            f"<p>Each point is a run's median ({options.metric}), the band its quartiles (q1 to q3); "
            f"a device re-run at one commit shows its latest run. Each run is judged against the run of "
            f"the previous commit on the same device by compare.py's rule (docs/compare.md): SLOWER or "
            f"FASTER when the change and its whole {confidence} bootstrap interval pass "
            f"{compare.format_pct(options.threshold)}, SAME when the interval lies inside it, UNSURE "
            f"otherwise. Hover a point for its commit, device and config.</p>"
            f'<p class="legend">{markers}<span>no marker: SAME or first run</span></p>')


def _table_order(item):
    series, row = item
    rank = compare.VERDICT_ORDER.index(row.verdict)
    # Within a verdict the largest change first (for FASTER the largest speed-up): the worst on top.
    ratio = row.ratio or 1.0
    return (rank, -ratio if row.verdict != "FASTER" else ratio, row.label, series.device)


def _table(series, anchors, labels):
    """The latest verdicts, every device's, slower first; the SAME ones folded away below."""
    items = sorted(((s, row) for s in series for row in s.latest_rows.values()), key=_table_order)
    head = ('<thead><tr><th>verdict</th><th>case</th><th>change</th><th>interval</th><th>previous</th>'
            '<th>latest</th><th>device</th><th>note</th></tr></thead>')
    changed = [_table_row(s, row, anchors, labels) for s, row in items if row.verdict != "SAME"]
    same = [_table_row(s, row, anchors, labels) for s, row in items if row.verdict == "SAME"]
    out = ['<h2>Latest run against the previous commit, slower first</h2>']
    if not items:
        out.append("<p>No device has two commits yet: nothing to compare.</p>")
        return "".join(out)
    out.append(f'<table class="slower-first">{head}<tbody>{"".join(changed)}</tbody></table>' if changed else
               "<p>Every case is SAME as at the previous commit.</p>")
    if same:
        out.append(f'<details><summary>{len(same)} SAME (case and device)</summary>'
                   f'<table class="same">{head}<tbody>{"".join(same)}</tbody></table></details>')
    return "".join(out)


def _table_row(s, row, anchors, labels):
    before, after = s.runs[-2], s.runs[-1]
    case = labels.get(row.key, row.label)
    link = f'<a href="#{anchors[row.key]}">{_e(case)}</a>' if row.key in anchors else _e(case)
    return (f'<tr data-verdict="{row.verdict}" data-case="{_e(case)}" data-device="{_e(s.device)}">'
            f'<td class="v-{row.verdict}">{row.verdict}</td><td>{link}</td><td class="num">{_change(row)}</td>'
            f'<td>{_e(row.test)}</td><td>{_e(before.commit[:10])}: {_fmt_ms(row.base_value)}</td>'
            f'<td>{_e(after.commit[:10])}: {_fmt_ms(row.new_value)}</td>'
            f'<td><i class="swatch" style="background:{s.colour}"></i>{_e(s.label)}</td><td>{_e(row.note)}</td></tr>')


def _ticks(low, high, count=4):
    step_raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(step_raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if step_raw <= m * magnitude)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _unit(high_ms):
    """(name, factor from ms) so that tick labels are short."""
    if high_ms < 1:
        return "µs", 1e3
    if high_ms >= 1000:
        return "s", 1e-3
    return "ms", 1.0


def _marker_svg(verdict):
    shape = _marker(verdict, 8, 8, VERDICT_COLOUR[verdict], "#555")
    return f'<svg width="16" height="16" style="vertical-align:middle">{shape}</svg>'


def _marker(verdict, x, y, fill, stroke, attrs="", inner=""):
    """The point's shape: a circle where no verdict is marked, else the verdict's own shape."""
    shape = VERDICT_SHAPE.get(verdict)
    common = f'fill="{fill}" stroke="{stroke}" stroke-width="1.2" {attrs}'
    if shape is None:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.2" {common}>{inner}</circle>'
    r = 5.5
    paths = {"up": f"M{x:.1f},{y - r:.1f} L{x + r:.1f},{y + r * 0.8:.1f} L{x - r:.1f},{y + r * 0.8:.1f} Z",
             "down": f"M{x:.1f},{y + r:.1f} L{x + r:.1f},{y - r * 0.8:.1f} L{x - r:.1f},{y - r * 0.8:.1f} Z",
             "diamond": f"M{x:.1f},{y - r:.1f} L{x + r:.1f},{y:.1f} L{x:.1f},{y + r:.1f} L{x - r:.1f},{y:.1f} Z",
             "cross": (f"M{x - r:.1f},{y - r:.1f} L{x + r:.1f},{y + r:.1f} M{x - r:.1f},{y + r:.1f} "
                       f"L{x + r:.1f},{y - r:.1f}")}
    if shape == "cross":
        common = f'fill="none" stroke="{fill}" stroke-width="2" {attrs}'
    return f'<path d="{paths[shape]}" {common}>{inner}</path>'


def _point_title(run, record, row, before):
    samples = record.get("samples_ms")
    lines = [f"commit {run.short_commit}, {run.date}",
             f"device: {run.device_label} [{run.device}]",
             f"median {_fmt_ms(lr.number(record.get('median_ms')))}, quartiles "
             f"{_fmt_ms(lr.number(record.get('q1_ms')))} to {_fmt_ms(lr.number(record.get('q3_ms')))}"
             + (f", {len(samples)} samples" if isinstance(samples, list) else "")]
    if row is not None and before is not None:
        test = f" ({row.test})" if row.test else ""
        note = f"; {row.note}" if row.note else ""
        lines.append(f"against {before.commit[:10]}: {row.verdict} {_change(row)}{test}{note}")
    elif before is None:
        lines.append("first run of this device: no verdict")
    lines.append(f"config: {config_summary(run.doc.get('config'))} (in full: the runs table)")
    return _e("\n".join(lines))


def config_summary(config):
    """The config's settings without the suites' axes (the case itself names its shape)."""
    if not isinstance(config, dict):
        return "not recorded"
    return ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(config.items()) if not isinstance(v, (dict, list)))


def _chart(key, anchor, label, commits, series, options):
    metric = options.metric
    # The points per series: (commit position, run, record, row, run before).
    plotted = []
    for s in series:
        points = []
        for i, (run, index) in enumerate(zip(s.runs, s.indexes)):
            record = index.get(key)
            if record is not None and lr.number(record.get(metric)) is not None:
                points.append((commits.index(run.commit), run, record, s.rows[i].get(key),
                               s.runs[i - 1] if i > 0 else None))
        plotted.append((s, points))
    values = [v for _, points in plotted for _, _, r, _, _ in points
              for v in (lr.number(r.get(k)) for k in (metric, "q1_ms", "q3_ms")) if v is not None]
    out = [f'<figure class="chart" id="{anchor}" data-case="{_e(label)}"><figcaption>{_e(label)}</figcaption>',
           f'<svg class="plot" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-label="{_e(label)}" font-family="sans-serif" font-size="10">',
           f'<rect x="{LEFT + 0.5}" y="{TOP + 0.5}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="#fff" '
           f'stroke="{FRAME_COLOUR}" stroke-width="1" shape-rendering="crispEdges"/>']
    if values:
        low, high = min(values), max(values)
        if high == low:
            low, high = low * 0.95, high * 1.05
        pad = (high - low) * 0.08
        low, high = max(low - pad, 0.0), high + pad
        unit, factor = _unit(high)

        def y(v):
            return BOTTOM - (v - low) / (high - low) * (BOTTOM - TOP)

        def x(position):
            if len(commits) == 1:
                return (LEFT + RIGHT) / 2
            return LEFT + X_PAD + position * (RIGHT - LEFT - 2 * X_PAD) / (len(commits) - 1)

        for tick in _ticks(low, high):
            ty = y(tick)
            out.append(f'<line x1="{LEFT - 3}" x2="{LEFT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#888"/>'
                       f'<line x1="{LEFT + 1}" x2="{RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eee"/>'
                       f'<text x="{LEFT - 5}" y="{ty + 3:.1f}" text-anchor="end">{tick * factor:.4g}</text>')
        out.append(f'<text x="4" y="{TOP + 8}">{unit}</text>')
        every = max(1, math.ceil(len(commits) / 6))
        for position, commit in enumerate(commits):
            if position % every == 0 or position == len(commits) - 1:
                out.append(f'<text x="{x(position):.1f}" y="{BOTTOM + 13}" text-anchor="middle">'
                           f'{_e(commit[:7])}</text>')
        out.append(f'<text x="{(LEFT + RIGHT) / 2}" y="{BOTTOM + 28}" text-anchor="middle" fill="#666">'
                   f'commit (oldest to newest)</text>')
        for number, (s, points) in enumerate(plotted):
            if points:
                out.append(_series_svg(s, points, x, y, metric, number))
    out.append("</svg>")
    out.append('<ul class="latest">')
    for s, points in plotted:
        out.append(_latest_item(s, key, points))
    out.append("</ul></figure>")
    return "\n".join(out)


def _series_svg(s, points, x, y, metric, number):
    out = [f'<g class="series" data-device="{_e(s.device)}"><title>{_e(s.label)} [{_e(s.device)}]</title>']
    band = [(x(p), lr.number(r.get("q1_ms")), lr.number(r.get("q3_ms"))) for p, _, r, _, _ in points]
    band = [(px, q1, q3) for px, q1, q3 in band if q1 is not None and q3 is not None]
    if len(band) > 1:
        outline = [f"{px:.1f},{y(q3):.1f}" for px, _, q3 in band] + [f"{px:.1f},{y(q1):.1f}" for px, q1, _ in reversed(band)]
        out.append(f'<polygon class="band" points="{" ".join(outline)}" fill="{s.colour}" fill-opacity="0.2" stroke="none"/>')
    for px, q1, q3 in band:
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y(q1):.1f}" y2="{y(q3):.1f}" stroke="{s.colour}" '
                   f'stroke-opacity="0.6" stroke-width="3"/>')
    line = " ".join(f"{x(p):.1f},{y(lr.number(r[metric])):.1f}" for p, _, r, _, _ in points)
    out.append(f'<polyline points="{line}" fill="none" stroke="{s.colour}" stroke-width="1.6"/>')
    for n, (position, run, record, row, before) in enumerate(points):
        latest = n == len(points) - 1 and run is s.runs[-1]
        verdict = row.verdict if row is not None else "none"
        px, py = x(position), y(lr.number(record[metric]))
        attrs = (f'class="point" data-commit="{_e(run.commit)}" data-verdict="{verdict}"'
                 + (' data-latest="1"' if latest else ""))
        fill = VERDICT_COLOUR.get(verdict, s.colour)
        out.append(_marker(verdict, px, py, fill, s.colour, attrs, f"<title>{_point_title(run, record, row, before)}</title>"))
        if latest and verdict in VERDICT_COLOUR:
            out.append(f'<text x="{px - 8:.1f}" y="{py - 8 - 11 * number:.1f}" text-anchor="end" font-weight="bold" '
                       f'fill="{fill}">{verdict} {_change(row)}</text>')
    out.append("</g>")
    return "\n".join(out)


def _latest_item(s, key, points):
    swatch = f'<i class="swatch" style="background:{s.colour}"></i>'
    row = s.latest_rows.get(key)
    if row is None:
        why = "no run of this case" if not points else "one commit only" if len(s.runs) < 2 else \
            "not in its latest run" if points[-1][1] is not s.runs[-1] else "no verdict"
        return f'<li data-device="{_e(s.device)}" data-verdict="none">{swatch}{_e(s.label)}: {why}</li>'
    return (f'<li data-device="{_e(s.device)}" data-verdict="{row.verdict}">{swatch}{_e(s.label)}: latest '
            f'<span class="v-{row.verdict}">{row.verdict}</span> {_change(row)} against {_e(s.runs[-2].commit[:7])}</li>')


def _runs_table(series):
    rows = []
    for s in series:
        for run, result in zip(s.runs, s.files):
            config = json.dumps(run.doc.get("config"), indent=1, sort_keys=True)
            warnings = run.doc.get("warnings") if isinstance(run.doc.get("warnings"), list) else []
            rows.append(f'<tr><td><i class="swatch" style="background:{s.colour}"></i>{_e(s.label)}</td>'
                        f"<td>{_e(run.short_commit)}</td><td>{_e(run.date)}</td><td>{_e(_built_from(run))}</td>"
                        f"<td>{_e(result.format_name)}</td>"
                        f"<td>{len(result.records)}</td><td>{_e(run.source)}</td>"
                        f"<td>{_e('; '.join(map(str, warnings)))}</td>"
                        f"<td><details><summary>config</summary><pre>{_e(config)}</pre></details></td></tr>")
    return ("<h2>Runs</h2><table class=\"runs\"><thead><tr><th>device</th><th>commit</th><th>date</th><th>built from</th>"
            "<th>format</th><th>cases</th><th>file</th><th>warnings</th><th>config</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _built_from(run):
    """The binary's own git_revision: the commit itself, unless the run was stored under --commit."""
    device = run.doc.get("device") if isinstance(run.doc.get("device"), dict) else {}
    revision = device.get("git_revision")
    if not isinstance(revision, str) or revision == run.commit:
        return "the commit" if revision == run.commit else "not recorded"
    return revision[:10] + (" (dirty)" if device.get("git_dirty") is True else "")

#!/usr/bin/python3
"""Plot lattnbench result files: time, speed-up, workspace and fraction of peak against seq.

    plot.py FILE... --out-dir DIR [--format png,svg]

Per suite it writes <suite>-time (median with q1-q3 bars), <suite>-speedup (scan time / chunked
time), <suite>-temp_mb and, when records carry `peak_fraction`, <suite>-peak_fraction; one panel
per head dimension. An impl has one colour in every figure, a mode one marker, a file one line
style; with several files each legend entry names its file. A title names the devices of the
files drawn in that figure only.
"""

import importlib.util
import math
import os

import lattn_results as lr

FORMATS = ("png", "svg", "pdf")
FILE_STYLES = ["-", "--", ":", "-."]
SEQ_LABEL = "sequence length T (tokens)"

# Colours are the impl's in every figure: these first, any other impl after them in name order.
KNOWN_IMPLS = ("scan", "chunked")
RATIO_COLOUR = "black"   # speed-up lines are a ratio of two impls, not an impl
MODE_MARKERS = {"fwd": "o", "fwd_bwd": "s"}
OTHER_MARKERS = ["^", "D", "v", "P", "X"]

# Keys that vary along a line or between panels or files; the rest name a line.
_NOT_LINE_KEYS = {"seq", "dim", "head_dim", "backend"}


def parse_formats(text):
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise lr.ResultFileError(f"bad --format {text!r}: choose from {', '.join(FORMATS)}")
    return formats


def panel_dim(record):
    """The head dimension: `dim` for a kernel case, `head_dim` for a layer case."""
    head_dim = record.get("head_dim")
    return head_dim if head_dim is not None else record.get("dim")


def plottable(record):
    return (lr.passed(record) and lr.number(record.get("seq"))
            and lr.number(record.get("median_ms")) and panel_dim(record) is not None)


def line_label(key, varying):
    values = lr.key_as_dict(key)
    words = [str(values.get("impl", "")), str(values.get("mode", ""))]
    words += [f"{k}={values[k]}" for k in sorted(varying) if k in values and k not in ("impl", "mode")]
    return " ".join(w for w in words if w)


def log_ticks(low, high):
    """At least two tick values inside [low, high] (0 < low <= high) for a log axis: the decades when
    two or more fall inside (every other one, or sparser, past eight), else 1-2-5 steps, else finer
    steps, else the two ends."""
    first, last = math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1
    for mantissas in (("1",), ("1", "2", "5"), ("1", "1.5", "2", "3", "4", "5", "6", "7", "8")):
        ticks = [float(f"{m}e{e}") for e in range(first, last + 1) for m in mantissas]
        inside = [t for t in ticks if low <= t <= high]
        if len(inside) >= 2:
            step = math.ceil(len(inside) / 8) if len(mantissas) == 1 else 1
            return inside[::step]
    return [float(f"{low:.3g}"), float(f"{high:.3g}")] if f"{low:.3g}" != f"{high:.3g}" else [low, high]


def tick_label(value):
    """'0.002', '10', '1500', '1e+06': never a rounded-away '0'."""
    return f"{value:g}"


class Figures:
    def __init__(self, files, out_dir, formats, keep=False):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self.plt = plt
        self.files, self.out_dir, self.formats = files, out_dir, formats
        self.keep = keep         # keep the figures open in self.figures (for tests) instead of closing them
        self.figures = {}
        self.written = []
        self.file_tags = _file_tags(files)
        impls = sorted({str(r.get("impl")) for f in files for r in f.records if r.get("impl") is not None})
        order = list(KNOWN_IMPLS) + [i for i in impls if i not in KNOWN_IMPLS]
        palette = plt.get_cmap("tab10").colors
        self.impl_colours = {impl: palette[i % len(palette)] for i, impl in enumerate(order)}
        self.markers = dict(MODE_MARKERS)

    def file_legend(self, file_index):
        f = self.files[file_index]
        return f"{self.file_tags[file_index]}: [{', '.join(f.backends)}] {f.device_label}"

    def marker(self, mode):
        if mode not in self.markers:
            self.markers[mode] = OTHER_MARKERS[(len(self.markers) - len(MODE_MARKERS)) % len(OTHER_MARKERS)]
        return self.markers[mode]

    def series(self, suite, value_of):
        """{dim: {(file index, line key): [(seq, value, low, high)]}} for one suite;
        value_of(record) -> None or (value, low, high), low and high None without a spread."""
        panels = {}
        for file_index, f in enumerate(self.files):
            for record in f.records:
                if record.get("suite") != suite or not plottable(record):
                    continue
                value = value_of(record)
                if value is not None:
                    line = (file_index, lr.case_key(record, _NOT_LINE_KEYS))
                    lines = panels.setdefault(panel_dim(record), {})
                    lines.setdefault(line, []).append((record["seq"], *value))
        return panels

    def draw(self, suite, name, panels, ylabel, title, logy=True, unit_line=None):
        if logy:  # a log axis cannot show zero or less
            panels = {dim: {line: [p for p in points if p[1] > 0] for line, points in lines.items()}
                      for dim, lines in panels.items()}
            panels = {dim: {line: pts for line, pts in lines.items() if pts} for dim, lines in panels.items()}
            panels = {dim: lines for dim, lines in panels.items() if lines}
        if not panels:
            return
        from matplotlib.ticker import NullFormatter
        dims = sorted(panels)
        fig, axes = self.plt.subplots(1, len(dims), figsize=(4.8 * len(dims), 4.2), squeeze=False)
        dim_name = "head dim Dh" if suite == "layer" else "head dim D"
        legend = {}
        drawn_files = set()
        for ax, dim in zip(axes[0], dims):
            lines = panels[dim]
            varying = _varying_keys([key for _, key in lines])
            seqs, extent = set(), []
            for (file_index, key), points in sorted(lines.items(), key=lambda item: str(item[0])):
                points.sort(key=lambda p: p[0])
                drawn_files.add(file_index)
                seqs.update(p[0] for p in points)
                values = lr.key_as_dict(key)
                label = line_label(key, varying)
                colour = self.impl_colours.get(str(values.get("impl")), RATIO_COLOUR) if "impl" in values else RATIO_COLOUR
                if len(self.files) > 1:
                    label += f" - {self.file_tags[file_index]}"
                x = [p[0] for p in points]
                y = [p[1] for p in points]
                spread = [(p[2], p[3]) for p in points if p[2] is not None and p[3] is not None]
                yerr = None
                if len(spread) == len(points):
                    yerr = [[max(p[1] - p[2], 0) for p in points], [max(p[3] - p[1], 0) for p in points]]
                    extent += [v for pair in spread for v in pair]
                extent += y
                handle = ax.errorbar(x, y, yerr=yerr, linestyle=FILE_STYLES[file_index % len(FILE_STYLES)],
                                     marker=self.marker(values.get("mode")), color=colour, capsize=3 if yerr else 0,
                                     label=label)
                legend.setdefault(label, handle)
            if unit_line is not None:
                ax.axhline(unit_line, color="grey", linewidth=0.8)
            # Ticks at the measured seqs, written out: 2^11 makes the reader do arithmetic.
            ax.set_xscale("log", base=2)
            xticks = sorted(seqs)
            if len(xticks) == 1:  # one seq: a tick either side, so the axis reads as an axis
                xticks = [xticks[0] / 2, xticks[0], xticks[0] * 2]
                ax.set_xlim(xticks[0], xticks[-1])
            ax.set_xticks(xticks, [tick_label(s) for s in xticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
            if logy:
                ax.set_yscale("log")
                low, high = min(extent), max(extent)
                pad = max((high / low) ** 0.05, 1.1)
                low, high = low / pad, high * pad
                ax.set_ylim(low, high)
                ticks = log_ticks(low, high)
                ax.set_yticks(ticks, [tick_label(t) for t in ticks])
                ax.yaxis.set_minor_formatter(NullFormatter())
            else:
                ax.set_ylim(bottom=0)
            ax.set_title(f"{dim_name} = {dim}")
            ax.set_xlabel(SEQ_LABEL)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        # Only the files drawn here: a figure of the reference file alone names no other device.
        devices = "\n".join(self.file_legend(i) for i in sorted(drawn_files))
        fig.suptitle(f"{suite} suite: {title}\n{devices}", fontsize="medium")
        fig.tight_layout()
        fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize="small")
        for fmt in self.formats:
            path = os.path.join(self.out_dir, f"{suite}-{name}.{fmt}")
            fig.savefig(path, format=fmt, bbox_inches="tight")
            self.written.append(path)
        if self.keep:
            self.figures[f"{suite}-{name}"] = fig
        else:
            self.plt.close(fig)

    def speedup_panels(self, suite):
        """scan time / chunked time per file, shape and mode, keyed like series()."""
        times = self.series(suite, lambda r: (lr.number(r["median_ms"]), None, None)
                            if r.get("impl") in ("scan", "chunked") else None)
        panels = {}
        for dim, lines in times.items():
            by_impl = {}
            for (file_index, key), points in lines.items():
                values = lr.key_as_dict(key)
                shape = lr.case_key({**values, "impl": None}, _NOT_LINE_KEYS)
                by_impl.setdefault((file_index, shape), {})[values.get("impl")] = {p[0]: p[1] for p in points}
            for line, impls in by_impl.items():
                scan, chunked = impls.get("scan", {}), impls.get("chunked", {})
                ratio = [(seq, scan[seq] / chunked[seq], None, None) for seq in sorted(set(scan) & set(chunked))]
                if ratio:
                    panels.setdefault(dim, {})[line] = ratio
        return panels

    def write_all(self):
        suites = sorted({r.get("suite") for f in self.files for r in f.records if plottable(r)}, key=str)
        if not suites:
            raise lr.ResultFileError("nothing to plot: no ok record with seq and median_ms")
        for suite in suites:
            self.draw(suite, "time", self.series(suite, _time_with_quartiles),
                      "time per call (ms; median, bars q1-q3)", "time per call vs sequence length")
            self.draw(suite, "speedup", self.speedup_panels(suite),
                      "speed-up (scan ms / chunked ms)", "speed-up of chunked over scan",
                      logy=False, unit_line=1.0)
            self.draw(suite, "temp_mb", self.series(suite, lambda r: _plain(r.get("temp_mb"))),
                      "temp workspace per call (MiB)", "workspace beyond inputs and outputs")
            self.draw(suite, "peak_fraction", self.series(suite, lambda r: _plain(r.get("peak_fraction"))),
                      "fraction of device peak (peak_fraction)", "fraction of peak", logy=False)
        return self.written


def _plain(value):
    value = lr.number(value)
    return None if value is None else (value, None, None)


def _time_with_quartiles(record):
    q1, q3 = lr.number(record.get("q1_ms")), lr.number(record.get("q3_ms"))
    return lr.number(record["median_ms"]), q1, q3


def _file_tags(files):
    """A short, distinct name per file: its base name, or its path where base names repeat, with
    '#2', '#3' where one file is given twice."""
    names = [os.path.basename(f.path) for f in files]
    if len(set(names)) < len(names):
        names = [f.path for f in files]
    seen = {}
    tags = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        tags.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return tags


def _varying_keys(keys):
    """Identity keys whose value differs between the lines of one panel: those must be in the label."""
    columns = zip(*keys)
    return {name for name, column in zip(lr.identity_keys(), columns) if len(set(column)) > 1}


def main(argv):
    parser = lr.ArgumentParser(description="Plot lattnbench result files.")
    parser.add_argument("files", metavar="FILE", nargs="+")
    parser.add_argument("--out-dir", required=True, metavar="DIR")
    parser.add_argument("--format", default="png", help="comma-separated: png, svg, pdf (default png)")
    args = parser.parse_args(argv)
    formats = parse_formats(args.format)
    files = [lr.load(path) for path in args.files]
    if importlib.util.find_spec("matplotlib") is None:
        raise lr.ResultFileError("matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise lr.ResultFileError(f"{args.out_dir}: cannot create: {e.strerror}") from None
    for path in Figures(files, args.out_dir, formats).write_all():
        print(path)
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

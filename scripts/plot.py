#!/usr/bin/python3
"""Plot lattnbench result files: time, speed-up, workspace and fraction of peak against seq.

    plot.py FILE... --out-dir DIR [--format png,svg]

Per suite it writes <suite>-time, <suite>-speedup (scan time / chunked time), <suite>-temp_mb
and, when records carry `peak_fraction`, <suite>-peak_fraction; one panel per head dimension.
Several files are drawn with different line styles, each named by its device and backend.
"""

import importlib.util
import os

import lattn_results as lr

FORMATS = ("png", "svg", "pdf")
FILE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
SEQ_LABEL = "sequence length T (tokens)"

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
    return (record.get("status") == "ok" and lr.number(record.get("seq"))
            and lr.number(record.get("median_ms")) and panel_dim(record) is not None)


def line_label(key, varying):
    values = lr.key_as_dict(key)
    words = [str(values.get("impl", "")), str(values.get("mode", ""))]
    words += [f"{k}={values[k]}" for k in sorted(varying) if k in values and k not in ("impl", "mode")]
    return " ".join(w for w in words if w)


class Figures:
    def __init__(self, files, out_dir, formats):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self.plt = plt
        self.files, self.out_dir, self.formats = files, out_dir, formats
        self.colours = {}
        self.written = []

    def file_legend(self, f):
        return f"[{', '.join(f.backends)}] {f.device_label}"

    def colour(self, name):
        palette = self.plt.get_cmap("tab10").colors
        return self.colours.setdefault(name, palette[len(self.colours) % len(palette)])

    def series(self, suite, value_of):
        """{dim: {(file index, line key): [(seq, value)]}} for one suite; value_of(record) -> float|None."""
        panels = {}
        for file_index, f in enumerate(self.files):
            for record in f.records:
                if record.get("suite") != suite or not plottable(record):
                    continue
                value = value_of(record)
                if value is not None:
                    line = (file_index, lr.case_key(record, _NOT_LINE_KEYS))
                    lines = panels.setdefault(panel_dim(record), {})
                    lines.setdefault(line, []).append((record["seq"], value))
        return panels

    def draw(self, suite, name, panels, ylabel, title, logy=True, unit_line=None):
        if not panels:
            return
        from matplotlib.ticker import NullFormatter, ScalarFormatter
        dims = sorted(panels)
        fig, axes = self.plt.subplots(1, len(dims), figsize=(4.8 * len(dims), 4.2), squeeze=False)
        dim_name = "head dim Dh" if suite == "layer" else "head dim D"
        legend = {}
        for ax, dim in zip(axes[0], dims):
            lines = panels[dim]
            varying = _varying_keys([key for _, key in lines])
            seqs = set()
            for (file_index, key), points in sorted(lines.items(), key=lambda item: str(item[0])):
                points.sort()
                seqs.update(p[0] for p in points)
                style, marker = FILE_STYLES[file_index % len(FILE_STYLES)]
                label = line_label(key, varying)
                colour = self.colour(label)
                if len(self.files) > 1:
                    label += f" - {self.file_legend(self.files[file_index])}"
                (handle,) = ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=style,
                                    marker=marker, color=colour, label=label)
                legend.setdefault(label, handle)
            if unit_line is not None:
                ax.axhline(unit_line, color="grey", linewidth=0.8)
            # Ticks at the measured seqs, written out: 2^11 makes the reader do arithmetic.
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(seqs), [str(int(s)) for s in sorted(seqs)])
            ax.xaxis.set_minor_formatter(NullFormatter())
            if logy:
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(ScalarFormatter())
                ax.yaxis.set_minor_formatter(NullFormatter())
            else:
                ax.set_ylim(bottom=0)
            ax.set_title(f"{dim_name} = {dim}")
            ax.set_xlabel(SEQ_LABEL)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        devices = " vs ".join(dict.fromkeys(self.file_legend(f) for f in self.files))
        fig.suptitle(f"{suite} suite: {title}\n{devices}", fontsize="medium")
        fig.tight_layout()
        fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize="small")
        for fmt in self.formats:
            path = os.path.join(self.out_dir, f"{suite}-{name}.{fmt}")
            fig.savefig(path, format=fmt, bbox_inches="tight")
            self.written.append(path)
        self.plt.close(fig)

    def speedup_panels(self, suite):
        """scan time / chunked time per file, shape and mode, keyed like series()."""
        times = self.series(suite, lambda r: lr.number(r["median_ms"])
                            if r.get("impl") in ("scan", "chunked") else None)
        panels = {}
        for dim, lines in times.items():
            by_impl = {}
            for (file_index, key), points in lines.items():
                values = lr.key_as_dict(key)
                shape = lr.case_key({**values, "impl": None}, _NOT_LINE_KEYS)
                by_impl.setdefault((file_index, shape), {})[values.get("impl")] = dict(points)
            for line, impls in by_impl.items():
                scan, chunked = impls.get("scan", {}), impls.get("chunked", {})
                ratio = [(seq, scan[seq] / chunked[seq]) for seq in sorted(set(scan) & set(chunked))]
                if ratio:
                    panels.setdefault(dim, {})[line] = ratio
        return panels

    def write_all(self):
        suites = sorted({r.get("suite") for f in self.files for r in f.records if plottable(r)}, key=str)
        if not suites:
            raise lr.ResultFileError("nothing to plot: no ok record with seq and median_ms")
        for suite in suites:
            self.draw(suite, "time", self.series(suite, lambda r: lr.number(r["median_ms"])),
                      "time per call (ms, median)", "time per call vs sequence length")
            self.draw(suite, "speedup", self.speedup_panels(suite),
                      "speed-up (scan ms / chunked ms)", "speed-up of chunked over scan",
                      logy=False, unit_line=1.0)
            self.draw(suite, "temp_mb", self.series(suite, lambda r: lr.number(r.get("temp_mb"))),
                      "temp workspace per call (MiB)", "workspace beyond inputs and outputs")
            self.draw(suite, "peak_fraction", self.series(suite, lambda r: lr.number(r.get("peak_fraction"))),
                      "fraction of device peak (peak_fraction)", "fraction of peak", logy=False)
        return self.written


def _varying_keys(keys):
    """Identity keys whose value differs between the lines of one panel: those must be in the label."""
    columns = zip(*keys)
    return {name for name, column in zip(lr.IDENTITY_KEYS, columns) if len(set(column)) > 1}


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

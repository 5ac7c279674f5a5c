"""scripts/plot.py, run as a subprocess on the fixture: it must write real PNG and SVG files."""

import copy
import importlib.util
import os
import sys
import tempfile
import unittest
from unittest import mock

import fixtures as fx

sys.path.insert(0, fx.SCRIPTS)
import lattn_results as lr  # noqa: E402
import plot  # noqa: E402


@unittest.skipUnless(importlib.util.find_spec("matplotlib"), "matplotlib is not installed")
class PlotTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.out_dir = os.path.join(self.tmp.name, "plots")

    def test_writes_png_and_svg(self):
        other = fx.write(self.tmp.name, "slower.json", fx.variant(fx.load_base(), seed=12, scale=1.3))
        proc = fx.run_script("plot.py", fx.BASE_PATH, other, "--out-dir", self.out_dir, "--format", "png,svg")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for name in ("kernel-time", "kernel-speedup", "kernel-temp_mb", "kernel-peak_fraction", "layer-time"):
            for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<svg")):
                path = os.path.join(self.out_dir, f"{name}.{fmt}")
                with self.subTest(path=path):
                    self.assertTrue(os.path.exists(path), proc.stdout)
                    with open(path, "rb") as f:
                        content = f.read()
                    self.assertGreater(len(content), 1000)
                    self.assertIn(magic, content[:2000])
        with open(os.path.join(self.out_dir, "kernel-time.svg"), encoding="utf-8") as f:
            svg = f.read()
        self.assertIn("Fixture CPU", svg)  # the device names the title and legend

    def test_bad_format_is_refused(self):
        proc = fx.run_script("plot.py", fx.BASE_PATH, "--out-dir", self.out_dir, "--format", "gif")
        self.assertEqual(proc.returncode, 2)
        self.assertTrue(proc.stderr.startswith("plot.py: error: "), proc.stderr)


def scaled(doc, factor, key="median_ms"):
    """doc with every time (or, key='temp_mb', every workspace) times factor."""
    out = copy.deepcopy(doc)
    keys = ("median_ms", "q1_ms", "q3_ms") if key == "median_ms" else (key,)
    for record in out["results"]:
        for k in keys:
            if k in record:
                record[k] *= factor
    return out


@unittest.skipUnless(importlib.util.find_spec("matplotlib"), "matplotlib is not installed")
class FigureContentTest(unittest.TestCase):
    """The figures themselves, drawn in this process and kept open: legends, ticks, bars, colours
    and titles."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()

    def figures(self, *docs, names=None):
        """{'kernel-time': Figure, ...} for the given documents, written under the given names."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = names or [f"run-{i}.json" for i in range(len(docs))]
        files = [lr.load(fx.write(self.tmp.name, name, doc)) for name, doc in zip(names, docs)]
        out_dir = os.path.join(self.tmp.name, "plots")
        os.makedirs(out_dir, exist_ok=True)
        plt.close("all")
        with mock.patch("matplotlib.pyplot.close"):
            written = plot.Figures(files, out_dir, ["png"]).write_all()
        figures = [plt.figure(n) for n in plt.get_fignums()]
        self.addCleanup(plt.close, "all")
        self.assertEqual(len(figures), len(written))
        result = {os.path.basename(path)[:-4]: fig for path, fig in zip(written, figures)}
        for fig in result.values():
            fig.canvas.draw()
        return result

    @staticmethod
    def lines(ax):
        """(label, colour) of each drawn series, errorbar or plain line."""
        from matplotlib.colors import to_hex
        found = [(c.get_label(), to_hex(c.lines[0].get_color())) for c in ax.containers if hasattr(c, "lines")]
        found += [(line.get_label(), to_hex(line.get_color())) for line in ax.get_lines()
                  if not line.get_label().startswith("_")]
        return found

    @staticmethod
    def labelled_ticks(ax, axis):
        get, limits = (ax.get_yticklabels, ax.get_ylim()) if axis == "y" else (ax.get_xticklabels, ax.get_xlim())
        low, high = sorted(limits)
        index = 1 if axis == "y" else 0
        return [t.get_text() for t in get() if t.get_text() and low <= t.get_position()[index] <= high]

    def test_two_runs_of_one_machine_each_have_their_legend_entries(self):
        figures = self.figures(self.base_doc, fx.variant(self.base_doc, seed=40, scale=1.1),
                               names=["before.json", "after.json"])
        labels = [t.get_text() for t in figures["kernel-time"].legends[0].get_texts()]
        self.assertEqual(len(labels), 8, labels)  # 2 impls x 2 modes x 2 files
        self.assertEqual(len(set(labels)), 8, labels)
        self.assertEqual(sum("before.json" in label for label in labels), 4, labels)
        self.assertEqual(sum("after.json" in label for label in labels), 4, labels)

    def test_log_axes_have_two_labelled_ticks_and_no_zero(self):
        # Times from 1 us to 60 ms, workspaces all within 2-8 MiB (less than a decade), one seq.
        small = scaled(self.base_doc, 1e-3)
        for record in small["results"]:
            if "temp_mb" in record:
                record["temp_mb"] = 2 + 6 * (record["plan_index"] % 5) / 4
        one_seq = copy.deepcopy(self.base_doc)
        one_seq["results"] = [r for r in one_seq["results"] if r["seq"] == 512]
        # Times over six decades, 1 us to 1 s: a scalar formatter wrote "0, 0, 0, 1, 10, 100".
        wide = copy.deepcopy(self.base_doc)
        for record in wide["results"]:
            for k in ("median_ms", "q1_ms", "q3_ms"):
                if k in record:
                    record[k] *= 10.0 ** (record["plan_index"] % 6 - 3)
        for doc in (small, one_seq, wide):
            for name, fig in self.figures(doc).items():
                for ax in fig.axes:
                    if ax.get_yscale() == "log":
                        ticks = self.labelled_ticks(ax, "y")
                        with self.subTest(figure=name, axis="y", ticks=ticks):
                            self.assertGreaterEqual(len(ticks), 2)
                            self.assertFalse([t for t in ticks if float(t) == 0])
                    ticks = self.labelled_ticks(ax, "x")
                    with self.subTest(figure=name, axis="x", ticks=ticks):
                        self.assertGreaterEqual(len(ticks), 2)

    def test_time_points_carry_q1_q3_bars(self):
        ax = self.figures(self.base_doc)["kernel-time"].axes[0]  # D = 32
        bars = [c for c in ax.containers if getattr(c, "has_yerr", False)]
        self.assertEqual(len(bars), 4)
        record = fx.find(self.base_doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=32))
        segments = [seg for c in bars for collection in c.lines[2] for seg in collection.get_segments()]
        spans = {(round(seg[0][1], 6), round(seg[1][1], 6)) for seg in segments if seg[0][0] == 512}
        self.assertIn((round(record["q1_ms"], 6), round(record["q3_ms"], 6)), spans)

    def test_an_impl_has_one_colour_in_every_figure(self):
        figures = self.figures(self.base_doc, fx.variant(self.base_doc, seed=41), names=["a.json", "b.json"])
        colours = {}
        for name, fig in figures.items():
            for ax in fig.axes:
                for label, colour in self.lines(ax):
                    impl = label.split()[0]
                    if impl in ("scan", "chunked"):
                        colours.setdefault(impl, set()).add(colour)
        self.assertEqual(set(colours), {"scan", "chunked"})
        self.assertEqual([len(c) for c in colours.values()], [1, 1], colours)
        self.assertNotEqual(colours["scan"], colours["chunked"])

    def test_a_figure_of_reference_data_alone_names_no_other_device(self):
        kernel_only = copy.deepcopy(self.base_doc)
        kernel_only["results"] = [r for r in kernel_only["results"] if r["suite"] == "kernel"]
        figures = self.figures(fx.reference_format(self.base_doc), kernel_only, names=["reference.json", "ours.json"])
        layer_title = figures["layer-time"]._suptitle.get_text()
        self.assertIn("JAX 0.4.30", layer_title)
        self.assertNotIn("Fixture CPU", layer_title)
        kernel_title = figures["kernel-time"]._suptitle.get_text()
        self.assertIn("JAX 0.4.30", kernel_title)
        self.assertIn("Fixture CPU", kernel_title)


if __name__ == "__main__":
    unittest.main()

"""scripts/plot.py, run as a subprocess on the fixture: it must write real PNG and SVG files."""

import importlib.util
import os
import tempfile
import unittest

import fixtures as fx


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


if __name__ == "__main__":
    unittest.main()

"""The lattnbench Python package (python/), from the source tree: load() as a DataFrame with the
device and config columns, and compare() giving exactly compare.py's verdicts (the same code)."""

import json
import os
import re
import sys
import tempfile
import unittest

import fixtures as fx

sys.path.insert(0, os.path.join(fx.REPO, "python"))
import lattnbench  # noqa: E402


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()

    def test_load_gives_a_row_per_record_with_device_and_config_columns(self):
        doc = fx.load_real()
        frame = lattnbench.load(fx.REAL_PATH)
        self.assertEqual(len(frame), len(doc["results"]))
        self.assertEqual(list(frame["impl"]), [r["impl"] for r in doc["results"]])
        self.assertTrue((frame["device.cpu_model"] == doc["device"]["cpu_model"]).all())
        self.assertTrue((frame["config.threads"] == doc["config"]["threads"]).all())
        self.assertTrue((frame["file"] == fx.REAL_PATH).all())
        ok = frame[frame["status"] == "ok"]
        self.assertTrue((ok["median_ms"] > 0).all())

    def test_load_reads_the_plugins_of_the_config_block(self):
        doc = json.loads(json.dumps(self.base_doc))
        doc["config"]["plugins"] = [{"path": "/x/libmine.so", "name": "mine", "sha256": "ab" * 32}]
        doc["results"][0]["impl"] = "mine:scan"
        frame = lattnbench.load(fx.write(self.tmp.name, "plugin.json", doc))
        self.assertEqual(frame["impl"][0], "mine:scan")
        self.assertEqual(frame["config.plugins"][0][0]["name"], "mine")

    def test_load_reads_the_reference_format(self):
        path = fx.write(self.tmp.name, "ref.json", fx.reference_format(self.base_doc))
        frame = lattnbench.load(path)
        self.assertIn("temp_mb", frame.columns)  # xla_temp_mb, named as lattnbench names it
        self.assertTrue((frame["device.backend"] == "cpu").all())

    def test_a_bad_file_raises_result_file_error(self):
        path = os.path.join(self.tmp.name, "bad.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write("{not json")
        with self.assertRaises(lattnbench.ResultFileError):
            lattnbench.load(path)

    def test_compare_gives_compare_py_s_verdicts(self):
        planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
        new = fx.write(self.tmp.name, "slow.json", fx.variant(self.base_doc, seed=1, scale=1.2, only=planted))
        frame = lattnbench.compare(fx.BASE_PATH, new)
        out = os.path.join(self.tmp.name, "comparison.json")
        proc = fx.run_script("compare.py", fx.BASE_PATH, new, "--json", out)
        with open(out, encoding="utf-8") as f:
            script = json.load(f)
        self.assertEqual(frame.attrs["exit_status"], proc.returncode)
        self.assertEqual(frame.attrs["exit_status"], 1)
        self.assertEqual(frame.attrs["summary"], script["summary"])
        self.assertEqual(list(frame["verdict"]), [c["verdict"] for c in script["cases"]])
        self.assertEqual(list(frame["label"]), [c["label"] for c in script["cases"]])
        slow = frame[(frame["case.impl"] == "chunked") & (frame["case.mode"] == "fwd") & (frame["case.seq"] == 2048)
                     & (frame["case.dim"] == 32)]
        self.assertEqual(list(slow["verdict"]), ["SLOWER"])
        self.assertAlmostEqual(float(slow["change_pct"].iloc[0]), 20, delta=3)

    def test_compare_takes_compare_py_s_options(self):
        new = fx.write(self.tmp.name, "fast.json", fx.variant(self.base_doc, seed=2, scale=0.7))
        frame = lattnbench.compare(fx.BASE_PATH, new, threshold="50%", metric="min_ms")
        self.assertNotIn("FASTER", set(frame["verdict"]))  # 30% is inside a 50% threshold
        self.assertIn("min_ms", frame.attrs["summary"])

    def test_version_matches_the_project_and_the_package_metadata(self):
        with open(os.path.join(fx.REPO, "CMakeLists.txt"), encoding="utf-8") as f:
            cmake = re.search(r"project\(lattnbench VERSION ([0-9.]+)", f.read()).group(1)
        with open(os.path.join(fx.REPO, "python", "pyproject.toml"), encoding="utf-8") as f:
            pyproject = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
        self.assertEqual(lattnbench.__version__, cmake)
        self.assertEqual(lattnbench.__version__, pyproject)

    def test_the_namespace_holds_the_api_only(self):
        self.assertEqual(set(lattnbench.__all__), {"load", "compare", "ResultFileError", "__version__"})
        public = {name for name in dir(lattnbench) if not name.startswith("_")}
        self.assertEqual(public, set(lattnbench.__all__) - {"__version__"})
        for leaked in ("json", "os", "pd", "lattn_results"):
            self.assertNotIn(leaked, dir(lattnbench))

    def test_docs_list_every_column_load_gives(self):
        with open(os.path.join(fx.REPO, "docs", "python.md"), encoding="utf-8") as f:
            documented = set(re.findall(r"`([a-z_0-9.<>]+)`", f.read()))
        for path in (fx.REAL_PATH, fx.BASE_PATH):
            columns = lattnbench.load(path).columns
            for column in columns:
                prefix = column.split(".")[0]
                if prefix in ("device", "config"):
                    self.assertIn(f"{prefix}.<key>", documented)
                else:
                    self.assertIn(column, documented, f"load()'s column {column} is not in docs/python.md")


if __name__ == "__main__":
    unittest.main()

"""scripts/perf_table.py, run as a subprocess on every kind of file it may be handed: a table, or one
line on stderr and exit status 2, never a traceback."""

import copy
import os
import tempfile
import unittest

import fixtures as fx


class PerfTableTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()

    def write(self, name, doc):
        return fx.write(self.tmp.name, name, doc)

    def table(self, *args):
        """The table's data rows, each a list of cells, after checking a clean exit."""
        proc = fx.run_script("perf_table.py", *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        self.assertNotIn("None", proc.stdout)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
        self.assertTrue(lines[0].startswith("| suite | impl | mode | seq | D | median_ms |"), lines[0])
        return proc.stdout, [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]

    def assert_refused(self, *args, mentions):
        proc = fx.run_script("perf_table.py", *args)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("perf_table.py: error: "), lines[0])
        self.assertIn(mentions, lines[0])
        self.assertNotIn("Traceback", proc.stderr)
        self.assertEqual(proc.stdout, "")

    def test_a_lattnbench_run_with_one_thread_run_and_reference(self):
        one = self.write("one.json", fx.variant(self.base_doc, seed=50, scale=2.0))
        ref = self.write("ref.json", fx.reference_format(fx.variant(self.base_doc, seed=51, scale=3.0)))
        text, rows = self.table(fx.BASE_PATH, "--threads1", one, "--reference", ref)
        self.assertIn("lattnbench 0.1.0, schema 1.0.0", text.splitlines()[0])
        self.assertEqual(len(rows), 19)
        ok = [r for r in rows if r[5] not in ("skipped", "failed")]
        self.assertEqual(len(ok), 18)
        for r in ok:
            self.assertAlmostEqual(float(r[10]), 2.0, delta=0.1)                 # t1/t2
            self.assertAlmostEqual(float(r[11]) / float(r[5]), 3.0, delta=0.15)  # ref_ms / median_ms
        skipped = next(r for r in rows if r[5] == "skipped")
        self.assertEqual(skipped[:5], ["kernel", "scan", "fwd_bwd", "8192", "64"])
        # Layer rows show the head dim, and find their reference although its `dim` means that.
        layer = [r for r in rows if r[0] == "layer"]
        self.assertEqual([r[4] for r in layer], ["64", "64"])
        self.assertTrue(all(r[11] for r in layer))

    def test_rules_and_decays_get_a_column_saying_which_row_is_which(self):
        doc = copy.deepcopy(self.base_doc)
        kernel = [r for r in doc["results"] if r.get("suite") == "kernel" and r.get("status") == "ok"]
        twin = copy.deepcopy(kernel[0])
        twin.update(rule="delta", decay="scalar", gate_norm=16.0, normalize_keys=True, median_ms=7.0)
        doc["results"].append(twin)
        proc = fx.run_script("perf_table.py", self.write("mixed.json", doc))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
        self.assertTrue(lines[0].startswith("| suite | impl | mode | seq | D | variant | median_ms |"), lines[0])
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
        self.assertEqual(len(rows), len(doc["results"]))
        delta = [r for r in rows if r[5] == "delta scalar"]
        self.assertEqual(len(delta), 1)
        self.assertEqual(delta[0][:5], [str(kernel[0][k]) for k in ("suite", "impl", "mode", "seq", "dim")])
        self.assertEqual(delta[0][6], "7.000")
        # A plain run has no such column (the other tests read it).
        self.assertTrue(all(r[5] != "delta scalar" for r in self.table(fx.BASE_PATH)[1]))

    def test_the_reference_file_as_the_run(self):
        ref = self.write("ref.json", fx.reference_format(self.base_doc))
        text, rows = self.table(ref)
        self.assertIn("reference (JAX)", text.splitlines()[0])
        self.assertEqual(len(rows), 18)
        record = fx.find(self.base_doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=32))
        row = next(r for r in rows if r[:5] == ["kernel", "scan", "fwd", "512", "32"])
        self.assertEqual(row[5], f"{record['median_ms']:.3f}")
        self.assertEqual(row[8], f"{record['temp_mb']:.3f}")  # xla_temp_mb, read as temp_mb

    @unittest.skipUnless(os.path.exists(fx.REFERENCE_PATH), "no ../shared/reference-results.json")
    def test_the_real_reference_file(self):
        _, rows = self.table(fx.REFERENCE_PATH)
        self.assertGreater(len(rows), 0)
        _, rows = self.table(fx.BASE_PATH, "--reference", fx.REFERENCE_PATH)
        self.assertTrue(any(r[11] for r in rows))

    def test_a_file_without_some_keys(self):
        doc = copy.deepcopy(self.base_doc)
        del doc["device"]
        for record in doc["results"][:4]:
            for k in ("gflops", "peak_fraction", "temp_mb", "rel_err", "tolerance"):
                record.pop(k, None)
        del doc["results"][5]["status"]
        text, rows = self.table(self.write("partial.json", doc))
        self.assertEqual(len(rows), 19)
        self.assertEqual(sum(r[6] == "-" and r[7] == "-" and r[8] == "-" and r[9] == "-" for r in rows), 4)
        self.assertIn("unknown CPU", text.splitlines()[0])

    def test_a_missing_file(self):
        self.assert_refused(os.path.join(self.tmp.name, "absent.json"), mentions="cannot read")
        self.assert_refused(fx.BASE_PATH, "--threads1", os.path.join(self.tmp.name, "absent.json"),
                            mentions="cannot read")

    def test_not_json(self):
        path = os.path.join(self.tmp.name, "broken.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"results": [')
        self.assert_refused(path, mentions="not JSON")

    def test_a_google_benchmark_export(self):
        export = {"context": {"date": "2024-06-01T12:00:00Z", "library_build_type": "release"},
                  "benchmarks": [{"name": "kernel/scan/fwd/B:2/H:4/T:512/D:32", "real_time": 1.1,
                                  "time_unit": "ms", "run_type": "iteration"}]}
        path = self.write("gbench.json", export)
        self.assert_refused(path, mentions="Google Benchmark export")
        self.assert_refused(fx.BASE_PATH, "--reference", path, mentions="Google Benchmark export")

    def test_a_bad_option(self):
        self.assert_refused(fx.BASE_PATH, "--nope", mentions="unrecognized arguments")

    def test_a_case_twice(self):
        doc = copy.deepcopy(self.base_doc)
        doc["results"].append(doc["results"][0])
        self.assert_refused(fx.BASE_PATH, "--threads1", self.write("twice.json", doc), mentions="appears twice")


if __name__ == "__main__":
    unittest.main()

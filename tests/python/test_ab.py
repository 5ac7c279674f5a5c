"""scripts/ab.py, run as a subprocess against stand-in binaries that write the fixture result file
with their own speed: the alternation, the medians over rounds, the speed-ups and bad input."""

import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

import fixtures as fx

# A stand-in for lattnbench: writes the fixture file to --out with every timing scaled by SCALE
# (times ROUND_SCALES[round] if given, the round counted from the log), after logging its name.
FAKE = textwrap.dedent("""\
    #!{python}
    import json, sys
    args = sys.argv[1:]
    with open({log!r}, "a") as log:
        log.write({name!r} + "\\n")
    with open({log!r}) as log:
        calls = sum(1 for line in log if line.strip() == {name!r})
    if {exit_status} != 0:
        print("lattnbench: error: planted failure", file=sys.stderr)
        sys.exit({exit_status})
    doc = json.load(open({base!r}))
    scale = {scale} * {round_scales}[(calls - 1) % len({round_scales})]
    for r in doc["results"]:
        if "median_ms" in r:
            r["median_ms"] *= scale
    json.dump(doc, open(args[args.index("--out") + 1], "w"))
    """)


class AbTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.log = os.path.join(self.tmp.name, "calls.log")
        self.base_doc = fx.load_base()

    def fake(self, name, scale=1.0, round_scales=(1.0,), exit_status=0):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(FAKE.format(python=sys.executable, log=self.log, name=name, base=fx.BASE_PATH, scale=scale,
                                round_scales=list(round_scales), exit_status=exit_status))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def run_ab(self, *args):
        out = os.path.join(self.tmp.name, "ab.json")
        if os.path.exists(out):
            os.remove(out)
        proc = fx.run_script("ab.py", "--json", out, *args)
        doc = None
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        return proc, doc

    def ok_cases(self):
        return [r for r in self.base_doc["results"] if r.get("status") == "ok"]

    def test_binaries_alternate_round_by_round(self):
        a, b = self.fake("old"), self.fake("new")
        proc, _ = self.run_ab("--rounds", "3", a, b, "--", "--suite", "kernel")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.log, encoding="utf-8") as f:
            self.assertEqual(f.read().split(), ["old", "new"] * 3)

    def test_speedup_is_the_first_binarys_time_over_each_others(self):
        a, b, c = self.fake("old"), self.fake("twice", scale=0.5), self.fake("slower", scale=1.25)
        proc, doc = self.run_ab("--rounds", "2", a, b, c, "--")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(len(doc["cases"]), len(self.ok_cases()))  # the skipped case is left out
        for case in doc["cases"]:
            self.assertAlmostEqual(case["speedup"]["old"], 1.0)
            self.assertAlmostEqual(case["speedup"]["twice"], 2.0)
            self.assertAlmostEqual(case["speedup"]["slower"], 0.8)
            self.assertEqual(len(case["rounds_ms"]["twice"]), 2)
        self.assertAlmostEqual(doc["geomean_speedup"]["twice"], 2.0)
        self.assertIn("geometric mean", proc.stdout)
        self.assertIn("2.000x", proc.stdout)

    def test_the_median_over_rounds_drops_a_round_lost_to_a_busy_stretch(self):
        # The new binary's second of three rounds ran 3x slow: the median keeps the other two.
        a = self.fake("old")
        b = self.fake("new", scale=0.8, round_scales=(1.0, 3.0, 1.0))
        proc, doc = self.run_ab("--rounds", "3", a, b, "--")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        record = self.ok_cases()[0]
        case = next(c for c in doc["cases"] if c["case"]["impl"] == record["impl"] and c["case"]["mode"] ==
                    record["mode"] and c["case"]["seq"] == record["seq"] and c["case"]["dim"] == record["dim"]
                    and c["case"]["suite"] == record["suite"])
        self.assertAlmostEqual(case["median_ms"]["new"], 0.8 * record["median_ms"])
        self.assertAlmostEqual(case["speedup"]["new"], 1.25)

    def test_a_failing_binary_is_one_line_naming_it_and_exit_2(self):
        a, b = self.fake("old"), self.fake("broken", exit_status=3)
        proc, doc = self.run_ab("--rounds", "2", a, b, "--")
        self.assertEqual(proc.returncode, 2)
        self.assertIsNone(doc)
        lines = proc.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertIn("broken exited with status 3: lattnbench: error: planted failure", lines[0])

    def test_bad_options_exit_2(self):
        a, b = self.fake("old"), self.fake("new")
        for args, message in [(("--rounds", "0", a, b, "--"), "--rounds must be at least 1"),
                              ((a, b), "no '--'"),
                              ((a, "--"), "at least two binaries"),
                              ((a, b, "--", "--out", "x.json"), "--out is ab.py's to set"),
                              ((a, os.path.join(self.tmp.name, "missing"), "--"), "cannot run")]:
            proc, _ = self.run_ab(*args)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn(message, proc.stderr, args)
            self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)

    def test_a_binary_word_carries_its_own_arguments(self):
        # One stand-in run with --threads 1 and 2, as a build's scaling is measured: each word is
        # split as a shell would, its arguments go before the shared ones, and it names its column.
        a = self.fake("same")
        args_log = os.path.join(self.tmp.name, "args.log")
        wrapper = os.path.join(self.tmp.name, "wrapper")
        with open(wrapper, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\necho \"$@\" >> {args_log}\nexec {a} \"$@\"\n")
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
        proc, doc = self.run_ab("--rounds", "1", f"{wrapper} --threads 1", f"{wrapper} --threads '2'", "--",
                                "--suite", "kernel")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(sorted(doc["geomean_speedup"]), ["wrapper --threads 1", "wrapper --threads 2"])
        with open(args_log, encoding="utf-8") as f:
            calls = [line.split()[:5] for line in f]
        self.assertEqual(calls, [["--threads", "1", "-q", "--suite", "kernel"], ["--threads", "2", "-q", "--suite", "kernel"]])
        for args, message in [((f"{wrapper} --out x.json", a, "--"), "--out is ab.py's to set"),
                              ((f"{wrapper} 'unclosed", a, "--"), "cannot split"),
                              (("  ", a, "--"), "an empty binary argument")]:
            proc, _ = self.run_ab(*args)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn(message, proc.stderr, args)

    def test_each_speedup_carries_the_iqr_of_its_per_round_ratios(self):
        # One binary against itself, the second's rounds at 1, 1.25, 0.8 and 1 times the first's
        # speed: the medians agree (1.000x) but the per-round ratios spread 0.95-1.0625.
        a = self.fake("old")
        b = self.fake("new", round_scales=(1.0, 1.25, 0.8, 1.0))
        proc, doc = self.run_ab("--rounds", "4", a, b, "--")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for case in doc["cases"]:
            self.assertAlmostEqual(case["speedup"]["new"], 1.0)
            self.assertEqual(len(case["rounds_speedup"]["new"]), 4)
            q1, q3 = case["speedup_iqr"]["new"]
            self.assertAlmostEqual(q1, 0.95)
            self.assertAlmostEqual(q3, 1.0625)
        self.assertEqual(len(doc["rounds_geomean_speedup"]["new"]), 4)
        q1, q3 = doc["geomean_speedup_iqr"]["new"]
        self.assertAlmostEqual(q1, 0.95)
        self.assertAlmostEqual(q3, 1.0625)
        geomean_row = next(line for line in proc.stdout.splitlines() if line.startswith("geometric mean"))
        self.assertIn("1.000x (0.950-1.062)", geomean_row)
        self.assertIn("IQR", proc.stdout.splitlines()[1])

    def test_rows_are_in_shape_order_not_run_order(self):
        a, b = self.fake("old"), self.fake("new")
        proc, doc = self.run_ab("--rounds", "1", a, b, "--")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        def shape(r):  # a layer case's identity holds head_dim, not dim
            return r["suite"], r["mode"], r.get("head_dim") or r["dim"], r["seq"], r["impl"]
        self.assertEqual([shape(c["case"]) for c in doc["cases"]], sorted(shape(r) for r in self.ok_cases()))
        # Scan and chunked of one shape sit together, seq rising down a series: the printed rows too.
        rows = [line.split()[:6] for line in proc.stdout.splitlines()[2:4]]
        self.assertEqual([r[1] for r in rows], ["chunked", "scan"])
        self.assertEqual(rows[0][2:], rows[1][2:])

    def test_one_binary_twice_is_an_a_a_run(self):
        a = self.fake("same")
        proc, doc = self.run_ab("--rounds", "2", a, a, "--")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(sorted(doc["geomean_speedup"]), [f"1:{a}", f"2:{a}"])
        self.assertAlmostEqual(doc["geomean_speedup"][f"2:{a}"], 1.0)


if __name__ == "__main__":
    unittest.main()

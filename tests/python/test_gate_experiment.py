"""scripts/gate_experiment.py, run as a subprocess against a stand-in lattnbench that writes the
fixture result file with fresh samples each run, slowed by its --slowdown: the runs it makes, the
A/A and planted counts of its table, its JSON and bad input."""

import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

import fixtures as fx

# Writes the fixture to --out with fresh 1% noise (a new seed per call, counted in the log) and
# the samples of every case (of the first alone with ONE_CASE) times 1 + --slowdown/100, after
# logging its arguments.
FAKE = textwrap.dedent("""\
    #!{python}
    import json, sys
    sys.path.insert(0, {tests!r})
    import fixtures as fx
    args = sys.argv[1:]
    with open({log!r}, "a") as log:
        log.write(json.dumps(args) + "\\n")
    with open({log!r}) as log:
        calls = sum(1 for _ in log)
    slowdown = float(args[args.index("--slowdown") + 1]) if "--slowdown" in args else 0.0
    only = (lambda r: r.get("plan_index") == 0) if {one_case} else None
    doc = fx.variant(fx.load_base(), seed=calls, scale=1 + slowdown / 100, noise=0.01, only=only)
    json.dump(doc, open(args[args.index("--out") + 1], "w"))
    """)


class GateExperimentTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.log = os.path.join(self.tmp.name, "calls.log")
        self.fake = self.make_fake("lattnbench")

    def make_fake(self, name, one_case=False):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(FAKE.format(python=sys.executable, tests=os.path.dirname(fx.HERE), log=self.log, one_case=one_case))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def calls(self):
        with open(self.log, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def test_pairs_and_planted_tries_are_counted_in_the_table_and_the_json(self):
        out = os.path.join(self.tmp.name, "gate.json")
        proc = fx.run_script("gate_experiment.py", "--pairs", "2", "--tries", "1", "--slowdowns", "20,40",
                             "--json", out, self.fake, "--", "--suite", "kernel")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        calls = self.calls()
        self.assertEqual(len(calls), 8)  # two runs a pair: 2 A/A, then one try of each slowdown
        slowdowns = [c[c.index("--slowdown") + 1] if "--slowdown" in c else None for c in calls]
        self.assertEqual(slowdowns, [None, None, None, None, None, "20", None, "40"])
        for c in calls:
            self.assertEqual(c[:2], ["--suite", "kernel"])
            self.assertIn("-q", c)
        lines = proc.stdout.splitlines()
        # 18 timed cases a pair (the fixture's skipped case has no verdict): noise of 1% is SAME.
        self.assertIn("| 2 | 0 of 2 | 0 of 2 | 0 of 36 | 0 of 36 | 0 of 36 |", proc.stdout)
        self.assertTrue(any(line.startswith("| 20% | 1 | 1 of 1 | 1 of 1 | 1 of 1 | 1.2") for line in lines), proc.stdout)
        self.assertTrue(any(line.startswith("| 40% | 1 | 1 of 1 | 1 of 1 | 1 of 1 | 1.4") for line in lines), proc.stdout)
        self.assertIn("threshold 10%", proc.stdout)
        self.assertEqual(len(proc.stderr.splitlines()), 4)  # a line per pair
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
        self.assertEqual([p["slowdown_pct"] for p in doc["pairs"]], [0, 0, 20, 40])
        self.assertEqual(doc["pairs"][2]["counts"]["SLOWER"], 18)

    def test_a_try_failed_by_one_slower_case_is_not_caught(self):
        proc = fx.run_script("gate_experiment.py", "--pairs", "0", "--tries", "1", "--slowdowns", "40",
                             self.make_fake("one-case", one_case=True), "--", "--suite", "kernel")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("| 40% | 1 | 0 of 1 | 0 of 1 | 1 of 1 |", proc.stdout)
        self.assertNotIn("A/A", proc.stdout)

    def test_the_default_lattnbench_arguments_are_the_a_a_experiments(self):
        proc = fx.run_script("gate_experiment.py", "--pairs", "1", "--tries", "0", self.fake)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.calls()[0][:8], ["--suite", "kernel", "--seq", "512,2048", "--dim", "32,64", "--reps", "5"])
        self.assertNotIn("planted", proc.stdout)

    def test_bad_input_is_one_line_and_exit_2(self):
        failing = os.path.join(self.tmp.name, "failing")
        with open(failing, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho 'lattnbench: error: planted failure' >&2\nexit 2\n")
        os.chmod(failing, 0o755)
        for args, message in [(["--pairs", "-1", self.fake], "--pairs must be at least 0"),
                              (["--slowdowns", "5,x", self.fake], "'x' is not a percentage"),
                              (["--threshold", "ten", self.fake], "--threshold"),
                              (["--pairs", "0", "--tries", "0", self.fake], "nothing to run"),
                              ([self.fake, "--", "--slowdown", "3"], "--slowdown is gate_experiment.py's to set"),
                              ([failing], "planted failure"),
                              ([os.path.join(self.tmp.name, "missing")], "cannot run")]:
            with self.subTest(args=args):
                proc = fx.run_script("gate_experiment.py", *args)
                self.assertEqual(proc.returncode, 2)
                self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
                self.assertIn(message, proc.stderr)
                self.assertTrue(proc.stderr.startswith("gate_experiment.py: error: "))


if __name__ == "__main__":
    unittest.main()

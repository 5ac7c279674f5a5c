"""scripts/compare.py, run as a subprocess on fixture files: verdicts, exit statuses, outputs."""

import copy
import json
import os
import tempfile
import unittest

import numpy as np

import fixtures as fx


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()
        self.base = fx.BASE_PATH

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def write(self, name, doc):
        return fx.write(self.tmp.name, name, doc)

    def compare(self, base, new, *options):
        """(process, comparison JSON or None)."""
        out = self.path("comparison.json")
        if os.path.exists(out):
            os.remove(out)
        proc = fx.run_script("compare.py", base, new, "--json", out, *options)
        doc = None
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        return proc, doc

    def verdicts(self, doc):
        return {c["label"]: c["verdict"] for c in doc["cases"]}

    def case(self, doc, predicate):
        record = fx.find(self.base_doc, predicate)
        shape = ("suite", "impl", "mode", "seq", "dim")
        return next(c for c in doc["cases"] if all(c["case"].get(k) == record[k] for k in shape))

    def test_planted_slowdown_is_slower_and_exits_1(self):
        planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
        new = self.write("slow.json", fx.variant(self.base_doc, seed=1, scale=1.2, only=planted))
        proc, doc = self.compare(self.base, new)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        slow = self.case(doc, planted)
        self.assertEqual(slow["verdict"], "SLOWER")
        self.assertEqual(slow["interval_kind"], "CI")
        self.assertTrue(slow["test"].startswith("95% CI +"), slow["test"])
        low, high = slow["interval_pct"]
        self.assertTrue(5 < low < slow["change_pct"] < high, slow)
        self.assertAlmostEqual(slow["change_pct"], 20, delta=3)
        others = [c["verdict"] for c in doc["cases"] if c is not slow]
        self.assertTrue(set(others) <= {"SAME", "SKIPPED"}, others)
        self.assertIn("SLOWER", proc.stdout)
        self.assertIn("REGRESSION", proc.stdout)

    def test_a_change_of_bwd_states_is_noted_beside_the_verdict(self):
        case = fx.is_case(impl="chunked", mode="fwd_bwd", seq=2048, dim=32)
        base_doc = json.loads(json.dumps(self.base_doc))
        fx.find(base_doc, case)["bwd_states"] = "recomputed"
        base = self.write("base-recomputed.json", base_doc)
        new_doc = json.loads(json.dumps(self.base_doc))
        fx.find(new_doc, case)["bwd_states"] = "kept"
        new = self.write("new-kept.json", new_doc)
        proc, doc = self.compare(base, new)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(self.case(doc, case)["note"], "bwd_states recomputed -> kept")
        self.assertIn("bwd_states recomputed -> kept", proc.stdout)
        self.assertEqual([c for c in doc["cases"] if c["note"].startswith("bwd_states")], [self.case(doc, case)])

    def test_a_case_cut_short_by_an_interrupt_is_unsure_not_slower(self):
        planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
        new_doc = fx.variant(self.base_doc, seed=1, scale=1.5, only=planted)
        fx.find(new_doc, planted)["stopped_on"] = "interrupted"
        proc, doc = self.compare(self.base, self.write("partial.json", new_doc))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        partial = self.case(doc, planted)
        self.assertEqual(partial["verdict"], "UNSURE")
        self.assertEqual(partial["note"], "new partial (interrupted)")
        proc, doc = self.compare(self.base, self.write("partial.json", new_doc), "--strict")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)

    def test_noise_within_threshold_is_same_and_exits_0(self):
        # SAME needs the whole interval inside the threshold: 15 samples a side pin a 2% change down.
        base = self.write("base15.json", fx.variant(self.base_doc, seed=20, noise=0.01, samples=15))
        new = self.write("noise.json", fx.variant(self.base_doc, seed=2, scale=1.02, noise=0.01, samples=15))
        proc, doc = self.compare(base, new)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(set(self.verdicts(doc).values()), {"SAME", "SKIPPED"})
        self.assertAlmostEqual(doc["geomean_ratio"], 1.02, delta=0.01)

    def test_speedup_is_faster_and_exits_0(self):
        new = self.write("fast.json", fx.variant(self.base_doc, seed=3, scale=0.8))
        proc, doc = self.compare(self.base, new)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(set(self.verdicts(doc).values()), {"FASTER", "SKIPPED"})
        self.assertAlmostEqual(doc["geomean_ratio"], 0.8, delta=0.02)
        self.assertEqual(doc["matched"], 18)

    def test_many_slowdowns_exit_1_not_a_count(self):
        new = self.write("all-slow.json", fx.variant(self.base_doc, seed=4, scale=1.5))
        proc, doc = self.compare(self.base, new)
        self.assertEqual(doc["counts"]["SLOWER"], 18)
        self.assertEqual(proc.returncode, 1)

    def test_failed_status_in_new_exits_1(self):
        doc = fx.variant(self.base_doc, seed=5)
        fx.find(doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=64))["status"] = "failed"
        proc, result = self.compare(self.base, self.write("failed.json", doc))
        self.assertEqual(proc.returncode, 1)
        failed = self.case(result, fx.is_case(impl="scan", mode="fwd", seq=512, dim=64))
        self.assertEqual(failed["verdict"], "FAILED")
        self.assertEqual(failed["note"], "status failed")

    def test_rel_err_over_tolerance_in_new_exits_1(self):
        doc = fx.variant(self.base_doc, seed=6)
        fx.find(doc, fx.is_case(mode="fwd_bwd", seq=2048, dim=64))["rel_err"] = 0.5
        proc, result = self.compare(self.base, self.write("bad-err.json", doc))
        self.assertEqual(proc.returncode, 1)
        failed = self.case(result, fx.is_case(mode="fwd_bwd", seq=2048, dim=64))
        self.assertEqual(failed["verdict"], "FAILED")
        self.assertIn("rel_err", failed["note"])

    def test_without_samples_the_quartile_ranges_decide(self):
        planted = fx.is_case(impl="scan", mode="fwd_bwd", seq=2048, dim=32)
        new_doc = fx.variant(self.base_doc, seed=7, scale=1.2, only=planted)
        for doc in (self.base_doc, new_doc):
            for record in doc["results"]:
                record.pop("samples_ms", None)
        proc, result = self.compare(self.write("base.json", self.base_doc), self.write("new.json", new_doc))
        self.assertEqual(proc.returncode, 1)
        slow = self.case(result, planted)
        self.assertEqual((slow["verdict"], slow["interval_kind"]), ("SLOWER", "IQR"))
        self.assertTrue(slow["test"].startswith("IQR +"), slow["test"])

    def changed(self, remove=False, add=False):
        doc = fx.variant(self.base_doc, seed=8)
        if remove:
            doc["results"].remove(fx.find(doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=32)))
        if add:
            doc["results"].append(dict(fx.find(doc, fx.is_case(impl="chunked", mode="fwd", seq=512, dim=32)), chunk=64))
        return self.write("changed.json", doc)

    def test_the_files_identity_keys_tell_cases_apart(self):
        # Two records that differ only in a key the tool's list does not hold: with the file's
        # identity_keys naming it they are two cases (a slowdown planted in one is found in that one);
        # without it they are one case recorded twice, which compare.py refuses.
        def with_widgets(doc):
            doc = copy.deepcopy(doc)
            planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
            original = fx.find(doc, planted)
            twin = copy.deepcopy(original)
            original["widgets"], twin["widgets"] = 1, 2
            doc["results"].append(twin)
            doc["identity_keys"] = ["suite", "impl", "mode", "widgets"]
            return doc
        base = with_widgets(self.base_doc)
        slow = copy.deepcopy(base)
        twin = slow["results"][-1]
        twin["samples_ms"] = [t * 1.3 for t in twin["samples_ms"]]
        for key in ("median_ms", "q1_ms", "q3_ms"):
            twin[key] *= 1.3
        proc, doc = self.compare(self.write("w-base.json", base), self.write("w-slow.json", slow))
        self.assertEqual(proc.returncode, 1, proc.stderr)
        verdicts = self.verdicts(doc)
        slower = [label for label, verdict in verdicts.items() if verdict == "SLOWER"]
        self.assertEqual(len(slower), 1, verdicts)
        self.assertIn("widgets=2", slower[0])
        self.assertEqual(verdicts[slower[0].replace("widgets=2", "widgets=1")], "SAME")
        del base["identity_keys"]
        proc, _ = self.compare(self.write("w-plain.json", base), self.write("w-plain2.json", base))
        self.assertEqual(proc.returncode, 2, proc.stderr)

    def test_gone_cases_fail_the_gate_unless_allowed(self):
        proc, result = self.compare(self.base, self.changed(remove=True))
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertEqual((result["counts"]["GONE"], result["counts"]["NEW"]), (1, 0))
        self.assertEqual(result["exit_status"], 1)
        self.assertIn("CASES GONE (not allowed without --allow-gone)", proc.stdout.splitlines()[-1])
        proc, result = self.compare(self.base, self.changed(remove=True), "--allow-gone")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertTrue(result["allow_gone"])
        # --allow-new does not let a GONE case through.
        proc, _ = self.compare(self.base, self.changed(remove=True), "--allow-new")
        self.assertEqual(proc.returncode, 1, proc.stdout)

    def test_new_cases_fail_the_gate_unless_allowed(self):
        proc, result = self.compare(self.base, self.changed(add=True))
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertEqual((result["counts"]["GONE"], result["counts"]["NEW"]), (0, 1))
        proc, _ = self.compare(self.base, self.changed(add=True), "--allow-gone")
        self.assertEqual(proc.returncode, 1, proc.stdout)
        proc, _ = self.compare(self.base, self.changed(add=True), "--allow-new")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        proc, result = self.compare(self.base, self.changed(remove=True, add=True), "--allow-gone", "--allow-new")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertEqual((result["counts"]["GONE"], result["counts"]["NEW"]), (1, 1))

    def test_allowing_gone_and_new_does_not_pass_a_slowdown(self):
        planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
        doc = fx.variant(self.base_doc, seed=1, scale=1.2, only=planted)
        doc["results"].remove(fx.find(doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=32)))
        proc, result = self.compare(self.base, self.write("slow.json", doc), "--allow-gone", "--allow-new")
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertEqual(result["counts"]["SLOWER"], 1)

    def test_fastest_impl_and_crossover_are_reported(self):
        proc, result = self.compare(self.base, self.write("same.json", fx.variant(self.base_doc, seed=9)))
        self.assertIn("Fastest impl in NEW", proc.stdout)
        self.assertIn("chunked is", proc.stdout)
        # The fixture's scan beats chunked at T=512, D=32 fwd and loses at T=2048.
        crossings = [c for c in result["crossovers"] if c["changes"]]
        self.assertEqual(len(crossings), 1, result["crossovers"])
        self.assertEqual(crossings[0]["changes"][0],
                         {"from": "scan", "to": "chunked", "last_seq_before": 512, "crossover_seq": 2048})
        self.assertIn("crossover kernel fwd", proc.stdout)
        winner = next(w for w in result["winners"] if w["shape"].startswith("kernel fwd_bwd"))
        self.assertEqual(winner["winner"], "chunked")
        self.assertIsNotNone(winner["winner_temp_mb"])

    def test_markdown_table(self):
        md = self.path("comment.md")
        new = self.write("slow.json", fx.variant(self.base_doc, seed=10, scale=1.2))
        proc = fx.run_script("compare.py", self.base, new, "--md", md)
        self.assertEqual(proc.returncode, 1)
        with open(md, encoding="utf-8") as f:
            lines = f.read().splitlines()
        self.assertIn("REGRESSION", lines[0])
        table = [line for line in lines if line.startswith("|")]
        self.assertTrue(table[0].startswith("| case |"), table[0])
        self.assertIn("temp_mb", table[0])
        self.assertTrue(set(table[1]) <= set("|-:"))
        self.assertIn("**SLOWER**", "\n".join(table))
        self.assertTrue(table[-1].startswith("| geomean"), table[-1])

    def test_threshold_is_respected(self):
        planted = fx.is_case(impl="chunked", mode="fwd", seq=512, dim=64)
        new = self.write("slow.json", fx.variant(self.base_doc, seed=11, scale=1.2, only=planted))
        proc, _ = self.compare(self.base, new, "--threshold", "25%")
        self.assertEqual(proc.returncode, 0, proc.stdout)

    @unittest.skipUnless(os.path.exists(fx.REFERENCE_PATH), "no ../shared/reference-results.json")
    def test_reference_file_against_lattnbench_file(self):
        proc, doc = self.compare(fx.REFERENCE_PATH, self.base, "--ignore-device")
        self.assertIn(proc.returncode, (0, 1), proc.stderr)
        self.assertGreater(doc["matched"], 0)
        self.assertIn("reference-format", doc["backend_ignored_because"])
        self.assertIn("backend ignored", proc.stdout)
        header = next(line for line in proc.stdout.splitlines() if line.startswith("case "))
        self.assertIn("base temp_mb", header)
        self.assertIn("new temp_mb", header)
        matched = [c for c in doc["cases"] if c["base"] is not None and c["new"] is not None]
        self.assertTrue(all(c["base_temp_mb"] is not None and c["new_temp_mb"] is not None for c in matched))
        # Layer cases match although the reference's `dim` is the head dimension.
        self.assertTrue(any(c["case"]["suite"] == "layer" for c in matched))

    @unittest.skipUnless(os.path.exists(fx.REFERENCE_PATH), "no ../shared/reference-results.json")
    def test_reference_file_device_differs_without_flag(self):
        proc, _ = self.compare(fx.REFERENCE_PATH, self.base)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("devices differ", proc.stderr)


class NoiseTest(unittest.TestCase):
    """Verdicts stay within what the samples can say: SLOWER and FASTER need the whole confidence
    interval past the threshold; too few samples give UNSURE, never SAME."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()

    def write(self, name, doc):
        return fx.write(self.tmp.name, name, doc)

    def compare(self, base_doc, new_doc, *options):
        out = os.path.join(self.tmp.name, "comparison.json")
        proc = fx.run_script("compare.py", self.write("base.json", base_doc), self.write("new.json", new_doc),
                             "--json", out, *options)
        with open(out, encoding="utf-8") as f:
            return proc, json.load(f)

    def case(self, doc, predicate):
        record = fx.find(self.base_doc, predicate)
        return next(c for c in doc["cases"] if c["label"] == record_label(record))

    def test_a_a_shifts_that_the_u_test_called_slower_are_unsure(self):
        # Two cases of two back-to-back runs of one binary on a shared 2-core machine (5 samples
        # each): the U test gave p = 0.008 and 0.016, so both were SLOWER and the A/A run failed.
        # Their intervals reach back under +5% (the threshold then): one run's samples do not show
        # a regression.
        wild = fx.is_case(impl="chunked", mode="fwd", seq=512, dim=64)
        drift = fx.is_case(impl="chunked", mode="fwd_bwd", seq=2048, dim=64)
        base, new = copy.deepcopy(self.base_doc), copy.deepcopy(self.base_doc)
        fx.set_samples(fx.find(base, wild), [0.3468, 0.3474, 0.3465, 0.3462, 0.3468])
        fx.set_samples(fx.find(new, wild), [0.7302, 0.76, 0.5697, 0.3535, 0.3507])
        fx.set_samples(fx.find(base, drift), [4.5388, 4.6597, 4.6818, 4.5769, 4.5471])
        fx.set_samples(fx.find(new, drift), [5.1488, 5.0474, 5.0008, 4.8461, 4.6703])
        proc, doc = self.compare(base, new, "--threshold", "5%")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        for predicate, change in ((wild, 64.3), (drift, 9.3)):
            case = self.case(doc, predicate)
            self.assertEqual(case["verdict"], "UNSURE", case)
            self.assertAlmostEqual(case["change_pct"], change, delta=0.1)
            self.assertLess(case["interval_pct"][0], 5)
            self.assertGreater(case["interval_pct"][1], 5)
        self.assertEqual(doc["counts"]["SLOWER"], 0)
        self.assertEqual(doc["counts"]["UNSURE"], 2)
        self.assertIn("UNSURE", proc.stdout)
        proc, doc = self.compare(base, new, "--threshold", "5%", "--strict")
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertEqual(doc["exit_status"], 1)

    def test_three_samples_a_side_are_unsure_not_same(self):
        # With 3 samples a side the U test's smallest p is 0.1: a 70x slowdown came out SAME.
        planted = fx.is_case(impl="scan", mode="fwd", seq=2048, dim=64)
        base = fx.variant(self.base_doc, seed=30, samples=3)
        new = fx.variant(self.base_doc, seed=31, samples=3, scale=70, only=planted)
        proc, doc = self.compare(base, new)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        verdicts = {c["verdict"] for c in doc["cases"]}
        self.assertEqual(verdicts, {"UNSURE", "SKIPPED"})
        slow = self.case(doc, planted)
        self.assertGreater(slow["change_pct"], 6000)
        self.assertEqual((slow["interval_kind"], slow["interval_pct"]), ("none", None))
        self.assertIn("too few samples (3+3", slow["test"])
        proc, _ = self.compare(base, new, "--strict")
        self.assertEqual(proc.returncode, 1)

    def test_five_clean_samples_a_side_decide(self):
        planted = fx.is_case(impl="scan", mode="fwd", seq=2048, dim=64)
        base = fx.variant(self.base_doc, seed=32, samples=5, noise=0.002)
        new = fx.variant(self.base_doc, seed=33, samples=5, noise=0.002, scale=1.3, only=planted)
        proc, doc = self.compare(base, new)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertEqual(self.case(doc, planted)["verdict"], "SLOWER")
        self.assertEqual({c["verdict"] for c in doc["cases"]} - {"SLOWER"}, {"SAME", "SKIPPED"})

    def test_a_change_past_the_threshold_with_an_interval_across_it_is_unsure(self):
        # +6% with 2% noise and 7 samples: the interval reaches under +5%.
        planted = fx.is_case(impl="chunked", mode="fwd", seq=2048, dim=32)
        new = fx.variant(self.base_doc, seed=34, scale=1.06, noise=0.02, only=planted)
        proc, doc = self.compare(self.base_doc, new, "--threshold", "5%")
        case = self.case(doc, planted)
        self.assertGreater(case["change_pct"], 5)
        self.assertLess(case["interval_pct"][0], 5)
        self.assertEqual(case["verdict"], "UNSURE")
        self.assertEqual(proc.returncode, 0)

    def test_intervals_are_the_same_on_every_run(self):
        new = fx.variant(self.base_doc, seed=35, noise=0.03)
        _, first = self.compare(self.base_doc, new)
        _, second = self.compare(self.base_doc, new)
        self.assertEqual([c["interval_pct"] for c in first["cases"]], [c["interval_pct"] for c in second["cases"]])
        self.assertEqual((first["bootstrap"], first["threshold_pct"], first["confidence_pct"]), (10000, 10, 95))
        _, fewer = self.compare(self.base_doc, new, "--bootstrap", "500")
        self.assertEqual(fewer["bootstrap"], 500)
        self.assertNotEqual([c["interval_pct"] for c in first["cases"]], [c["interval_pct"] for c in fewer["cases"]])

    def test_a_winner_within_noise_is_a_tie_and_makes_no_crossover(self):
        # At T=512 D=32 fwd scan beats chunked by 18% in the fixture, and loses at T=2048: a
        # crossover. Bring chunked to within 0.5% of scan there, with 2% noise: a tie, which
        # neither wins nor turns the series.
        doc = fx.variant(self.base_doc, seed=36)
        scan = fx.find(doc, fx.is_case(impl="scan", mode="fwd", seq=512, dim=32))
        chunked = fx.find(doc, fx.is_case(impl="chunked", mode="fwd", seq=512, dim=32))
        rng = np.random.default_rng(37)
        fx.set_samples(scan, scan["median_ms"] * (1 + 0.02 * rng.standard_normal(7)))
        fx.set_samples(chunked, scan["median_ms"] * 1.005 * (1 + 0.02 * rng.standard_normal(7)))
        proc, result = self.compare(self.base_doc, doc)
        winner = next(w for w in result["winners"] if w["shape"].startswith("kernel fwd ") and w["seq"] == 512
                      and "D=32" in w["shape"])
        self.assertEqual(winner["confidence"], "tie", winner)
        self.assertLess(winner["factor_low"], 1)
        series = next(c for c in result["crossovers"] if c["series"].startswith("kernel fwd ") and "D=32" in c["series"])
        self.assertEqual(series["changes"], [])
        self.assertEqual(series["ties"], [512])
        self.assertEqual(series["winner"], "chunked")
        self.assertIn("tie: ", proc.stdout)
        lines = [line.strip() for line in proc.stdout.splitlines()]
        self.assertFalse([line for line in lines if line.startswith("crossover kernel fwd cpu B=2 H=4 D=32")])
        self.assertIn("no crossover kernel fwd cpu B=2 H=4 D=32 C=128: chunked fastest at T=2048; tie or unsure "
                      "at T=512", lines)
        clear = [w for w in result["winners"] if w is not winner]
        self.assertTrue(all(w["confidence"] == "clear" and w["factor_low"] > 1 for w in clear), clear)

    def test_header_names_program_version_and_schema_version(self):
        proc, result = self.compare(self.base_doc, fx.variant(self.base_doc, seed=38))
        self.assertEqual(self.base_doc["version"], "0.1.0")
        header = proc.stdout.splitlines()[:2]
        for line in header:
            self.assertIn("[lattnbench 0.1.0, schema 1.0.0; ", line)
        self.assertEqual((result["base"]["version"], result["base"]["schema_version"]), ("0.1.0", "1.0.0"))
        # A file without a top-level version names the device block's.
        doc = copy.deepcopy(self.base_doc)
        del doc["version"]
        doc["device"]["lattnbench_version"] = "0.0.9"
        proc, _ = self.compare(doc, self.base_doc)
        self.assertIn("[lattnbench 0.0.9, schema 1.0.0; ", proc.stdout.splitlines()[0])


    def test_a_reference_file_is_read_by_its_quartiles(self):
        # No samples_ms on the reference side: both records' quartile ranges give the interval.
        planted = fx.is_case(impl="chunked", mode="fwd_bwd", seq=2048, dim=64)
        new = fx.variant(self.base_doc, seed=42, scale=1.3, only=planted)
        proc, doc = self.compare(fx.reference_format(self.base_doc), new, "--ignore-device")
        self.assertEqual(proc.returncode, 1, proc.stdout)
        kinds = {c["interval_kind"] for c in doc["cases"] if c["verdict"] != "SKIPPED" and c["new"] is not None}
        self.assertEqual(kinds, {"IQR"})
        slow = next(c for c in doc["cases"] if c["case"].get("impl") == "chunked" and c["case"].get("mode") == "fwd_bwd"
                    and c["case"].get("seq") == 2048 and c["case"].get("dim") == 64)
        self.assertEqual(slow["verdict"], "SLOWER")

    def test_the_files_own_warnings_are_printed_with_the_verdicts(self):
        base, new = copy.deepcopy(self.base_doc), fx.variant(self.base_doc, seed=39)
        new["warnings"] = ["the machine is loaded (1-minute load average 12.84 on 2 cores): timings may be noisy"]
        proc, result = self.compare(base, new)
        self.assertIn("NEW warning: the machine is loaded (1-minute load average 12.84 on 2 cores)", proc.stdout)
        self.assertNotIn("BASE warning", proc.stdout)
        self.assertEqual(result["new"]["warnings"], new["warnings"])

    def test_different_cpu_kernel_tuning_is_named_in_the_header(self):
        base, new = copy.deepcopy(self.base_doc), fx.variant(self.base_doc, seed=40)
        choices = {"scan": {"tokens_per_walk": 6, "column_block": 32}, "packed_gemm": {"micro_rows": 14}}
        base["device"]["tuning"] = {"source": "default", "choices": copy.deepcopy(choices)}
        new["device"]["tuning"] = {"source": "calibrated", "choices": copy.deepcopy(choices)}
        proc, _ = self.compare(base, new)
        self.assertNotIn("tuning differs", proc.stdout)
        new["device"]["tuning"]["choices"]["scan"]["tokens_per_walk"] = 5
        proc, _ = self.compare(base, new)
        self.assertIn("tuning differs (the CPU kernels' runtime choices, BASE -> NEW): scan.tokens_per_walk 6 -> 5",
                      proc.stdout)
        self.assertNotIn("column_block", proc.stdout)


def record_label(record):
    words = [record["suite"], record["impl"], record["mode"], record["backend"], f"B={record['batch']}",
             f"H={record['heads']}", f"T={record['seq']}"]
    if record["suite"] == "kernel":
        words.append(f"D={record['dim']}")
    words.append(f"C={record['chunk']}")
    if record["suite"] == "layer":
        words += [f"W={record['window']}", f"Dh={record['head_dim']}"]
    return " ".join(words)


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()

    def assert_bad_input(self, *args, mentions):
        proc = fx.run_script("compare.py", *args)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("compare.py: error: "), lines[0])
        self.assertIn(mentions, lines[0])
        self.assertEqual(proc.stdout, "")

    def test_not_json(self):
        path = os.path.join(self.tmp.name, "broken.json")
        with open(path, "w") as f:
            f.write('{"schema_version": "1.0.0", "results": [')
        self.assert_bad_input(fx.BASE_PATH, path, mentions="not JSON")

    def test_missing_file(self):
        absent = os.path.join(self.tmp.name, "absent.json")
        self.assert_bad_input(fx.BASE_PATH, absent, mentions="cannot read")

    def test_unknown_schema_major_version(self):
        self.base_doc["schema_version"] = "9.0.0"
        path = fx.write(self.tmp.name, "future.json", self.base_doc)
        self.assert_bad_input(fx.BASE_PATH, path, mentions="9.0.0")

    def test_no_results_list(self):
        del self.base_doc["results"]
        path = fx.write(self.tmp.name, "empty.json", self.base_doc)
        self.assert_bad_input(fx.BASE_PATH, path, mentions="results")

    def test_devices_differ_without_ignore_device(self):
        self.base_doc["device"]["cpu_model"] = "Another CPU"
        path = fx.write(self.tmp.name, "other.json", self.base_doc)
        self.assert_bad_input(fx.BASE_PATH, path, mentions="devices differ")
        proc = fx.run_script("compare.py", fx.BASE_PATH, path, "--ignore-device")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("devices differ (--ignore-device)", proc.stdout)

    def test_cpu_signatures_tell_one_model_name_apart(self):
        # A hypervisor can name two CPU generations alike ("AMD EPYC"): the signatures decide.
        zen4, zen5 = copy.deepcopy(self.base_doc), copy.deepcopy(self.base_doc)
        zen4["device"]["cpu_signature"] = "AuthenticAMD family 25 model 17 stepping 1"
        zen5["device"]["cpu_signature"] = "AuthenticAMD family 26 model 2 stepping 1"
        zen4_path = fx.write(self.tmp.name, "zen4.json", zen4)
        zen5_path = fx.write(self.tmp.name, "zen5.json", zen5)
        self.assert_bad_input(zen4_path, zen5_path, mentions="family 26")
        proc = fx.run_script("compare.py", zen4_path, zen4_path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # A file written before the signature was recorded still compares by model name.
        proc = fx.run_script("compare.py", fx.BASE_PATH, zen4_path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("devices differ", proc.stdout)

    def test_bad_threshold(self):
        for threshold in ("abc", "-5%", "nan"):
            with self.subTest(threshold=threshold):
                self.assert_bad_input(fx.BASE_PATH, fx.BASE_PATH, "--threshold", threshold,
                                      mentions="threshold")

    def test_duplicate_case(self):
        self.base_doc["results"].append(self.base_doc["results"][0])
        path = fx.write(self.tmp.name, "twice.json", self.base_doc)
        self.assert_bad_input(fx.BASE_PATH, path, mentions="appears twice")


if __name__ == "__main__":
    unittest.main()

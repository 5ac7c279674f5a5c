"""scripts/merge.py, run as a subprocess on shards cut from the fixture."""

import copy
import json
import os
import sys
import tempfile
import unittest

import fixtures as fx

sys.path.insert(0, fx.SCRIPTS)
import merge  # noqa: E402  (scripts/merge.py, for its port of src/results/summary.cpp)


class MergeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.base_doc = fx.load_base()
        self.shards = fx.shards(self.base_doc, 2)
        self.out = os.path.join(self.tmp.name, "merged.json")

    def merge(self, *docs):
        paths = [fx.write(self.tmp.name, f"shard-{i}.json", doc) for i, doc in enumerate(docs)]
        return fx.run_script("merge.py", "-o", self.out, *paths)

    def merged(self):
        with open(self.out, encoding="utf-8") as f:
            return json.load(f)

    def assert_refused(self, proc, mentions):
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("merge.py: error: "), lines[0])
        self.assertIn(mentions, lines[0])
        self.assertFalse(os.path.exists(self.out))

    def test_two_shards_merge_to_the_union_in_plan_order(self):
        # Given in reverse, so plan_index, not input order, must decide the order.
        proc = self.merge(self.shards[1], self.shards[0])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        merged = self.merged()
        self.assertEqual(merged["results"], self.base_doc["results"])
        self.assertEqual(merged["totals"], {"cases": 19, "ok": 18, "failed": 0, "skipped": 1, "unchecked": 0})
        self.assertEqual(merged["merged_from"], ["shard-0.json", "shard-1.json"])
        self.assertNotIn("shard", merged)
        self.assertEqual(merged["config"], self.base_doc["config"])
        self.assertEqual(merged["device"], self.base_doc["device"])
        self.assertEqual(os.listdir(self.tmp.name).count("merged.json"), 1)
        self.assertFalse([n for n in os.listdir(self.tmp.name) if n.endswith(".tmp")])

    def test_input_order_without_plan_index(self):
        for shard in self.shards:
            for record in shard["results"]:
                del record["plan_index"]
        proc = self.merge(self.shards[1], self.shards[0])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        expected = self.shards[1]["results"] + self.shards[0]["results"]
        self.assertEqual(self.merged()["results"], expected)

    def test_totals_count_failed_records(self):
        self.shards[0]["results"][0]["status"] = "failed"
        proc = self.merge(*self.shards)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.merged()["totals"], {"cases": 19, "ok": 17, "failed": 1, "skipped": 1, "unchecked": 0})

    def test_shard_key_in_config_is_ignored_and_dropped(self):
        for shard in self.shards:
            shard["config"]["shard"] = f"{shard['shard']['index']}/2"
        proc = self.merge(*self.shards)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("shard", self.merged()["config"])

    def test_the_op_options_tell_cases_apart(self):
        # rule, normalize_keys and gate_norm (the kernel op's own keys) are part of a case's
        # identity: records that differ only in one of them are different cases, merged side by
        # side and summarised apart, not one case recorded twice.
        kernel = next(r for r in self.shards[0]["results"] if r["suite"] == "kernel" and "median_ms" in r)
        variants = [{"rule": "delta", "normalize_keys": True}, {"rule": "delta", "normalize_keys": False},
                    {"decay": "scalar", "gate_norm": 1.0}, {"decay": "scalar", "gate_norm": 16.0}]
        top = max(r["plan_index"] for shard in self.shards for r in shard["results"])
        for i, extra in enumerate(variants):
            for j, impl in enumerate(("scan", "chunked")):
                record = copy.deepcopy(kernel)
                record.update(extra, impl=impl)
                record["plan_index"] = top + 1 + 2 * i + j
                self.shards[j]["results"].append(record)
        proc = self.merge(*self.shards)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        merged = self.merged()["results"]
        self.assertEqual(len(merged), 19 + 2 * len(variants))
        for extra in variants:
            self.assertEqual(len([r for r in merged if all(r.get(k) == v for k, v in extra.items())]), 2, extra)
        # The summary compares scan and chunked within each variant, never across them.
        comparisons = merge.build_summary(merged)["comparisons"]
        for extra in variants:
            shapes = [c for c in comparisons if all(c.get(k) == v for k, v in extra.items())]
            self.assertEqual(len(shapes), 1, (extra, comparisons))
        # A record without a rule (an older file, the reference file) is the additive rule's.
        key = merge.lr.case_key(merge.lr._normalise({"suite": "kernel", "impl": "scan"}, "cpu", False))
        self.assertEqual(merge.lr.key_as_dict(key)["rule"], "additive")

    def test_duplicate_case_is_refused(self):
        self.shards[1]["results"].append(self.shards[0]["results"][0])
        self.assert_refused(self.merge(*self.shards), "is also in")

    def test_mismatched_config_is_refused(self):
        self.shards[1]["config"]["reps"] = 9
        self.assert_refused(self.merge(*self.shards), "config differs")

    def test_mismatched_device_is_refused(self):
        self.shards[1]["device"]["cpu_model"] = "Another CPU"
        self.assert_refused(self.merge(*self.shards), "device")

    def cuda_shards(self, *gpus):
        """The two shards as a CUDA sweep's, on these GPUs (None: the device block found no GPU)."""
        for shard, gpu in zip(self.shards, gpus):
            shard["device"].update(backend="cuda", gpu=gpu, compute_capability="9.0")
            for record in shard["results"]:
                record["backend"] = "cuda"
        return self.shards

    def test_mixed_gpus_are_refused(self):
        shards = self.cuda_shards("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
        self.assert_refused(self.merge(*shards), "GPU 'NVIDIA A100-SXM4-80GB' differs from")
        shards = self.cuda_shards("NVIDIA H100 80GB HBM3", None)
        self.assert_refused(self.merge(*shards), "GPU 'none' differs from")

    def test_one_gpu_model_merges_whatever_the_host_cpus(self):
        # A CUDA run's times are the GPU's: two hosts with one GPU model are one device.
        shards = self.cuda_shards("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
        shards[1]["device"].update(cpu_model="Another CPU", cpu_signature="GenuineIntel family 6 model 143 stepping 8")
        proc = self.merge(*shards)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        merged = self.merged()
        self.assertEqual(merged["device"]["gpu"], "NVIDIA H100 80GB HBM3")
        self.assertEqual(len(merged["results"]), len(self.base_doc["results"]))

    def test_mismatched_schema_major_is_refused(self):
        self.shards[1]["schema_version"] = "2.0.0"
        self.assert_refused(self.merge(*self.shards), "schema_version")

    def test_shards_of_different_splits_are_refused(self):
        self.shards[1]["shard"]["count"] = 3
        self.assert_refused(self.merge(*self.shards), "shard counts")

    def test_the_summary_is_recomputed_over_the_merged_cases(self):
        # Shards of a real run, each with the summary lattnbench writes over its own cases: the
        # merged file's must be the one the unsharded run wrote, not the first shard's.
        real = fx.load_real()
        shards = fx.shards(real, 2)
        for shard in shards:
            shard["summary"] = merge.build_summary(shard["results"])
            self.assertNotEqual(shard["summary"], real["summary"])
        proc = self.merge(*shards)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        merged = self.merged()
        self.assertEqual(merged["results"], real["results"])
        self.assertEqual(json.dumps(merged["summary"]), json.dumps(real["summary"]))

    def test_build_summary_matches_the_one_lattnbench_wrote(self):
        real = fx.load_real()
        summary = merge.build_summary(real["results"])
        # Same values and the same key order, down to each comparison and crossover.
        self.assertEqual(json.dumps(summary), json.dumps(real["summary"]))
        self.assertEqual(len(summary["comparisons"]), 14)
        self.assertTrue(any(c["changes"] for c in summary["crossovers"]))
        # Records that did not pass (skipped, failed, without a median_ms) are out of the comparisons
        # and listed with their status and why, as src/results/summary.cpp does.
        extra = [dict(real["results"][0], impl="other", status="skipped", median_ms=1e-9, skip_reason="x"),
                 {k: v for k, v in real["results"][1].items() if k != "median_ms"} | {"impl": "third"},
                 dict(real["results"][2], impl="wrong", status="failed", median_ms=1e-9, check_failure="o rel_err")]
        with_extra = merge.build_summary(real["results"] + extra)
        self.assertEqual({k: v for k, v in with_extra.items() if k != "not_compared"},
                         {k: v for k, v in summary.items() if k != "not_compared"})
        self.assertEqual([(n["impl"], n["status"], n["reason"]) for n in with_extra["not_compared"]],
                         [("other", "skipped", "x"), ("third", "ok", "not measured"), ("wrong", "failed", "o rel_err")])

    def test_missing_shard_warns_but_merges(self):
        proc = self.merge(self.shards[0])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("missing", proc.stderr)
        self.assertEqual(self.merged()["totals"]["cases"], len(self.shards[0]["results"]))

    def test_a_forgotten_output_overwrites_no_input(self):
        # The old positional form with its output forgotten: the first shard would have been the output.
        first = fx.write(self.tmp.name, "s1copy.json", self.shards[0])
        second = fx.write(self.tmp.name, "s2.json", self.shards[1])
        with open(first, "rb") as f:
            before = f.read()
        proc = fx.run_script("merge.py", first, second)
        self.assert_refused(proc, "-o OUT.json")
        with open(first, "rb") as f:
            self.assertEqual(f.read(), before)

    def test_an_input_as_the_output_is_refused_even_with_force(self):
        first = fx.write(self.tmp.name, "s1.json", self.shards[0])
        second = fx.write(self.tmp.name, "s2.json", self.shards[1])
        with open(first, "rb") as f:
            before = f.read()
        for extra in ((), ("--force",)):
            proc = fx.run_script("merge.py", "--out", os.path.join(self.tmp.name, ".", "s1.json"), *extra, first, second)
            self.assert_refused(proc, "is also an input")
            with open(first, "rb") as f:
                self.assertEqual(f.read(), before)

    def test_an_existing_output_is_replaced_only_with_force(self):
        with open(self.out, "w", encoding="utf-8") as f:
            f.write("keep me\n")
        proc = self.merge(*self.shards)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--force", proc.stderr)
        with open(self.out, encoding="utf-8") as f:
            self.assertEqual(f.read(), "keep me\n")
        paths = [fx.write(self.tmp.name, f"shard-{i}.json", doc) for i, doc in enumerate(self.shards)]
        proc = fx.run_script("merge.py", "-o", self.out, "--force", *paths)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.merged()["results"], self.base_doc["results"])


if __name__ == "__main__":
    unittest.main()

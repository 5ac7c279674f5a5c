"""scripts/history.py, run as a subprocess: a history of synthetic runs made from a real result file
(lattnbench-real.json), one with a planted 20% slowdown on one case and two from another device;
the page it writes, parsed; adding a file twice; the github-action-benchmark export; bad input.
The page in a browser: history_screenshot_test.py."""

import copy
import hashlib
import html.parser
import json
import os
import sys
import tempfile
import unittest

import fixtures as fx

sys.path.insert(0, fx.SCRIPTS)
import lattn_results as lr  # noqa: E402  (beside the scripts, as they import it)

# The case the last run of device A slows down by 20%.
PLANTED = fx.is_case(suite="kernel", impl="chunked", mode="fwd", seq=2048, dim=64)
RUNS_A = 4                      # commits 1-4 on device A; the 4th holds the slowdown
COMMITS_B = (2, 3)              # device B ran commits 3 and 4 (0-based 2, 3)
OTHER_SIGNATURE = "GenuineIntel family 6 model 143 stepping 8"


def commit_id(n):
    return hashlib.sha1(f"commit {n}".encode()).hexdigest()


def write_synthetic_history(directory):
    """Writes the runs as result files into directory; returns (paths in date order, the planted
    case's label, device A's fingerprint, device B's)."""
    real = fx.load_real()
    paths = []
    for n in range(RUNS_A):
        doc = fx.variant(real, seed=100 + n, scale=1.2 if n == RUNS_A - 1 else 1.0, only=PLANTED)
        doc["device"]["git_revision"] = commit_id(n)
        doc["created_utc"] = f"2026-12-0{n + 1}T08:00:00Z"
        paths.append(fx.write(directory, f"a{n}.json", doc))
    for n in COMMITS_B:
        # Another machine: its own CPU signature and model, 1.6x the times, no slowdown.
        doc = fx.variant(real, seed=200 + n, scale=1.6)
        doc["device"].update(git_revision=commit_id(n), cpu_signature=OTHER_SIGNATURE, cpu_model="Intel Xeon")
        doc["created_utc"] = f"2026-12-0{n + 1}T09:00:00Z"
        paths.append(fx.write(directory, f"b{n}.json", doc))
    device_a = f"cpu/{real['device']['cpu_model']} ({real['device']['cpu_signature']})"
    device_b = f"cpu/Intel Xeon ({OTHER_SIGNATURE})"
    return paths, labels(real, PLANTED)[0], device_a, device_b


def labels(doc, predicate=lambda record: True):
    """lattn_results.describe_case's labels, the charts' and the tables' names for cases, of the
    records of doc that predicate picks, in the file's order."""
    return [lr.describe_case(record) for record, raw in zip(lr.from_document("doc", doc).records, doc["results"])
            if predicate(raw)]


class Page(html.parser.HTMLParser):
    """The parts of the page the tests read: charts with their series and points, both tables' rows,
    the per-chart latest lines, and every URL-bearing attribute."""

    def __init__(self, text):
        super().__init__()
        self.charts, self.rows, self.same_rows, self.urls, self.tags = [], [], [], [], set()
        self._table = None
        self._title = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v is not None]
        if tag == "figure" and "chart" in a.get("class", ""):
            self.charts.append({"case": a["data-case"], "series": {}, "latest": {}})
        elif tag == "g" and a.get("class") == "series":
            self._series = self.charts[-1]["series"].setdefault(a["data-device"], [])
            self.charts[-1].setdefault("bands", {})[a["data-device"]] = 0
            self._device = a["data-device"]
        elif tag == "polygon" and a.get("class") == "band":
            self.charts[-1]["bands"][self._device] += len(a["points"].split())
        elif a.get("class") == "point":
            self._series.append({"commit": a["data-commit"], "verdict": a["data-verdict"],
                                 "latest": a.get("data-latest") == "1", "title": ""})
            self._title = self._series[-1]
        elif tag == "li" and "data-device" in a and self.charts:
            self.charts[-1]["latest"][a["data-device"]] = a["data-verdict"]
        elif tag == "table":
            self._table = {"slower-first": self.rows, "same": self.same_rows}.get(a.get("class"))
        elif tag == "tr" and self._table is not None and "data-verdict" in a:
            self._table.append((a["data-verdict"], a["data-case"], a["data-device"]))

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        if tag in ("circle", "path"):
            self._title = None

    def handle_data(self, data):
        if self._title is not None:
            self._title["title"] += data


class HistoryTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.history = os.path.join(self.tmp.name, "results", "history.jsonl")
        self.paths, self.planted, self.device_a, self.device_b = write_synthetic_history(self.tmp.name)

    def history_py(self, *args):
        return fx.run_script("history.py", *args)

    def add(self, *paths, expect=0):
        proc = self.history_py("add", "--history", self.history, *paths)
        self.assertEqual(proc.returncode, expect, proc.stdout + proc.stderr)
        return proc

    def lines(self):
        with open(self.history, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def page(self):
        self.add(*self.paths)
        out = os.path.join(self.tmp.name, "page.html")
        proc = self.history_py("html", "--history", self.history, "-o", out)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(out, encoding="utf-8") as f:
            text = f.read()
        return text, Page(text)

    def test_the_page_shows_the_planted_slowdown_and_both_devices(self):
        text, page = self.page()
        real_labels = labels(fx.load_real())
        self.assertEqual(sorted(c["case"] for c in page.charts), sorted(real_labels), "one chart per case key")
        commits_a = [commit_id(n) for n in range(RUNS_A)]
        commits_b = [commit_id(n) for n in COMMITS_B]
        for chart in page.charts:
            with self.subTest(case=chart["case"]):
                self.assertEqual(set(chart["series"]), {self.device_a, self.device_b})
                a, b = chart["series"][self.device_a], chart["series"][self.device_b]
                self.assertEqual([p["commit"] for p in a], commits_a)
                self.assertEqual([p["commit"] for p in b], commits_b)
                slowed = chart["case"] == self.planted
                self.assertEqual([p["verdict"] for p in a], ["none", "SAME", "SAME", "SLOWER" if slowed else "SAME"])
                self.assertEqual([p["verdict"] for p in b], ["none", "SAME"])
                self.assertEqual([p["latest"] for p in a], [False] * (RUNS_A - 1) + [True])
                # The quartile band: q3 along the points and q1 back, two corners a point.
                self.assertEqual(chart["bands"], {self.device_a: 2 * RUNS_A, self.device_b: 2 * len(COMMITS_B)})
                self.assertEqual(chart["latest"], {self.device_a: "SLOWER" if slowed else "SAME",
                                                   self.device_b: "SAME"})
                for point in a + b:
                    self.assertIn(f"commit {point['commit'][:10]}", point["title"])
                    self.assertIn("config: ", point["title"])
                    self.assertIn("reps 5", point["title"])
                self.assertIn(f"[{self.device_a}]", a[0]["title"])
                self.assertIn(f"[{self.device_b}]", b[0]["title"])
        planted_point = next(c for c in page.charts if c["case"] == self.planted)["series"][self.device_a][-1]
        self.assertRegex(planted_point["title"], r"SLOWER \+(19|2[0-2])\.\d% \(95% CI \+1\d")

        # The slower-first table: the planted case, alone, with SLOWER; the rest SAME, folded away.
        self.assertEqual(page.rows, [("SLOWER", self.planted, self.device_a)])
        self.assertEqual(len(page.same_rows), 2 * len(real_labels) - 1)
        self.assertEqual({v for v, _, _ in page.same_rows}, {"SAME"})
        self.assertLess(text.index("slower-first"), text.index('class="chart"'), "the table comes before the charts")

        # Self-contained: nothing to fetch.
        self.assertTrue(all(url.startswith("#") for url in page.urls), page.urls)
        self.assertFalse({"script", "link", "img", "iframe", "object"} & page.tags, page.tags)
        for fetches in ("url(", "@import", "@font-face"):
            self.assertNotIn(fetches, text)

    def test_runs_of_another_device_make_their_own_series_in_the_legend(self):
        text, page = self.page()
        self.assertIn("4 commits", text)
        self.assertIn(f"[cpu/Intel Xeon ({OTHER_SIGNATURE})]</small>: 2 commits", text)

    def test_adding_a_file_twice_keeps_one(self):
        self.add(self.paths[0])
        proc = self.add(self.paths[0], self.paths[0])
        self.assertIn("already in the history, kept once", proc.stdout)
        self.assertEqual(len(self.lines()), 1)
        self.add(*self.paths)
        self.add(*reversed(self.paths))
        lines = self.lines()
        self.assertEqual(len(lines), len(self.paths))
        keys = [(e["history"]["commit"], e["history"]["date"], e["history"]["device"]) for e in lines]
        self.assertEqual(len(set(keys)), len(keys))
        self.assertEqual(keys, sorted(keys, key=lambda k: (k[1], k[0])), "kept in date order")
        # What is stored is the file as written.
        with open(self.paths[0], encoding="utf-8") as f:
            self.assertEqual(lines[0]["run"], json.load(f))

    def test_the_same_run_written_again_replaces_its_line(self):
        self.add(self.paths[0])
        with open(self.paths[0], encoding="utf-8") as f:
            doc = json.load(f)
        doc["warnings"] = ["written again"]
        again = fx.write(self.tmp.name, "a0-again.json", doc)
        proc = self.add(again)
        self.assertIn("replaced", proc.stdout)
        lines = self.lines()
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["run"]["warnings"], ["written again"])

    def test_commit_option_stores_a_run_under_that_commit(self):
        with open(self.paths[0], encoding="utf-8") as f:
            doc = json.load(f)
        doc["device"]["git_revision"] = "unknown"
        outside = fx.write(self.tmp.name, "outside-git.json", doc)
        proc = self.add(outside, expect=2)
        self.assertIn("no git_revision", proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1)
        self.history_py("add", "--history", self.history, "--commit", "feedbeef", outside)
        self.assertEqual(self.lines()[0]["history"]["commit"], "feedbeef")

    def test_export_custom_smaller_is_better(self):
        self.add(*self.paths)
        out = os.path.join(self.tmp.name, "bench.json")
        proc = self.history_py("export", "--history", self.history, "--format", "customSmallerIsBetter", "-o", out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out, encoding="utf-8") as f:
            entries = json.load(f)
        # The latest run is device B's at commit 4.
        with open(self.paths[-1], encoding="utf-8") as f:
            latest = json.load(f)
        self.assertIsInstance(entries, list)
        self.assertEqual(len(entries), sum(r["status"] == "ok" for r in latest["results"]))
        for entry, record, label in zip(entries, latest["results"], labels(latest)):
            self.assertLessEqual(set(entry), {"name", "unit", "value", "range", "extra"})
            self.assertEqual(entry["name"], label)
            self.assertEqual(entry["unit"], "ms")
            self.assertAlmostEqual(entry["value"], record["median_ms"])
            self.assertEqual(entry["range"], f"± {(record['q3_ms'] - record['q1_ms']) / 2:.4g}")
            self.assertIsInstance(entry["extra"], str)
            self.assertIn(OTHER_SIGNATURE, entry["extra"])
        self.assertEqual(len({e["name"] for e in entries}), len(entries))

        # --device and --commit pick another run: device A at commit 4, with its planted slowdown.
        proc = self.history_py("export", "--history", self.history, "--format", "customSmallerIsBetter",
                               "--device", self.device_a, "--commit", commit_id(RUNS_A - 1)[:8])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        entries = {e["name"]: e for e in json.loads(proc.stdout)}
        with open(self.paths[RUNS_A - 1], encoding="utf-8") as f:
            planted = fx.find(json.load(f), PLANTED)
        self.assertAlmostEqual(entries[self.planted]["value"], planted["median_ms"])
        self.assertIn(commit_id(RUNS_A - 1)[:10], entries[self.planted]["extra"])

    def test_bad_input_is_one_line_and_exit_2(self):
        shard = fx.shards(fx.load_real(), 2)[0]
        shard["device"]["git_revision"] = commit_id(0)
        cases = [
            (["add", fx.write(self.tmp.name, "shard.json", shard)], "shard 1/2 of a sharded run"),
            (["add", fx.REFERENCE_PATH if os.path.exists(fx.REFERENCE_PATH) else
              fx.write(self.tmp.name, "ref.json", fx.reference_format(fx.load_base()))], "reference-format"),
            (["html", "-o", os.path.join(self.tmp.name, "p.html")], "no history here"),
            (["export", "--format", "customBiggerIsBetter"], "invalid choice"),
        ]
        for args, message in cases:
            with self.subTest(args=args[0], message=message):
                proc = self.history_py(*args[:1], "--history", self.history, *args[1:])
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                self.assertIn(message, proc.stderr)
                self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        os.makedirs(os.path.dirname(self.history), exist_ok=True)
        with open(self.history, "w", encoding="utf-8") as f:
            f.write('{"history": {"commit": "a", "date": "b", "device": "c"}, "run": {}}\nnot json\n')
        proc = self.history_py("html", "--history", self.history, "-o", os.path.join(self.tmp.name, "p.html"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn(f"{self.history}:2: not JSON", proc.stderr)


if __name__ == "__main__":
    unittest.main()

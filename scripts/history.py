#!/usr/bin/python3
"""Results over commits: a history of lattnbench result files, a page of plots, an export.

    history.py add RESULT.json... [--history FILE] [--commit SHA]
    history.py html -o PAGE.html [--history FILE] [--threshold 10%] [--alpha 0.05] [--bootstrap N]
               [--title TEXT]
    history.py export --format customSmallerIsBetter [-o FILE] [--history FILE] [--commit SHA]
               [--device FINGERPRINT]

The history is one JSON-lines file (default results/history.jsonl): a line a run, the result file
as lattnbench wrote it under "run", and under "history" the key it is stored by: the commit (the
device block's git_revision, or --commit), the run's created_utc and the device fingerprint that
compare.py tells machines apart by. A run whose key is already there is not added again (a file
added twice is one line). The page (history_page.py) plots each case's median over commits, one
series a device, and judges each run against the previous commit's run on its device with
compare.py's own comparison. The export writes the latest run in github-action-benchmark's
customSmallerIsBetter format. Rules and the page: docs/ci.md, "Results over commits".
"""

import json
import os
import sys
from dataclasses import dataclass

try:
    from . import compare, history_page, lattn_results as lr  # as part of a package
except ImportError:
    import compare
    import history_page
    import lattn_results as lr

DEFAULT_HISTORY = os.path.join("results", "history.jsonl")
EXPORT_FORMATS = ("customSmallerIsBetter",)


@dataclass
class Run:
    """One line of the history: a result file and the key it is stored by."""
    commit: str
    dirty: bool
    date: str
    device: str          # lr.ResultFile.fingerprint
    device_label: str    # lr.ResultFile.device_label, for legends
    source: str          # the file's name when it was added
    doc: dict            # the result file as lattnbench wrote it
    where: str = ""      # FILE:LINE in the history, for messages

    @property
    def key(self):
        return (self.commit, self.date, self.device)

    @property
    def short_commit(self):
        return self.commit[:10] + (" (dirty)" if self.dirty else "")

    def header(self):
        return {"commit": self.commit, "dirty": self.dirty, "date": self.date, "device": self.device,
                "device_label": self.device_label, "source": self.source}

    def result_file(self):
        return lr.from_document(self.where or self.source, self.doc)


def run_from_result_file(path, commit=None):
    """A Run from a result file lattnbench wrote; ResultFileError where it cannot be one."""
    result = lr.load(path)
    if result.is_reference:
        raise lr.ResultFileError(f"{path}: a reference-format (JAX) file records no commit or date; "
                                 "the history keeps lattnbench result files")
    if isinstance(result.raw.get("shard"), dict):
        shard = result.raw["shard"]
        raise lr.ResultFileError(f"{path}: shard {shard.get('index')}/{shard.get('count')} of a sharded run: "
                                 "merge the shards first (scripts/merge.py)")
    date = result.raw.get("created_utc")
    if not isinstance(date, str) or not date:
        raise lr.ResultFileError(f"{path}: no created_utc (the time the run started)")
    recorded = result.device.get("git_revision")
    if commit is None:
        if not isinstance(recorded, str) or recorded in ("", "unknown"):
            raise lr.ResultFileError(f"{path}: the device block records no git_revision "
                                     "(built outside a git checkout): pass --commit SHA")
        commit = recorded
    # Two records of one case could not be told apart on a plot.
    lr.index_by_case(result)
    return Run(commit, result.device.get("git_dirty") is True and commit == recorded, date,
               result.fingerprint, result.device_label, os.path.basename(path), result.raw)


def read_history(path, must_exist=True):
    """The runs of the history file in it, in its order; [] for a missing file unless must_exist."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        if must_exist:
            raise lr.ResultFileError(f"{path}: no history here (history.py add RESULT.json... makes one)") from None
        return []
    except OSError as e:
        raise lr.ResultFileError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise lr.ResultFileError(f"{path}: not a history: not UTF-8 text") from None
    runs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise lr.ResultFileError(f"{where}: not JSON: {e.msg} at column {e.colno}") from None
        header = entry.get("history") if isinstance(entry, dict) else None
        if not isinstance(header, dict) or not isinstance(entry.get("run"), dict):
            raise lr.ResultFileError(f"{where}: not a history line: expected an object with 'history' and 'run'")
        missing = [k for k in ("commit", "date", "device") if not isinstance(header.get(k), str)]
        if missing:
            raise lr.ResultFileError(f"{where}: the 'history' key lacks {', '.join(missing)}")
        runs.append(Run(header["commit"], header.get("dirty") is True, header["date"], header["device"],
                        str(header.get("device_label", header["device"])), str(header.get("source", "")),
                        entry["run"], where))
    if must_exist and not runs:
        raise lr.ResultFileError(f"{path}: the history holds no run")
    return runs


def write_history(path, runs):
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise lr.ResultFileError(f"{folder}: cannot make the history's folder: {e.strerror}") from None
    ordered = sorted(runs, key=lambda r: (r.date, r.commit, r.device))
    text = "".join(json.dumps({"history": r.header(), "run": r.doc}, separators=(",", ":")) + "\n" for r in ordered)
    lr.write_text_atomic(path, text)


def add(history_path, paths, commit=None, out=sys.stdout):
    """Adds each file to the history; returns how many lines were added or replaced."""
    runs = read_history(history_path, must_exist=False)
    by_key = {r.key: i for i, r in enumerate(runs)}
    changed = 0
    for path in paths:
        run = run_from_result_file(path, commit)
        name = f"{run.short_commit} {run.date} {run.device}"
        recorded = run.doc.get("device", {}).get("git_revision")
        if isinstance(recorded, str) and recorded != run.commit:
            name += f" (built from {recorded[:10]}, stored under --commit)"
        if run.key not in by_key:
            by_key[run.key] = len(runs)
            runs.append(run)
            changed += 1
            out.write(f"added {path}: {name}\n")
        elif runs[by_key[run.key]].doc == run.doc:
            out.write(f"already in the history, kept once: {path}: {name}\n")
        else:
            # Same commit, start time and device: the same run, written again (a resumed run's
            # final file after its partial one); the later file is the complete one.
            runs[by_key[run.key]] = run
            changed += 1
            out.write(f"replaced (same commit, date and device, new content) by {path}: {name}\n")
    if changed:
        write_history(history_path, runs)
    return changed


def pick_run(runs, commit=None, device=None):
    """The latest run (by date) of the device (default: the latest run's) at the commit (default: any)."""
    if device is None:
        device = max(runs, key=lambda r: r.date).device
    chosen = [r for r in runs if r.device == device and (commit is None or r.commit.startswith(commit))]
    if not chosen:
        what = f"device {device!r}" + (f" at commit {commit}" if commit else "")
        devices = "; ".join(sorted({r.device for r in runs}))
        raise lr.ResultFileError(f"no run of {what} in the history (devices: {devices})")
    return max(chosen, key=lambda r: r.date)


def export_custom_smaller_is_better(run):
    """github-action-benchmark's custom format: [{name, unit, value, range, extra}], one entry per
    case that passed (a failed or skipped case has no time to chart); range is half the
    interquartile range, as '± x'."""
    result = run.result_file()
    entries = []
    for record in result.records:
        if not lr.passed(record):
            continue
        q1, q3 = lr.number(record.get("q1_ms")), lr.number(record.get("q3_ms"))
        samples = record.get("samples_ms")
        entry = {"name": lr.describe_case(record), "unit": "ms", "value": lr.number(record["median_ms"])}
        extra = [f"commit {run.short_commit}", f"date {run.date}", f"device {run.device}"]
        if q1 is not None and q3 is not None:
            entry["range"] = f"± {(q3 - q1) / 2:.4g}"
            extra.insert(0, f"quartiles {q1:.4g}-{q3:.4g} ms" +
                         (f" over {len(samples)} samples" if isinstance(samples, list) else ""))
        entry["extra"] = "\n".join(extra)
        entries.append(entry)
    return entries


def main(argv):
    parser = lr.ArgumentParser(description="A history of lattnbench result files: add runs, write a page "
                                           "of plots, export (docs/ci.md).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{add,html,export}",
                                     parser_class=lr.ArgumentParser)

    def history_option(p):
        p.add_argument("--history", default=DEFAULT_HISTORY, metavar="FILE",
                       help=f"the history, one JSON line a run (default {DEFAULT_HISTORY})")

    p_add = commands.add_parser("add", help="store result files in the history")
    p_add.add_argument("files", nargs="+", metavar="RESULT.json")
    p_add.add_argument("--commit", metavar="SHA",
                       help="the commit to store the runs under (default: each file's git_revision)")
    history_option(p_add)

    p_html = commands.add_parser("html", help="write a self-contained page of plots and verdicts")
    p_html.add_argument("-o", "--out", required=True, metavar="PAGE.html")
    p_html.add_argument("--title", default="lattnbench over commits")
    p_html.add_argument("--threshold", type=compare.parse_threshold,
                        default=compare.parse_threshold(compare.DEFAULT_THRESHOLD),
                        help="compare.py's --threshold (default " + compare.DEFAULT_THRESHOLD.replace("%", "%%") + ")")
    p_html.add_argument("--alpha", type=compare.parse_alpha, default=compare.DEFAULT_ALPHA,
                        help=f"compare.py's --alpha (default {compare.DEFAULT_ALPHA})")
    p_html.add_argument("--bootstrap", type=compare.parse_bootstrap, default=compare.DEFAULT_BOOTSTRAP,
                        metavar="N", help=f"compare.py's --bootstrap (default {compare.DEFAULT_BOOTSTRAP})")
    history_option(p_html)

    p_export = commands.add_parser("export", help="the latest run in another tool's format")
    p_export.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p_export.add_argument("-o", "--out", metavar="FILE", help="write here (default: stdout)")
    p_export.add_argument("--commit", metavar="SHA", help="that commit's run (a prefix will do; default: the latest)")
    p_export.add_argument("--device", metavar="FINGERPRINT",
                          help="that device's run (default: the device of the latest run)")
    history_option(p_export)

    args = parser.parse_args(argv)
    if args.command == "add":
        add(args.history, args.files, args.commit)
        return 0
    runs = read_history(args.history)
    if args.command == "html":
        options = compare.Options("median_ms", args.threshold, args.alpha, args.bootstrap)
        page = history_page.render(runs, options, args.title, args.history)
        lr.write_text_atomic(args.out, page)
        print(f"wrote {args.out}: {len(runs)} run{'' if len(runs) == 1 else 's'} in the history")
        return 0
    text = json.dumps(export_custom_smaller_is_better(pick_run(runs, args.commit, args.device)), indent=1,
                      ensure_ascii=False) + "\n"
    if args.out:
        lr.write_text_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

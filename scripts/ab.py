#!/usr/bin/python3
"""Run two or more lattnbench binaries in turn on the same cases, round after round, and give per
case each binary's median over the rounds of its median_ms and its speed-up over the first.

    ab.py [--rounds 5] [--md FILE] [--json FILE] BASE_BIN NEW_BIN [MORE_BIN...] -- LATTNBENCH_ARGS...

A BIN may carry arguments of its own in the same word, split as a shell would:
'build/lattnbench --threads 1' 'build/lattnbench --threads 2' measures how one build scales.

Two result files taken one after the other on a shared machine differ by more than most changes:
its rate moves over tens of seconds (docs/performance.md). Alternating the binaries puts each
round's runs seconds apart, so a drift meets every binary alike, and the median over rounds drops
the rounds that one of them lost to a busy stretch. compare.py's verdicts are for two files; this is
for two builds on one machine, before and after a change. Exit status: 0, or 2 on bad input (a
binary that does not start or exits non-zero, a result file that cannot be read, a bad option).
"""

import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import lattn_results as lr


def parse(argv):
    if "--" not in argv:
        lr.fail("ab.py", "no '--' before the lattnbench arguments (give '--' alone for none)")
    cut = argv.index("--")
    ap = lr.ArgumentParser(prog="ab.py", description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+", metavar="BIN")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--md", help="write the table as Markdown to this file")
    ap.add_argument("--json", help="write the per-case figures as JSON to this file")
    args = ap.parse_args(argv[:cut])
    args.lattnbench_args = argv[cut + 1:]
    if len(args.binaries) < 2:
        lr.fail("ab.py", "give at least two binaries to alternate")
    args.commands = []
    for binary in args.binaries:
        try:
            command = shlex.split(binary)
        except ValueError as e:
            lr.fail("ab.py", f"cannot split the binary argument {binary!r}: {e}")
        if not command:
            lr.fail("ab.py", "an empty binary argument")
        if "--out" in command:
            lr.fail("ab.py", f"--out is ab.py's to set: leave it out of {binary!r}")
        args.commands.append(command)
    if args.rounds < 1:
        lr.fail("ab.py", f"--rounds must be at least 1, not {args.rounds}")
    if "--out" in args.lattnbench_args:
        lr.fail("ab.py", "--out is ab.py's to set: leave it out of the lattnbench arguments")
    return args


def run_once(binary, command, lattnbench_args, out_path):
    """The ok records of one run of `command` (the split `binary` word), {case_key: record}."""
    try:
        proc = subprocess.run([*command, "-q", *lattnbench_args, "--out", out_path], capture_output=True, text=True)
    except OSError as e:
        lr.fail("ab.py", f"{binary}: cannot run: {e.strerror}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        lr.fail("ab.py", f"{binary} exited with status {proc.returncode}: {last}")
    result = lr.load(out_path)
    return {k: r for k, r in lr.index_by_case(result).items() if r.get("status") == "ok"}


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main(argv):
    args = parse(argv)
    names = [shlex.join([os.path.basename(c[0]), *c[1:]]) for c in args.commands]
    if len(set(names)) < len(names):
        names = list(args.binaries)
    if len(set(names)) < len(names):  # one binary given twice: an A/A run, which says what noise is
        names = [f"{i + 1}:{b}" for i, b in enumerate(args.binaries)]
    times = {}  # case key -> binary index -> [median_ms per round]
    labels = {}
    with tempfile.TemporaryDirectory(prefix="lattn-ab-") as tmp:
        for round_index in range(args.rounds):
            for index, (binary, command) in enumerate(zip(args.binaries, args.commands)):
                records = run_once(binary, command, args.lattnbench_args, os.path.join(tmp, f"{round_index}-{index}.json"))
                for key, record in records.items():
                    value = lr.number(record.get("median_ms"))
                    if value is None or value <= 0:
                        continue
                    labels.setdefault(key, lr.describe_case(record))
                    times.setdefault(key, {}).setdefault(index, []).append(value)

    cases = []
    for key in sorted(times, key=lambda k: labels[k]):
        per = times[key]
        if len(per) < len(args.binaries):
            continue  # a case some binary did not run ok: nothing to set it against
        medians = [statistics.median(per[i]) for i in range(len(args.binaries))]
        cases.append({"case": lr.key_as_dict(key), "label": labels[key],
                      "median_ms": dict(zip(names, medians)),
                      "speedup": dict(zip(names, (medians[0] / m for m in medians))),
                      "rounds_ms": {names[i]: per[i] for i in range(len(args.binaries))}})
    if not cases:
        lr.fail("ab.py", "no case ran ok under every binary")
    overall = {n: geomean([c["speedup"][n] for c in cases]) for n in names}

    header = ["case"] + [f"{n} ms" for n in names] + [f"{n} speed-up" for n in names[1:]]
    rows = [[c["label"]] + [f"{c['median_ms'][n]:.4g}" for n in names] +
            [f"{c['speedup'][n]:.3f}x" for n in names[1:]] for c in cases]
    rows.append(["geometric mean"] + [""] * len(names) + [f"{overall[n]:.3f}x" for n in names[1:]])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print(f"{args.rounds} round(s), each binary's median over them; speed-up = {names[0]} ms / binary ms")
    for r in [header] + rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))
    if args.md:
        md = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        lr.write_text_atomic(args.md, "\n".join(md) + "\n")
    if args.json:
        doc = {"rounds": args.rounds, "binaries": dict(zip(names, args.binaries)),
               "lattnbench_args": args.lattnbench_args, "cases": cases, "geomean_speedup": overall}
        lr.write_text_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

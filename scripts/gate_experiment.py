#!/usr/bin/python3
"""Measure compare.py's regression gate on this machine: how often it fails two runs of one binary
(A/A pairs), and how often it catches a slowdown planted with lattnbench's --slowdown.

    gate_experiment.py [--pairs 20] [--tries 10] [--slowdowns 5,10,20] [--threshold PCT]
                       [--keep DIR] [--md FILE] [--json FILE] BIN [-- LATTNBENCH_ARGS...]

A pair is two fresh runs of BIN, back to back, with the same arguments (by default
--suite kernel --seq 512,2048 --dim 32,64 --reps 5), each with -q and its own --out; then
compare.py BASE NEW at its defaults (--threshold passes one on). First --pairs A/A pairs, then for
each planted slowdown P --tries pairs whose second run adds --slowdown P.

  A/A: a pair fails when compare.py exits 1 (a SLOWER or FAILED case); the table also counts the
       pairs with any SLOWER or FASTER case, and the SLOWER, FASTER and UNSURE cases.
  planted: a try is caught when compare.py exits 1 and more than half of its timed cases (SAME,
       FASTER, SLOWER, UNSURE) are SLOWER. Every case is slowed alike, so a try failed by one noisy
       case is not counted as caught; the table also gives the tries with every case SLOWER and
       the tries whose exit status alone was 1.

Prints one line per pair on stderr as it goes (load average before it, seconds of each run,
compare.py's summary), then a Markdown table on stdout. Exit status: 0 when every run and
comparison ran, whatever they found; 2 on bad input (a bad option, BIN not starting or exiting
non-zero, compare.py refusing the files). Rules and this machine's figures: docs/compare.md.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import compare
import lattn_results as lr

PROG = "gate_experiment.py"
DEFAULT_ARGS = ["--suite", "kernel", "--seq", "512,2048", "--dim", "32,64", "--reps", "5"]
TIMED = ("SAME", "FASTER", "SLOWER", "UNSURE")
HERE = os.path.dirname(os.path.abspath(__file__))


def count(text, name, low=0):
    try:
        value = int(text)
    except ValueError:
        lr.fail(PROG, f"{name} must be an integer, not {text!r}")
    if value < low:
        lr.fail(PROG, f"{name} must be at least {low}, not {value}")
    return value


def slowdown_list(text):
    values = []
    for item in text.split(","):
        try:
            value = float(item.strip().rstrip("%"))
        except ValueError:
            lr.fail(PROG, f"--slowdowns: {item!r} is not a percentage")
        if not 0 < value <= 1000:
            lr.fail(PROG, f"--slowdowns: {item!r} is not in (0, 1000] percent")
        values.append(value)
    return values


def parse(argv):
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = lr.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("binary", metavar="BIN", help="the lattnbench binary, with arguments of its own if quoted")
    ap.add_argument("--pairs", default="20", help="A/A pairs (default 20)")
    ap.add_argument("--tries", default="10", help="tries per planted slowdown (default 10)")
    ap.add_argument("--slowdowns", default="5,10,20", help="planted slowdowns in percent (default 5,10,20)")
    ap.add_argument("--threshold", help="passed to compare.py (default: compare.py's)")
    ap.add_argument("--keep", metavar="DIR", help="keep every result file and comparison in DIR")
    ap.add_argument("--md", metavar="FILE", help="also write the table to FILE")
    ap.add_argument("--json", metavar="FILE", help="also write every pair's figures as JSON to FILE")
    args = ap.parse_args(argv[:cut])
    args.pairs = count(args.pairs, "--pairs")
    args.tries = count(args.tries, "--tries")
    args.slowdowns = slowdown_list(args.slowdowns)
    if args.threshold is not None:
        try:  # refused now, not after the first pair's minutes of runs
            compare.parse_threshold(args.threshold)
        except argparse.ArgumentTypeError as e:
            lr.fail(PROG, f"--threshold: {e}")
    if args.pairs + args.tries == 0:
        lr.fail(PROG, "nothing to run: --pairs and --tries are both 0")
    try:
        args.command = shlex.split(args.binary)
    except ValueError as e:
        lr.fail(PROG, f"cannot split the binary argument {args.binary!r}: {e}")
    if not args.command:
        lr.fail(PROG, "an empty binary argument")
    args.lattnbench_args = argv[cut + 1:] if cut < len(argv) else list(DEFAULT_ARGS)
    for own in ("--out", "-o", "--slowdown"):
        if own in args.command + args.lattnbench_args:
            lr.fail(PROG, f"{own} is {PROG}'s to set: leave it out of the lattnbench arguments")
    return args


def run_lattnbench(command, out, slowdown):
    argv = command + ["-q", *(["--slowdown", f"{slowdown:g}"] if slowdown else []), "--out", out]
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        lr.fail(PROG, f"cannot run {argv[0]}: {e.strerror}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        lr.fail(PROG, f"{shlex.join(argv)} exited {proc.returncode}: {last}")
    return time.monotonic() - start


def judge(base, new, report, threshold):
    argv = [sys.executable, os.path.join(HERE, "compare.py"), base, new, "--json", report]
    if threshold is not None:
        argv += ["--threshold", threshold]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        lr.fail(PROG, f"compare.py {base} {new} exited {proc.returncode}: {last}")
    with open(report, encoding="utf-8") as f:
        return json.load(f)


def run_pair(args, folder, name, slowdown):
    load = os.getloadavg()[0]
    base, new = os.path.join(folder, f"{name}-base.json"), os.path.join(folder, f"{name}-new.json")
    seconds = [run_lattnbench(args.command + args.lattnbench_args, base, 0),
               run_lattnbench(args.command + args.lattnbench_args, new, slowdown)]
    doc = judge(base, new, os.path.join(folder, f"{name}-compare.json"), args.threshold)
    counts = doc["counts"]
    timed = sum(counts[v] for v in TIMED)
    pair = {"name": name, "slowdown_pct": slowdown, "load_1min": load, "seconds": seconds,
            "exit_status": doc["exit_status"], "counts": counts, "timed": timed,
            "geomean_ratio": doc["geomean_ratio"], "threshold_pct": doc["threshold_pct"]}
    print(f"{name}: exit {pair['exit_status']}, load {load:.2f}, {seconds[0]:.0f}+{seconds[1]:.0f} s: {doc['summary']}",
          file=sys.stderr, flush=True)
    return pair


def median_ratio(pairs):
    ratios = [p["geomean_ratio"] for p in pairs if p["geomean_ratio"] is not None]
    return f"{statistics.median(ratios):.3f}" if ratios else "-"


def table(aa, planted, slowdowns, described_args):
    out = []
    if aa:
        n, cases = len(aa), sum(p["timed"] for p in aa)
        failed = sum(p["exit_status"] != 0 for p in aa)
        flagged = sum(p["counts"]["SLOWER"] + p["counts"]["FASTER"] > 0 for p in aa)
        out += ["| A/A pairs | exit 1 | any SLOWER or FASTER | SLOWER cases | FASTER cases | UNSURE cases | median geomean NEW/BASE |",
                "|---|---|---|---|---|---|---|",
                f"| {n} | {failed} of {n} | {flagged} of {n} | {sum(p['counts']['SLOWER'] for p in aa)} of {cases} "
                f"| {sum(p['counts']['FASTER'] for p in aa)} of {cases} | {sum(p['counts']['UNSURE'] for p in aa)} of {cases} "
                f"| {median_ratio(aa)} |"]
    if planted:
        out += ([""] if out else []) + [
            "| planted | tries | caught (exit 1, most cases SLOWER) | every case SLOWER | exit 1 | median geomean NEW/BASE |",
            "|---|---|---|---|---|---|"]
        for pct in slowdowns:
            tries = [p for p in planted if p["slowdown_pct"] == pct]
            n = len(tries)
            caught = sum(p["exit_status"] == 1 and 2 * p["counts"]["SLOWER"] > p["timed"] for p in tries)
            every = sum(p["timed"] > 0 and p["counts"]["SLOWER"] == p["timed"] for p in tries)
            out.append(f"| {pct:g}% | {n} | {caught} of {n} | {every} of {n} | "
                       f"{sum(p['exit_status'] == 1 for p in tries)} of {n} | {median_ratio(tries)} |")
    pairs = aa + planted
    threshold = pairs[0]["threshold_pct"]
    out += ["", f"compare.py threshold {threshold:g}%; lattnbench arguments: `{described_args}`; "
                f"1-minute load average {min(p['load_1min'] for p in pairs):.2f}-{max(p['load_1min'] for p in pairs):.2f}"]
    return out


def main(argv):
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="gate-experiment-") as scratch:
        folder = args.keep or scratch
        os.makedirs(folder, exist_ok=True)
        aa = [run_pair(args, folder, f"aa-{i + 1}", 0) for i in range(args.pairs)]
        planted = [run_pair(args, folder, f"slow{pct:g}-{i + 1}", pct) for pct in args.slowdowns for i in range(args.tries)]
    lines = table(aa, planted, args.slowdowns, shlex.join(args.command[1:] + args.lattnbench_args))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.md:
        lr.write_text_atomic(args.md, text)
    if args.json:
        doc = {"binary": args.binary, "lattnbench_args": args.lattnbench_args, "pairs": aa + planted}
        lr.write_text_atomic(args.json, json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

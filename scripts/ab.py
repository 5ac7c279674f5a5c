#!/usr/bin/python3
"""Run two or more lattnbench binaries in turn on the same cases, round after round, and give per
case each binary's median over the rounds of its median_ms, its speed-up over the first, and the
spread of that speed-up: the interquartile range of the per-round ratios (first binary's time over
this one's in the same round). Rows are in shape order (suite, mode, dims, seq, impl).

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


def iqr(values):
    """[q1, q3] by linear interpolation between closest ranks (as lattnbench's own quartiles), or
    None for fewer than two values."""
    if len(values) < 2:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


# The row order: shape first, so scan and chunked of one shape sit together and seq rises down a
# series; absent keys (no window in a kernel case) sort first.
SHAPE_ORDER = ("suite", "mode", "backend", "dtype", "decay", "batch", "heads", "dim", "head_dim", "window",
               "chunk", "seq", "impl")


def shape_sort_key(key):
    values = lr.key_as_dict(key)
    return tuple((0, "") if values.get(k) is None else (1, values[k]) for k in SHAPE_ORDER)


def format_spread(value, spread):
    return f"{value:.3f}x" + ("" if spread is None else f" ({spread[0]:.3f}-{spread[1]:.3f})")


def main(argv):
    args = parse(argv)
    names = [shlex.join([os.path.basename(c[0]), *c[1:]]) for c in args.commands]
    if len(set(names)) < len(names):
        names = list(args.binaries)
    if len(set(names)) < len(names):  # one binary given twice: an A/A run, which says what noise is
        names = [f"{i + 1}:{b}" for i, b in enumerate(args.binaries)]
    times = {}  # case key -> binary index -> {round: median_ms}
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
                    times.setdefault(key, {}).setdefault(index, {})[round_index] = value

    cases = []
    round_ratios = {}  # (binary index, round) -> [that round's ratio for each case]
    for key in sorted(times, key=shape_sort_key):
        per = times[key]
        if len(per) < len(args.binaries):
            continue  # a case some binary did not run ok: nothing to set it against
        medians = [statistics.median(per[i].values()) for i in range(len(args.binaries))]
        ratios = {}
        for i in range(len(args.binaries)):
            rounds = sorted(set(per[0]) & set(per[i]))
            ratios[names[i]] = [per[0][r] / per[i][r] for r in rounds]
            for r in rounds:
                round_ratios.setdefault((i, r), []).append(per[0][r] / per[i][r])
        cases.append({"case": lr.key_as_dict(key), "label": labels[key],
                      "median_ms": dict(zip(names, medians)),
                      "speedup": dict(zip(names, (medians[0] / m for m in medians))),
                      "speedup_iqr": {n: iqr(ratios[n]) for n in names},
                      "rounds_speedup": ratios,
                      "rounds_ms": {names[i]: [per[i][r] for r in sorted(per[i])] for i in range(len(args.binaries))}})
    if not cases:
        lr.fail("ab.py", "no case ran ok under every binary")
    overall = {n: geomean([c["speedup"][n] for c in cases]) for n in names}
    # The geometric mean's spread: its value round by round (over the cases that round ran ok).
    rounds_overall = {n: [geomean(round_ratios[(i, r)]) for r in range(args.rounds) if (i, r) in round_ratios]
                      for i, n in enumerate(names)}
    overall_iqr = {n: iqr(rounds_overall[n]) for n in names}

    header = ["case"] + [f"{n} ms" for n in names] + [f"{n} speed-up (IQR)" for n in names[1:]]
    rows = [[c["label"]] + [f"{c['median_ms'][n]:.4g}" for n in names] +
            [format_spread(c["speedup"][n], c["speedup_iqr"][n]) for n in names[1:]] for c in cases]
    rows.append(["geometric mean"] + [""] * len(names) +
                [format_spread(overall[n], overall_iqr[n]) for n in names[1:]])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print(f"{args.rounds} round(s), each binary's median over them; speed-up = {names[0]} ms / binary ms; "
          "IQR = quartiles of the per-round ratios")
    for r in [header] + rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))
    if args.md:
        md = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        lr.write_text_atomic(args.md, "\n".join(md) + "\n")
    if args.json:
        doc = {"rounds": args.rounds, "binaries": dict(zip(names, args.binaries)),
               "lattnbench_args": args.lattnbench_args, "cases": cases, "geomean_speedup": overall,
               "geomean_speedup_iqr": overall_iqr, "rounds_geomean_speedup": rounds_overall}
        lr.write_text_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

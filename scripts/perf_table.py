#!/usr/bin/env python3
"""Markdown table of a CPU run for docs/performance.md: per case median_ms, gflops, peak_fraction,
temp_mb, rel_err, the threads-1 / threads-N time ratio (when a second run at one thread is given)
and the reference file's median for the same case (kernel and layer suites).

    scripts/perf_table.py RUN.json [--threads1 RUN1.json] [--reference ../shared/reference-results.json]
"""

import argparse
import json
import sys


def key(r):
    # A layer record's dim is the head dim in the reference file and may be the model width in ours.
    dim = r.get("head_dim") or r["dim"]
    return (r.get("suite", "kernel"), r["impl"], r["mode"], r["seq"], dim, r["batch"], r["heads"], r["chunk"],
            r.get("window"))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--threads1")
    ap.add_argument("--reference")
    args = ap.parse_args(argv)
    run = json.load(open(args.run))
    one = {key(r): r for r in json.load(open(args.threads1))["results"]} if args.threads1 else {}
    ref = {}
    if args.reference:
        for r in json.load(open(args.reference))["results"]:
            ref[key(r)] = r
    dev = run["device"]
    print(f"threads {dev.get('threads')}, sgemm peak {dev.get('sgemm_gflops', 0):.1f} GFLOP/s "
          f"(n = {dev.get('sgemm_n')} per thread), triad {dev.get('stream_gbytes_per_s', 0):.1f} GB/s, "
          f"OpenBLAS core {dev.get('blas_core')}, git {dev.get('git_revision', '')[:10]}\n")
    print("| suite | impl | mode | seq | D | median_ms | gflops | peak_fraction | temp_mb | rel_err | t1/t2 | ref_ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = sorted(run["results"], key=lambda r: (r.get("suite", "kernel"), r["seq"], key(r)[4], r["impl"], r["mode"]))
    for r in rows:
        suite, dim = r.get("suite", "kernel"), key(r)[4]
        if r.get("status") != "ok":
            print(f"| {suite} | {r['impl']} | {r['mode']} | {r['seq']} | {dim} | {r.get('status')} | | | | | | |")
            continue
        k = key(r)
        ratio = f"{one[k]['median_ms'] / r['median_ms']:.2f}" if k in one else ""
        rms = f"{ref[k]['median_ms']:.2f}" if k in ref else ""
        print(f"| {suite} | {r['impl']} | {r['mode']} | {r['seq']} | {dim} | {r['median_ms']:.3f} | {r['gflops']:.1f} | "
              f"{r.get('peak_fraction', 0):.2f} | {r['temp_mb']:.3f} | {r['rel_err']:.1e} | {ratio} | {rms} |")


if __name__ == "__main__":
    main(sys.argv[1:])

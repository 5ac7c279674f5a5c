#!/usr/bin/env python3
"""Markdown table of a CPU run for docs/performance.md: per case median_ms, gflops, peak_fraction,
temp_mb, rel_err, the threads-1 / threads-N time ratio (when a second run at one thread is given)
and the reference file's median for the same case.

    scripts/perf_table.py RUN.json [--threads1 RUN1.json] [--reference ../shared/reference-results.json]
"""

import argparse
import json
import sys


def key(r):
    return (r["impl"], r["mode"], r["seq"], r["dim"], r["batch"], r["heads"], r["chunk"])


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
            if r.get("suite") == "kernel":
                ref[key(r)] = r
    dev = run["device"]
    print(f"threads {dev.get('threads')}, sgemm peak {dev.get('sgemm_gflops', 0):.1f} GFLOP/s "
          f"(n = {dev.get('sgemm_n')} per thread), triad {dev.get('stream_gbytes_per_s', 0):.1f} GB/s, "
          f"OpenBLAS core {dev.get('blas_core')}, git {dev.get('git_revision', '')[:10]}\n")
    print("| impl | mode | seq | D | median_ms | gflops | peak_fraction | temp_mb | rel_err | t1/t2 | ref_ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = sorted(run["results"], key=lambda r: (r["seq"], r["dim"], r["impl"], r["mode"]))
    for r in rows:
        if r.get("status") != "ok":
            print(f"| {r['impl']} | {r['mode']} | {r['seq']} | {r['dim']} | {r.get('status')} | | | | | | |")
            continue
        k = key(r)
        ratio = f"{one[k]['median_ms'] / r['median_ms']:.2f}" if k in one else ""
        rms = f"{ref[k]['median_ms']:.2f}" if k in ref else ""
        print(f"| {r['impl']} | {r['mode']} | {r['seq']} | {r['dim']} | {r['median_ms']:.3f} | {r['gflops']:.1f} | "
              f"{r.get('peak_fraction', 0):.2f} | {r['temp_mb']:.3f} | {r['rel_err']:.1e} | {ratio} | {rms} |")


if __name__ == "__main__":
    main(sys.argv[1:])

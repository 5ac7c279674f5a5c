#!/usr/bin/python3
"""Markdown table of a CPU run for docs/performance.md: per case median_ms, gflops, peak_fraction,
temp_mb, rel_err, the threads-1 / threads-N time ratio (when a second run at one thread is given)
and the reference file's median for the same case (kernel and layer suites).

    scripts/perf_table.py RUN.json [--threads1 RUN1.json] [--reference ../shared/reference-results.json]

Any of the three may be a lattnbench result file or a reference-format (JAX) file; a value a
record lacks prints as '-'. A file that cannot be read, is not JSON, or is not a result file (a
Google Benchmark export from --gbench-out, say) is one line on stderr and exit status 2.
"""

import lattn_results as lr

COLUMNS = ("suite", "impl", "mode", "seq", "D", "median_ms", "gflops", "peak_fraction", "temp_mb", "rel_err",
           "t1/t2", "ref_ms")


def load(path):
    try:
        return lr.load(path)
    except lr.ResultFileError as e:
        if "no 'results' list" in str(e) and _is_gbench_export(path):
            raise lr.ResultFileError(f"{path}: a Google Benchmark export (--gbench-out), not a result file: "
                                     "give the file lattnbench wrote with --out") from None
        raise


def _is_gbench_export(path):
    import json
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "benchmarks" in doc and "context" in doc


def key(record):
    # Backend left out: the reference file's records read as jax-cpu, ours as cpu.
    return lr.case_key(record, ignore={"backend"})


def head_dim(record):
    value = record.get("head_dim")
    return value if value is not None else record.get("dim")


def fmt(value, spec):
    value = lr.number(value)
    return "-" if value is None else format(value, spec)


def header(run):
    d = run.device
    if run.is_reference:
        return f"{run.path}: {run.format_name}, {run.device_label}"
    parts = [run.format_name]
    if d.get("threads") is not None:
        parts.append(f"threads {d['threads']}")
    if lr.number(d.get("fma_gflops")) is not None:
        parts.append(f"FMA rate {d['fma_gflops']:.1f} GFLOP/s")
    if lr.number(d.get("peak_gflops")) is not None and d.get("peak_source"):
        parts.append(f"peak_fraction against the {'FMA rate' if d['peak_source'] == 'fma' else 'sgemm'}")
    if lr.number(d.get("sgemm_gflops")) is not None:
        parts.append(f"sgemm {d['sgemm_gflops']:.1f} GFLOP/s"
                     + (f" (n = {d['sgemm_n']} per thread)" if d.get("sgemm_n") is not None else ""))
    if lr.number(d.get("stream_gbytes_per_s")) is not None:
        parts.append(f"triad {d['stream_gbytes_per_s']:.1f} GB/s")
    if d.get("blas_core"):
        parts.append(f"OpenBLAS core {d['blas_core']}")
    if d.get("git_revision"):
        parts.append(f"git {str(d['git_revision'])[:10]}")
    return f"{run.path}: {run.device_label}; " + ", ".join(parts)


def variant(record):
    """The case's rule and decay where they are not the plain form's ('delta scalar', 'retnet'), else ''."""
    parts = [record.get("rule") if record.get("rule") not in (None, "additive") else None,
             record.get("decay") if record.get("decay") not in (None, "none") else None]
    return " ".join(p for p in parts if p)


def sort_key(record):
    def part(value):
        return (0, "") if value is None else (1, value) if isinstance(value, (int, float)) else (2, str(value))
    return tuple(part(v) for v in (record.get("suite"), record.get("seq"), head_dim(record), variant(record),
                                   record.get("impl"), record.get("mode")))


def rows(run, one_thread, reference, with_variant):
    one = lr.index_by_case(one_thread, ignore={"backend"}) if one_thread else {}
    ref = lr.index_by_case(reference, ignore={"backend"}) if reference else {}
    for r in sorted(run.records, key=sort_key):
        cells = [str(r.get("suite", "-")), str(r.get("impl", "-")), str(r.get("mode", "-")),
                 str(r.get("seq", "-")), str(head_dim(r) if head_dim(r) is not None else "-")]
        if with_variant:
            cells.append(variant(r) or "-")
        if r.get("status") != "ok":
            yield cells + [str(r.get("status", "-"))] + [""] * 6
            continue
        median = lr.number(r.get("median_ms"))
        single = lr.number(one[key(r)].get("median_ms")) if key(r) in one else None
        ratio = f"{single / median:.2f}" if single is not None and median else ""
        ref_ms = fmt(ref[key(r)].get("median_ms"), ".2f") if key(r) in ref else ""
        yield cells + [fmt(median, ".3f"), fmt(r.get("gflops"), ".1f"), fmt(r.get("peak_fraction"), ".2f"),
                       fmt(r.get("temp_mb"), ".3f"), fmt(r.get("rel_err"), ".1e"), ratio, ref_ms]


def main(argv):
    parser = lr.ArgumentParser(prog="perf_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("run", metavar="RUN.json")
    parser.add_argument("--threads1", metavar="RUN1.json", help="the same cases run at one thread")
    parser.add_argument("--reference", metavar="REF.json", help="the reference results file")
    args = parser.parse_args(argv)
    run = load(args.run)
    one_thread = load(args.threads1) if args.threads1 else None
    reference = load(args.reference) if args.reference else None
    # A run of several rules or decays gets a column saying which row is which.
    with_variant = any(variant(r) for r in run.records)
    columns = COLUMNS[:5] + ("variant",) + COLUMNS[5:] if with_variant else COLUMNS
    table = list(rows(run, one_thread, reference, with_variant))
    print(header(run) + "\n")
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|" + "---:|" * 2 + ("---|" if with_variant else "") + "---:|" * (len(COLUMNS) - 5))
    for cells in table:
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

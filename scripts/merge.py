#!/usr/bin/python3
"""Merge the shard files of one sharded lattnbench run into the file an unsharded run would write.

    merge.py -o OUT.json IN1.json IN2.json ... [--force]

The output is named by -o/--out, never by position: a forgotten output argument cannot make an
input the output. The merge refuses (exit 2) an output that is one of the inputs, and an existing
file unless --force.

Each input carries a top-level `shard: {"index": K, "count": N}` and the same `config` (apart
from any `shard` key), schema major version and device: for a CPU run the CPU (model and
cpu_signature), for a CUDA run the GPU model. The merge refuses (exit 2) a case that appears twice
and inputs that disagree on any of those. Records are ordered by `plan_index` when
every record carries one, else kept in input order, and `totals` and `summary` are recomputed over
them (`summary` as src/results/summary.cpp's build_summary writes it). Details: docs/compare.md.
"""

import json
import os
import sys

import lattn_results as lr


def config_without_shard(result_file):
    config = result_file.raw.get("config")
    if not isinstance(config, dict):
        return config
    return {k: v for k, v in config.items() if k != "shard"}


def gpu_of(result_file):
    """The GPU model a CUDA run's device block names ('none' where it found none); None for a CPU run."""
    if result_file.device.get("backend") != "cuda":
        return None
    return repr(result_file.device.get("gpu") or "none")


def check_compatible(files):
    first = files[0]
    for f in files[1:]:
        if f.schema_major != first.schema_major:
            raise lr.ResultFileError(f"{f.path}: format {f.format_name} does not match {first.path}'s "
                                     f"{first.format_name}")
        if config_without_shard(f) != config_without_shard(first):
            raise lr.ResultFileError(f"{f.path}: config differs from {first.path}'s: not shards of one run")
        if gpu_of(f) != gpu_of(first):
            # A CUDA run's times are its GPU's: shards on two GPU models are two devices, whatever
            # their host CPUs (and a shard that found no GPU ran nothing).
            raise lr.ResultFileError(f"{f.path}: GPU {gpu_of(f)} differs from {first.path}'s {gpu_of(first)}: "
                                     f"not shards of one device")
        if not f.same_device(first):
            raise lr.ResultFileError(f"{f.path}: device {f.fingerprint} differs from {first.path}'s "
                                     f"{first.fingerprint}")


def check_shards(files):
    """Refuse shards of different splits or the same shard twice; warn about missing shards."""
    seen, counts = {}, set()
    for f in files:
        shard = f.raw.get("shard")
        if shard is None:
            continue
        index, count = (shard.get(k) if isinstance(shard, dict) else None for k in ("index", "count"))
        if not (isinstance(index, int) and isinstance(count, int) and 1 <= index <= count):
            raise lr.ResultFileError(f"{f.path}: shard is not {{\"index\": K, \"count\": N}} with 1 <= K <= N (as --shard K/N)")
        if index in seen:
            raise lr.ResultFileError(f"{f.path}: shard {index} of {count} is also {seen[index]}")
        seen[index] = f.path
        counts.add(count)
    if len(counts) > 1:
        raise lr.ResultFileError(f"inputs come from different splits: shard counts {sorted(counts)}")
    if counts:
        missing = sorted(set(range(1, counts.pop() + 1)) - set(seen))
        if missing:
            print(f"merge.py: warning: shards {missing} are missing; the merged file is partial",
                  file=sys.stderr)


def merged_records(files):
    """The raw records of all inputs, each case once, in plan order when the plan order is known."""
    where, merged = {}, []
    for f in files:
        for raw, record in zip(f.raw["results"], f.records):
            key = lr.case_key(record)
            if key in where:
                raise lr.ResultFileError(f"{f.path}: case '{lr.describe_case(record)}' "
                                         f"is also in {where[key]}")
            where[key] = f.path
            merged.append((raw, record))
    plan_indices = [r.get("plan_index") for r, _ in merged]
    if all(isinstance(i, int) and not isinstance(i, bool) for i in plan_indices):
        if len(set(plan_indices)) != len(plan_indices):
            raise lr.ResultFileError("two different cases carry the same plan_index: not shards of one plan")
        merged.sort(key=lambda pair: pair[0]["plan_index"])
    return merged


# src/results/summary.cpp: the keys that make two records the same shape, apart from impl (and, for the
# crossovers, seq).
SUMMARY_SHAPE_KEYS = ("suite", "mode", "backend", "dtype", "decay", "rule", "gate_norm", "normalize_keys",
                      "batch", "heads", "dim", "chunk", "window", "head_dim", "seq")


def _sorted_object(pairs):
    # lattnbench writes JSON objects with their keys in byte order (nlohmann::json's std::map).
    return dict(sorted(dict(pairs).items()))


def _shape_of(record, with_seq):
    return _sorted_object((k, record[k]) for k in SUMMARY_SHAPE_KEYS if k in record and (with_seq or k != "seq"))


def _shape_text(shape):
    return json.dumps(shape, sort_keys=True, separators=(",", ":"))


def build_summary(results):
    """The `summary` block lattnbench writes over `results` (raw records), ported from
    src/results/summary.cpp's build_summary: per shape and mode (every record with a median_ms, skipped ones
    left out) the fastest impl against the next, then per series (the shape without seq) the
    winner at each seq and where it changes, and the records that did not pass (lr.passed) in
    `not_compared`. Same keys, same order."""
    by_shape, shape_order, not_compared = {}, [], []
    for r in results:
        if not lr.passed(r):
            not_compared.append(_sorted_object({**_shape_of(r, True), "impl": r.get("impl"),
                                                "status": r.get("status", "ok"), "reason": lr.why_not_passed(r)}))
            continue
        key = _shape_text(_shape_of(r, True))
        if key not in by_shape:
            shape_order.append(key)
        by_shape.setdefault(key, []).append(r)

    comparisons, by_series, series_order = [], {}, []
    for key in shape_order:
        records = by_shape[key]
        if len(records) < 2:
            continue
        records = sorted(records, key=lambda r: r["median_ms"])
        best, other = records[0], records[1]
        c = _sorted_object({
            **_shape_of(best, True),
            "fastest": best.get("impl"), "other": other.get("impl"),
            "fastest_median_ms": best["median_ms"], "other_median_ms": other["median_ms"],
            "speedup": float(other["median_ms"]) / max(float(best["median_ms"]), 1e-300),
            # null where the impl's scratch was not counted, as in its record
            "fastest_temp_mb": lr.number(best.get("temp_mb")), "other_temp_mb": lr.number(other.get("temp_mb")),
        })
        comparisons.append(c)
        series = _shape_text(_shape_of(best, False))
        if series not in by_series:
            series_order.append(series)
        by_series.setdefault(series, []).append(c)

    crossovers = []
    for series in series_order:
        points = by_series[series]
        if len(points) < 2:
            continue
        points = sorted(points, key=lambda c: c["seq"])
        entry = dict(json.loads(series))
        entry["winners"] = [{"fastest": p["fastest"], "seq": p["seq"]} for p in points]
        entry["changes"] = [{"after_seq": a["seq"], "by_seq": b["seq"], "from": a["fastest"], "to": b["fastest"]}
                            for a, b in zip(points, points[1:]) if a["fastest"] != b["fastest"]]
        crossovers.append(_sorted_object(entry))
    return {"comparisons": comparisons, "crossovers": crossovers, "not_compared": not_compared}


def merge(files, names):
    check_compatible(files)
    check_shards(files)
    records = merged_records(files)
    out = {k: v for k, v in files[0].raw.items() if k != "shard"}
    if isinstance(out.get("config"), dict):
        out["config"] = config_without_shard(files[0])
    out["results"] = [raw for raw, _ in records]
    # Each shard lists the identity keys of its own cases: the merged file lists them all.
    declared = [k for f in files for k in f.raw.get("identity_keys", [])]
    if declared:
        out["identity_keys"] = list(dict.fromkeys(declared))
    out["totals"] = lr.totals([record for _, record in records])
    # Each shard's summary covers its own cases: the merged file's is recomputed over all of them.
    out["summary"] = build_summary(out["results"])
    out["merged_from"] = names
    return out


def check_output(out, inputs, force):
    """The output is never an input, and an existing file is replaced only with --force."""
    if out is None:
        raise lr.ResultFileError("no output named: give it with -o OUT.json (the inputs are never written)")
    for path in inputs:
        same_path = os.path.realpath(out) == os.path.realpath(path)
        if same_path or (os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path)):
            raise lr.ResultFileError(f"-o {out}: is also an input; name a new file for the merge")
    if os.path.isdir(out):
        raise lr.ResultFileError(f"-o {out}: is a folder, expected a file name")
    if os.path.lexists(out) and not force:
        raise lr.ResultFileError(f"-o {out}: exists; give --force to replace it")


def main(argv):
    parser = lr.ArgumentParser(description="Merge the shard files of one lattnbench run.")
    parser.add_argument("-o", "--out", metavar="OUT.json", help="the merged file (never one of the inputs)")
    parser.add_argument("--force", action="store_true", help="replace OUT.json when it exists")
    parser.add_argument("inputs", metavar="IN.json", nargs="+")
    args = parser.parse_args(argv)
    check_output(args.out, args.inputs, args.force)
    files = [lr.load(path) for path in args.inputs]
    merged = merge(files, [os.path.basename(path) for path in args.inputs])
    lr.write_text_atomic(args.out, json.dumps(merged, indent=2) + "\n")
    totals = merged["totals"]
    print(f"{args.out}: {totals['cases']} cases ({totals['ok']} ok, {totals['failed']} failed, "
          f"{totals['skipped']} skipped) from {len(files)} files")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

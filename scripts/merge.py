#!/usr/bin/python3
"""Merge the shard files of one sharded lattnbench run into the file an unsharded run would write.

    merge.py OUT.json IN1.json IN2.json ...

Each input carries a top-level `shard: {"index": K, "count": N}` and the same `config` (apart
from any `shard` key), schema major version and device. The merge refuses (exit 2) a case that
appears twice and inputs that disagree on any of those. Records are ordered by `plan_index` when
every record carries one, else kept in input order. Details: docs/compare.md.
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


def check_compatible(files):
    first = files[0]
    for f in files[1:]:
        if f.schema_major != first.schema_major:
            raise lr.ResultFileError(f"{f.path}: format {f.format_name} does not match {first.path}'s "
                                     f"{first.format_name}")
        if config_without_shard(f) != config_without_shard(first):
            raise lr.ResultFileError(f"{f.path}: config differs from {first.path}'s: not shards of one run")
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


def merge(files, names):
    check_compatible(files)
    check_shards(files)
    records = merged_records(files)
    out = {k: v for k, v in files[0].raw.items() if k != "shard"}
    if isinstance(out.get("config"), dict):
        out["config"] = config_without_shard(files[0])
    out["results"] = [raw for raw, _ in records]
    out["totals"] = lr.totals([record for _, record in records])
    out["merged_from"] = names
    return out


def main(argv):
    parser = lr.ArgumentParser(description="Merge the shard files of one lattnbench run.")
    parser.add_argument("out", metavar="OUT.json")
    parser.add_argument("inputs", metavar="IN.json", nargs="+")
    args = parser.parse_args(argv)
    files = [lr.load(path) for path in args.inputs]
    merged = merge(files, [os.path.basename(path) for path in args.inputs])
    lr.write_text_atomic(args.out, json.dumps(merged, indent=2) + "\n")
    totals = merged["totals"]
    print(f"{args.out}: {totals['cases']} cases ({totals['ok']} ok, {totals['failed']} failed, "
          f"{totals['skipped']} skipped) from {len(files)} files")
    return 0


if __name__ == "__main__":
    lr.run_cli(main)

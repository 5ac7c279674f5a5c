#!/usr/bin/env bash
# google/benchmark's own tools/compare.py (Debian's libbenchmark-tools) reads two of lattnbench's
# --gbench-out exports and runs its U test on them: every case has enough repetitions for it.
# Exits 77 (CTest: skipped) where the tool is not installed. Usage: gbench_compare.sh LATTNBENCH PYTHON3
set -euo pipefail
compare=/usr/share/benchmark/compare.py
[[ -f $compare ]] || { echo "SKIPPED: no $compare (Debian package libbenchmark-tools)"; exit 77; }
binary=$1
python=${2:-python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# --max-noise 0: all 9 samples, the repetitions compare.py asks for, though a quiet machine would
# meet the noise target at 5.
for run in a b; do
  "$binary" --suite kernel --seq 64 --dim 8 --batch 1 --heads 1 --impl scan,chunked --mode fwd --reps 9 --max-noise 0 \
    --warmup 1 --min-sample-ms 1 --quiet --out "$dir/$run.json" --gbench-out "$dir/$run-gbench.json" >/dev/null
done
"$python" "$compare" benchmarks "$dir/a-gbench.json" "$dir/b-gbench.json" | tee "$dir/report.txt"
# One U-test row per case (compare.py prints "<name>_pvalue" rows when both sides have the
# repetitions it asks for), and no "unreliable" warning about too few of them.
rows=$(grep -c "_pvalue" "$dir/report.txt" || true)
[[ $rows -eq 2 ]] || { echo "expected a U test for each of the 2 cases, got $rows"; exit 1; }
if grep -q "Results unreliable" "$dir/report.txt"; then echo "compare.py found too few repetitions"; exit 1; fi

#!/usr/bin/env bash
# scripts/slurm-sweep.sh on a real Slurm: a private one-node cluster (cluster.sh), started as root
# without systemd and stopped at the end whatever happens. Against it:
#   0. an unknown partition and a bad --time: sbatch refuses, the script says so in one line and
#      leaves no job queued; a --binary that does not run: the build job fails, no shard runs, and
#      the merge job's one line says so;
#   1. a sweep of 3 shards (build job with --binary, array, merge) whose shard 1 is requeued
#      (`scontrol requeue`, as a preemption does) after its first case: merged.json must hold
#      exactly the cases and config of an unsharded run of the same binary, each once, with no
#      journal left, and shard 1 must have resumed from its journal;
#   2. a sweep of 2 shards submitted held with every option a cluster needs (partition,
#      constraint, account, time, --gpus-per-task), which must be on the jobs; then shard 2 is
#      given a bad --out (a folder where its result file goes) and released: the merge job must
#      fail, and the script's last line say that shard 2 is missing and why.
# Exits 77 (CTest: skipped) with the reason where no cluster can start: not root, or Slurm or munge
# not installed (scripts/setup.sh --test-tools).
#
#   slurm_sweep_test.sh LATTNBENCH [PYTHON]
set -euo pipefail
bin=$(realpath "$1")
python=${2:-/usr/bin/python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
sweep=$root/scripts/slurm-sweep.sh
# shellcheck source=cluster.sh source-path=SCRIPTDIR
source "$here/cluster.sh"
# The daemons are in sbin, which the PATH of a test runner need not hold.
PATH=$PATH:/usr/sbin:/sbin

if reason=$(cluster_skip_reason); then
  echo "SKIPPED: $reason"
  exit 77
fi
# The kernels' default choices, as in every other test (tests/CMakeLists.txt): the jobs inherit it.
export LATTN_TUNING=${LATTN_TUNING:-default}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lattn-slurm-test.XXXXXX")
chmod 755 "$tmp"
pids=()
failure=""
finish() {
  local status=$?
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((status != 0)); then
    local f
    for f in "$tmp"/a/*.log "$tmp"/b/*.log "$tmp"/*.out; do
      [[ -f $f ]] && { echo "--- $f"; tail -n 20 "$f"; }
    done
    [[ -f $tmp/cluster/log/slurmctld.log ]] && { echo "--- slurmctld.log (end)"; tail -n 20 "$tmp/cluster/log/slurmctld.log"; }
  fi
  cluster_stop || status=1
  rm -rf "$tmp"
  if ((status == 0)); then
    echo "slurm_sweep_test: passed in ${SECONDS} s"
  else
    echo "slurm_sweep_test: FAILED after ${SECONDS} s: ${failure:-exit $status}"
  fi
  exit "$status"
}
trap finish EXIT
trap 'failure=${failure:-"SIGTERM (over ${limit} s?)"}; exit 143' TERM
trap 'failure="SIGINT"; exit 130' INT
# A watchdog well inside CTest's TIMEOUT (300 s), whose kill would leave no time to stop the cluster.
limit=240
(
  sleep "$limit" &
  trap 'kill $! 2>/dev/null; exit 0' TERM
  wait $!
  kill -TERM $$
) &
pids+=($!)

fail() {
  failure=$*
  exit 1
}

# Polls the command after it until it succeeds, for at most $1 seconds; $2 says what it waits for.
wait_until() {
  local seconds=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    ((SECONDS < deadline)) || fail "waited $seconds s for $what"
    sleep 0.1
  done
}

# A field of `scontrol show job`: job_field JOB Partition.
job_field() {
  scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# The ids submit prints: "build B, shards A (1-N), merge M: DIR".
job_ids() {
  sed -n 's/^build \([0-9]*\), shards \([0-9]*\) (1-[0-9]*), merge \([0-9]*\): .*/\1 \2 \3/p' "$1"
}
submitted() { [[ -f $1 && -n $(job_ids "$1") ]]; }

cluster_start "$tmp/cluster"
echo "cluster up after ${SECONDS} s (SLURM_CONF=$SLURM_CONF)"

# A small plan, each case a few tenths of a second, journaled one by one (no interleaving), so
# that a requeue lands between two cases of a shard.
config=$tmp/sweep.yaml
cat >"$config" <<'EOF'
suites: [kernel]
threads: 1
warmup: 0
reps: 3
min_samples: 3
max_noise: 0
interleave: false
min_sample_ms: 150
kernel:
  batch: 1
  heads: 1
  chunk: 16
  seq: [16, 32, 48]
  dim: [8, 16]
  impl: [scan, chunked]
  mode: fwd
EOF

## 0. What sbatch refuses: one line, and nothing left queued.
no_jobs() { [[ -z $(squeue -h -o %i) ]]; }
status=0
"$sweep" --binary "$bin" --out "$tmp/refused" --partition nosuch "$config" 3 >"$tmp/refused.out" 2>&1 || status=$?
[[ $status == 1 && $(tail -n 1 "$tmp/refused.out") == "slurm-sweep: sbatch refused the build job" ]] ||
  fail "an unknown partition: exit $status, $(tail -n 1 "$tmp/refused.out")"
grep -q "^sbatch: error: invalid partition specified: nosuch" "$tmp/refused.out" || fail "no sbatch error line for the partition"
[[ ! -e $tmp/refused ]] || fail "a sweep refused at its first job left its folder"
status=0
"$sweep" --binary "$bin" --out "$tmp/refused" --time bogus "$config" 3 >"$tmp/refused.out" 2>&1 || status=$?
[[ $status == 1 && $(tail -n 1 "$tmp/refused.out") =~ ^"slurm-sweep: sbatch refused the shard job (cancelled the jobs before it: "[0-9]+")"$ ]] ||
  fail "a bad --time: exit $status, $(tail -n 1 "$tmp/refused.out")"
wait_until 30 "the build job of the refused sweep to be cancelled" no_jobs
# A binary that does not run on the node: the build job fails, the array is cancelled
# (--kill-on-invalid-dep), and the merge job, which runs all the same, says so; --wait returns.
status=0
"$sweep" --wait --binary /bin/false --out "$tmp/nobuild" "$config" 2 >"$tmp/nobuild.out" 2>&1 || status=$?
line=$(grep '^slurm-sweep: no shard ran' "$tmp/nobuild.out" || true)
expected='^slurm-sweep: no shard ran: the build job failed \(build-[0-9]+\.log: slurm-sweep: build: /bin/false does not run on [^ ]+ \(exit 1\)\)$'
[[ $status == 1 && $line =~ $expected ]] ||
  fail "a binary that does not run: exit $status, '$line'"
wait_until 30 "the failed build's sweep to leave the queue" no_jobs

# The unsharded run of the same plan and binary, beside the sweep.
"$bin" --config "$config" --out "$tmp/unsharded.json" --quiet >"$tmp/unsharded.out" 2>&1 &
unsharded_pid=$!
pids+=("$unsharded_pid")

## 1. A sweep with a requeue.
"$sweep" --wait --binary "$bin" --out "$tmp/a" --time 00:10:00 "$config" 3 >"$tmp/a.out" 2>&1 &
sweep_a=$!
pids+=("$sweep_a")
wait_until 30 "the first sweep's job ids" submitted "$tmp/a.out"
read -r build_a array_a merge_a < <(job_ids "$tmp/a.out")
journal=$tmp/a/shard-1-of-3.json.journal.jsonl
journal_cases() { [[ -f $journal ]] && (($(wc -l <"$journal") >= 2)); }
wait_until 90 "shard 1's first journaled case" journal_cases
[[ $(job_field "${array_a}_1" JobState) == RUNNING ]] || fail "shard 1 was not running when its first case was journaled"
scontrol requeue "${array_a}_1" || fail "scontrol requeue ${array_a}_1 refused"
echo "requeued shard 1 (job ${array_a}_1) after ${SECONDS} s, with $(($(wc -l <"$journal") - 1)) case(s) in its journal"
# Slurm holds a requeued job until a begin time some two minutes on (it lets the node settle);
# the test moves it to now rather than wait.
requeued_pending() { [[ $(job_field "${array_a}_1" JobState) == PENDING ]]; }
wait_until 60 "shard 1 pending again after its requeue" requeued_pending
scontrol update JobId="${array_a}_1" StartTime=now || fail "scontrol update JobId=${array_a}_1 StartTime=now refused"

status=0
wait "$sweep_a" || status=$?
[[ $status == 0 ]] || fail "the first sweep (--wait) exited $status: $(tail -n 1 "$tmp/a.out")"
grep -q "^$tmp/a/merged.json: 12 cases (12 ok, 0 failed, 0 skipped) from 3 files$" "$tmp/a.out" ||
  fail "the first sweep's last line is not the merge's: $(tail -n 1 "$tmp/a.out")"
[[ $(job_field "${array_a}_1" Restarts) == 1 ]] || fail "shard 1 was not restarted once: Restarts=$(job_field "${array_a}_1" Restarts)"
grep -Eq "^slurm-sweep: shard 1 of 3 resumes from its journal \([1-9][0-9]* cases done; restart 1\)" "$tmp/a/shard-1-of-3.log" ||
  fail "shard 1's log does not say it resumed from its journal"
for k in 2 3; do
  [[ $(job_field "${array_a}_$k" Restarts) == 0 ]] || fail "shard $k restarted"
done
for job in "$build_a" "$merge_a"; do
  [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
done
cmp -s "$bin" "$tmp/a/lattnbench" || fail "the shards' binary is not the one given to --binary"
left=$(find "$tmp/a" -maxdepth 1 \( -name '*journal*' -o -name '*.lock' -o -name '*.tmp' -o -name '*partial*' \) -printf '%f ')
[[ -z $left ]] || fail "left in the sweep's folder: $left"

wait "$unsharded_pid" || fail "the unsharded run failed: $(tail -n 3 "$tmp/unsharded.out")"
"$python" - "$root/scripts" "$tmp/unsharded.json" "$tmp/a/merged.json" <<'EOF' || fail "merged.json is not the unsharded run's plan"
import json, sys
sys.path.insert(0, sys.argv[1])
import lattn_results as lr
whole, merged = lr.load(sys.argv[2]), lr.load(sys.argv[3])
def cases(f):
    return [(r.get("plan_index"), lr.case_key(r)) for r in f.records]
problems = []
if merged.raw["config"] != whole.raw["config"]:
    problems.append("the config differs")
if cases(merged) != cases(whole):
    problems.append(f"the cases differ: {cases(merged)} against {cases(whole)}")
if len({k for _, k in cases(merged)}) != len(merged.records):
    problems.append("a case is there twice")
if any(r["status"] != "ok" for r in merged.records):
    problems.append("a case did not pass")
if "shard" in merged.raw or sorted(merged.raw["merged_from"]) != [f"shard-{k}-of-3.json" for k in (1, 2, 3)]:
    problems.append(f"not merged from the 3 shards: {merged.raw.get('merged_from')}")
for key in ("lattnbench_version", "git_revision", "cpu_signature"):
    if merged.device.get(key) != whole.device.get(key):
        problems.append(f"device {key}: {merged.device.get(key)} against {whole.device.get(key)}")
if problems:
    sys.exit("; ".join(problems))
print(f"merged.json: the unsharded run's {len(whole.records)} cases and config, each once")
EOF

## 2. A held sweep with a cluster's options, then a shard that fails.
"$sweep" --wait --binary "$bin" --out "$tmp/b" --partition spare --constraint lattn_test --account lattn-ci \
  --time 00:07:00 --gpus-per-task 1 --sbatch=--hold "$config" 2 >"$tmp/b.out" 2>&1 &
sweep_b=$!
pids+=("$sweep_b")
wait_until 30 "the second sweep's job ids" submitted "$tmp/b.out"
read -r build_b array_b merge_b < <(job_ids "$tmp/b.out")
for job in "$build_b" "$array_b" "$merge_b"; do
  for expected in Partition=spare Features=lattn_test Account=lattn-ci Reason=JobHeldUser; do
    [[ $(job_field "$job" "${expected%%=*}") == "${expected#*=}" ]] ||
      fail "job $job: ${expected%%=*}=$(job_field "$job" "${expected%%=*}"), expected ${expected#*=}"
  done
done
[[ $(job_field "$array_b" TimeLimit) == 00:07:00 ]] || fail "the shards' TimeLimit is $(job_field "$array_b" TimeLimit)"
for job in "$build_b" "$array_b"; do
  [[ $(job_field "$job" TresPerTask) == gres:gpu:1 ]] || fail "job $job: TresPerTask=$(job_field "$job" TresPerTask)"
done
[[ -z $(job_field "$merge_b" TresPerTask) ]] || fail "the merge job asks for a GPU"
# Shard 2's --out is made a folder: lattnbench refuses it (exit 2), the other shard runs.
mkdir "$tmp/b/shard-2-of-2.json"
scontrol release "$build_b" "$array_b" "$merge_b"

status=0
wait "$sweep_b" || status=$?
[[ $status == 1 ]] || fail "the sweep with a failed shard exited $status, expected 1"
line=$(grep '^slurm-sweep: shard' "$tmp/b.out" | tail -n 1)
[[ $line == "slurm-sweep: shard 2 of 2 missing (shard-2-of-2.log: lattnbench: error: --out: '$tmp/b/shard-2-of-2.json' is a folder, expected a file name); shard 1 merged into merged-partial.json" ]] ||
  fail "the missing shard's line: '$line'"
[[ $(job_field "$merge_b" JobState) == FAILED ]] || fail "the merge job ended $(job_field "$merge_b" JobState)"
[[ ! -e $tmp/b/merged.json ]] || fail "a merged.json was written with a shard missing"
"$python" - "$root/scripts" "$tmp/b/shard-1-of-2.json" "$tmp/b/merged-partial.json" <<'EOF' || fail "merged-partial.json is not shard 1's cases"
import sys
sys.path.insert(0, sys.argv[1])
import lattn_results as lr
shard, partial = lr.load(sys.argv[2]), lr.load(sys.argv[3])
if [lr.case_key(r) for r in partial.records] != [lr.case_key(r) for r in shard.records]:
    sys.exit("its cases are not shard 1's")
if partial.raw["merged_from"] != ["shard-1-of-2.json"]:
    sys.exit(f"merged from {partial.raw['merged_from']}")
EOF
echo "the failed shard: $line"

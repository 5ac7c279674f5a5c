#!/usr/bin/env bash
# Slurm: build lattnbench once, run the sweep as a job array on that one binary (one shard per
# task), then merge the shards. Run it from the repository on a login node; it submits three jobs
# and prints their ids:
#   docs/examples/lattnbench-slurm.sh configs/default.yaml 8
# Results go to results/slurm-<UTC time>/ (shard-K-of-N.json, their logs, merged.json), the binary
# to build-slurm-<UTC time>/, both on the shared file system.
#
# Nothing here installs packages or uses sudo: the compiler, CMake and libraries scripts/setup.sh
# lists must already be on the nodes (the cluster's image or its modules; load them in
# LATTN_SLURM_SETUP, e.g. LATTN_SLURM_SETUP='module load gcc cmake openblas').
# merge.py joins shards only when every one ran on the same CPU (its cpu_signature): keep the
# array on one partition of identical nodes (LATTN_SLURM_ARGS='--partition=... --constraint=...').
set -euo pipefail

submit() {
  local config=${1:-configs/default.yaml} count=${2:-8}
  local root stamp build_dir out_dir setup build array merge
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  build_dir=$root/build-slurm-$stamp
  out_dir=$root/results/slurm-$stamp
  setup=${LATTN_SLURM_SETUP:-true}
  [[ $config = /* ]] || config=$root/$config
  [[ -f $config ]] || { echo "lattnbench-slurm: no config $config" >&2; exit 2; }
  mkdir -p "$out_dir"
  read -r -a extra <<<"${LATTN_SLURM_ARGS:-}"

  # 1. One build, on a compute node (same CPU as the shards: -march=native), before any shard.
  build=$(sbatch --parsable "${extra[@]}" --job-name=lattnbench-build --nodes=1 --time=00:30:00 \
    --output="$out_dir/build-%j.log" \
    --wrap "set -e; $setup; LATTN_BUILD_DIR='$build_dir' LATTN_BUILD_TARGET=lattnbench '$root/scripts/build.sh'")
  # 2. The shards, each on a node of its own, all running the binary built above.
  array=$(sbatch --parsable "${extra[@]}" --dependency="afterok:$build" --array="1-$count" \
    --job-name=lattnbench --nodes=1 --exclusive --requeue --time=01:00:00 \
    --output="$out_dir/shard-%a-of-$count.log" \
    --export="ALL,LATTN_SLURM_STAGE=shard,LATTN_ROOT=$root,LATTN_BIN=$build_dir/lattnbench,LATTN_CONFIG=$config,LATTN_OUT_DIR=$out_dir,LATTN_SLURM_SETUP=$setup" \
    "$root/docs/examples/lattnbench-slurm.sh")
  # 3. The merge, once every shard has ended (a failed shard leaves a partial merge and a warning).
  merge=$(sbatch --parsable "${extra[@]}" --dependency="afterany:$array" --job-name=lattnbench-merge \
    --nodes=1 --time=00:10:00 --output="$out_dir/merge-%j.log" \
    --wrap "set -e; $setup; cd '$root'; scripts/merge.py -o '$out_dir/merged.json' '$out_dir'/shard-*-of-$count.json")
  echo "build $build, shards $array (1-$count), merge $merge: $out_dir"
}

shard() {
  local index=${SLURM_ARRAY_TASK_ID:?run through the submit step}
  local count=${SLURM_ARRAY_TASK_COUNT:?run through the submit step}
  local out=$LATTN_OUT_DIR/shard-$index-of-$count.json
  local journal=$out.journal.jsonl
  eval "$LATTN_SLURM_SETUP"
  cd "$LATTN_ROOT"
  # A requeued task (preemption, node failure) continues from its journal instead of starting over.
  local resume=()
  [[ -f $journal ]] && resume=(--resume "$journal")
  srun "$LATTN_BIN" --config "$LATTN_CONFIG" --shard "$index/$count" --out "$out" --quiet "${resume[@]}"
}

case ${LATTN_SLURM_STAGE:-submit} in
  submit) submit "$@" ;;
  shard) shard ;;
  *) echo "lattnbench-slurm: unknown LATTN_SLURM_STAGE ${LATTN_SLURM_STAGE}" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Slurm job array: one shard of the sweep per array task, then a dependent job merges them.
#   sbatch --array=1-8 docs/examples/lattnbench-slurm.sh configs/default.yaml
#   sbatch --dependency=afterany:<array job id> --wrap \
#     "scripts/merge.py results/merged.json results/shard-*-of-8.json"
#SBATCH --job-name=lattnbench
#SBATCH --nodes=1
#SBATCH --exclusive          # timings need the node to themselves
#SBATCH --time=01:00:00
#SBATCH --output=results/slurm-%A_%a.log
set -euo pipefail
config=${1:-configs/default.yaml}
count=${SLURM_ARRAY_TASK_COUNT:?run as a job array: sbatch --array=1-N}
index=${SLURM_ARRAY_TASK_ID:?}
out=results/shard-${index}-of-${count}.json
journal=$out.journal.jsonl
# A requeued task (preemption, node failure) continues from its journal instead of starting over.
resume=()
[[ -f $journal ]] && resume=(--resume "$journal")
srun scripts/run.sh --config "$config" --shard "$index/$count" --out "$out" --quiet "${resume[@]}"

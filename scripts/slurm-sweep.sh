#!/usr/bin/env bash
# A lattnbench sweep on a Slurm cluster: one build job, a job array that runs the binary it made
# (one shard per task, `--shard K/N`), and a merge job once the array has ended. Run it on a login
# node from the repository; it submits the three jobs, prints their ids and returns:
#
#   scripts/slurm-sweep.sh [OPTIONS] CONFIG SHARDS [-- LATTNBENCH_ARGS...]
#
#   --out DIR            the sweep's folder on the shared file system, new or empty (default
#                        results/slurm-<UTC time>): the binary the shards run, the build tree,
#                        shard-K-of-N.json, every job's log, merged.json
#   --binary PATH        no build: the build job checks that this lattnbench runs on a compute node
#                        and copies it into DIR (a binary built on the same kind of node: -march=native)
#   --partition NAME, --constraint FEATURES, --account NAME
#                        passed to every job: keep the sweep on identical nodes, since merge.py joins
#                        only shards run on one CPU (its cpu_signature), or on one GPU model
#   --time LIMIT         each shard's time limit (default 01:00:00)
#   --build-time LIMIT   the build job's (default 01:00:00)
#   --gpus-per-task N    a CUDA sweep (config `backend: cuda`): each shard, and the build job that
#                        checks the binary against the config, gets N GPUs
#   --setup COMMAND      run first in every job, e.g. 'module load gcc cmake openblas'
#   --sbatch ARG         one more sbatch option for every job (repeatable: --sbatch=--qos=high)
#   --wait               stay until the merge job ends; exit 0 when every shard was merged, 1 when
#                        not (the merge log's last line, printed, says which shard is missing)
#   LATTNBENCH_ARGS      given to every shard after --config (overrides, --filter, --backend ...)
#
# A shard task that is requeued (preemption, node failure, `scontrol requeue`) starts again from
# its journal (`--resume`): the cases it had finished are kept and not run again. The merge job
# merges the shards into merged.json when all of them finished; when one is missing (its task
# failed, or was cancelled or timed out with its journal left), it merges the others into
# merged-partial.json, prints one line naming the missing shards and why, and fails. A job sbatch
# refuses ends the script with one line, the jobs queued before it cancelled.
#
# Nothing here installs packages or uses sudo: the compiler, CMake and libraries scripts/setup.sh
# lists must already be on the nodes (the cluster's image, or modules loaded by --setup).
# tests/slurm/slurm_sweep_test.sh runs it on a private one-node cluster (docs/ci.md).
set -euo pipefail

me=slurm-sweep
# Slurm runs a batch script from a copy in its spool folder: the jobs learn the repository's
# place from the sweep's settings, not from their own path.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage_error() {
  echo "$me: $*" >&2
  exit 2
}

# The sweep's settings, for the jobs: written once by submit, read by every stage.
write_settings() {
  {
    printf 'root=%q\n' "$root"
    printf 'config=%q\n' "$config"
    printf 'count=%q\n' "$count"
    printf 'binary=%q\n' "$binary"
    printf 'setup=%q\n' "$setup"
    printf 'lattnbench_args=('
    ((${#lattnbench_args[@]} == 0)) || printf '%q ' "${lattnbench_args[@]}"
    printf ')\n'
  } >"$out_dir/sweep.settings"
}

submit() {
  local out_dir="" binary="" setup=true time=01:00:00 build_time=01:00:00 gpus="" wait=0
  local -a common=() lattnbench_args=() positional=()
  while (($#)); do
    case $1 in
      --) shift; lattnbench_args=("$@"); break ;;
      --out=* | --binary=* | --partition=* | --constraint=* | --account=* | --time=* | --build-time=* | \
        --gpus-per-task=* | --setup=* | --sbatch=*)
        set -- "${1%%=*}" "${1#*=}" "${@:2}"
        continue ;;
      --out | --binary | --partition | --constraint | --account | --time | --build-time | --gpus-per-task | \
        --setup | --sbatch)
        (($# >= 2)) || usage_error "$1 needs a value"
        case $1 in
          --out) out_dir=$2 ;;
          --binary) binary=$2 ;;
          --partition | --constraint | --account) common+=("$1=$2") ;;
          --time) time=$2 ;;
          --build-time) build_time=$2 ;;
          --gpus-per-task)
            [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "--gpus-per-task: expected a positive whole number, got '$2'"
            gpus=$2 ;;
          --setup) setup=$2 ;;
          --sbatch) common+=("$2") ;;
        esac
        shift 2 ;;
      --wait) wait=1; shift ;;
      -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$root/scripts/slurm-sweep.sh"; exit 0 ;;
      -*) usage_error "unknown option '$1' (see --help)" ;;
      *) positional+=("$1"); shift ;;
    esac
  done
  ((${#positional[@]} == 2)) || usage_error "expected CONFIG SHARDS (see --help), got ${#positional[@]} arguments"
  local config=${positional[0]} count=${positional[1]}
  [[ $count =~ ^[1-9][0-9]*$ ]] || usage_error "SHARDS: expected a positive whole number, got '$count'"
  [[ $config = /* ]] || config=$PWD/$config
  [[ -f $config ]] || usage_error "CONFIG: no file $config"
  if [[ -n $binary ]]; then
    [[ $binary = /* ]] || binary=$PWD/$binary
    [[ -f $binary && -x $binary ]] || usage_error "--binary: $binary is not an executable file"
  fi
  command -v sbatch >/dev/null || usage_error "no sbatch on PATH: run this on a Slurm login node"
  out_dir=${out_dir:-$root/results/slurm-$(date -u +%Y%m%dT%H%M%SZ)}
  [[ $out_dir = /* ]] || out_dir=$PWD/$out_dir
  # A folder of an earlier sweep would mix its shards into this one's merge.
  if [[ -e $out_dir ]]; then
    [[ -d $out_dir ]] || usage_error "--out: $out_dir is not a folder"
    [[ -z $(ls -A "$out_dir") ]] || usage_error "--out: $out_dir is not empty (an earlier sweep's?): name a new folder"
  fi
  mkdir -p "$out_dir"
  write_settings

  local -a gpu_args=()
  [[ -n $gpus ]] && gpu_args=(--ntasks=1 "--gpus-per-task=$gpus")
  local self=$root/scripts/slurm-sweep.sh build array merge
  local -a submitted=()
  # sbatch's own error line says what it refused; the jobs already queued are cancelled with it.
  submit_job() {
    local name=$1 id
    shift
    if ! id=$(sbatch --parsable "$@"); then
      if ((${#submitted[@]} == 0)); then
        rm -f "$out_dir/sweep.settings"
        rmdir "$out_dir" 2>/dev/null || true
      else
        scancel "${submitted[@]}" || true
      fi
      echo "$me: sbatch refused the $name job${submitted[0]+ (cancelled the jobs before it: ${submitted[*]})}" >&2
      exit 1
    fi
    id=${id%%;*}  # --parsable: "id" or "id;cluster"
    submitted+=("$id")
    echo "$id"
  }
  # 1. The binary, on a compute node (the shards' CPU: -march=native), checked against the config.
  build=$(submit_job build "${common[@]}" "${gpu_args[@]}" --job-name=lattnbench-build --nodes=1 \
    --time="$build_time" --output="$out_dir/build-%j.log" "$self" --stage build "$out_dir")
  submitted+=("$build")
  # 2. The shards, each alone on a node, all on that binary. A task requeued starts over from its journal.
  array=$(submit_job shard "${common[@]}" --dependency="afterok:$build" --kill-on-invalid-dep=yes \
    --array="1-$count" --job-name=lattnbench --nodes=1 --ntasks=1 ${gpus:+"--gpus-per-task=$gpus"} \
    --exclusive --requeue --open-mode=append --time="$time" --output="$out_dir/shard-%a-of-$count.log" \
    "$self" --stage shard "$out_dir")
  submitted+=("$array")
  # 3. The merge, once every task has ended, whichever way.
  merge=$(submit_job merge "${common[@]}" --dependency="afterany:$array" --job-name=lattnbench-merge \
    --nodes=1 --ntasks=1 --time=00:10:00 --output="$out_dir/merge-%j.log" "$self" --stage merge "$out_dir")
  echo "build $build, shards $array (1-$count), merge $merge: $out_dir"
  ((wait)) || return 0

  local state unknown=0
  while :; do
    state=$(scontrol show job "$merge" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
    case $state in
      PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | RESIZING | SUSPENDED) unknown=0 ;;
      # The controller forgets an ended job after MinJobAge (300 s by default), or was not reached.
      "") ((++unknown < 30)) || { state=UNKNOWN; break; } ;;
      *) break ;;
    esac
    sleep 2
  done
  local log=$out_dir/merge-$merge.log
  [[ -f $log ]] && tail -n 1 "$log"
  [[ $state == COMPLETED || ($state == UNKNOWN && -f $out_dir/merged.json) ]] ||
    { echo "$me: merge job $merge ended $state" >&2; return 1; }
}

build_stage() {
  eval "$setup"
  if [[ -n $binary ]]; then
    echo "$me: using $binary, not building"
    local status=0
    "$binary" --version || status=$?
    ((status == 0)) || { echo "$me: build: $binary does not run on $(hostname) (exit $status)"; return 1; }
    cp "$binary" "$out_dir/lattnbench.tmp"
  else
    LATTN_BUILD_DIR=$out_dir/build LATTN_BUILD_TARGET=lattnbench "$root/scripts/build.sh" ||
      { echo "$me: build: scripts/build.sh failed on $(hostname) (log: $out_dir/build/build.log)"; return 1; }
    cp "$out_dir/build/lattnbench" "$out_dir/lattnbench.tmp"
  fi
  # The config and arguments are read now, so that a mistake there fails one job, not every shard.
  local refusal
  if ! refusal=$("$out_dir/lattnbench.tmp" --config "$config" --list-cases --shard "1/$count" "${lattnbench_args[@]}" 2>&1 >/dev/null); then
    echo "$refusal"
    echo "$me: build: the binary refuses the sweep: $(tail -n 1 <<<"$refusal")"
    return 1
  fi
  mv "$out_dir/lattnbench.tmp" "$out_dir/lattnbench"
}

shard_stage() {
  local index=${SLURM_ARRAY_TASK_ID:?the shard stage runs as a task of the array submit made}
  local out=$out_dir/shard-$index-of-$count.json
  local journal=$out.journal.jsonl
  eval "$setup"
  # A requeued task continues from its journal (its first line is the run's header).
  local -a resume=()
  if [[ -f $journal ]]; then
    resume=(--resume "$journal")
    echo "$me: shard $index of $count resumes from its journal ($(($(wc -l <"$journal") - 1)) cases done; restart ${SLURM_RESTART_COUNT:-?})"
  fi
  # One task with every CPU of the node: a step's default is one CPU, which a cluster that binds
  # tasks to their CPUs would hold the run to.
  local status=0
  srun --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" "$out_dir/lattnbench" --config "$config" \
    --shard "$index/$count" --out "$out" --quiet "${resume[@]}" "${lattnbench_args[@]}" || status=$?
  ((status == 0)) || echo "$me: shard $index of $count failed (lattnbench exit $status)"
  return "$status"
}

# Why a shard is missing, from its log: lattnbench's own error line, else the log's last line.
why_missing() {
  local log=$out_dir/shard-$1-of-$count.log line=""
  [[ -f $log ]] || { echo "no $(basename "$log"): its task never ran"; return; }
  line=$(grep -E '^lattnbench: error: ' "$log" | tail -n 1 || true)
  [[ -n $line ]] || line=$(grep -v '^srun: ' "$log" | tail -n 1 || true)
  echo "$(basename "$log"): ${line:-empty}"
}

join_list() {
  local IFS=,
  local text="$*"
  echo "${text//,/, }"
}

merge_stage() {
  eval "$setup"
  local -a done=() merged=() missing=() reasons=()
  local k out
  for ((k = 1; k <= count; k++)); do
    out=$out_dir/shard-$k-of-$count.json
    # A run that ended removes its journal; an interrupted or unfinished one keeps it.
    if [[ -f $out && ! -e $out.journal.jsonl ]]; then
      done+=("$out")
      merged+=("$k")
    else
      missing+=("$k")
      reasons+=("$(why_missing "$k")")
    fi
  done
  if ((${#missing[@]} == 0)); then
    python3 "$root/scripts/merge.py" --force -o "$out_dir/merged.json" "${done[@]}"
    return
  fi
  if [[ ! -x $out_dir/lattnbench ]]; then
    local log why="no build log"
    log=$(find "$out_dir" -maxdepth 1 -name 'build-*.log' | sort | tail -n 1)
    [[ -z $log ]] || why="$(basename "$log"): $(tail -n 1 "$log")"
    echo "$me: no shard ran: the build job failed ($why)"
    return 1
  fi
  local where="" why
  if ((${#done[@]})); then
    python3 "$root/scripts/merge.py" --force -o "$out_dir/merged-partial.json" "${done[@]}" >/dev/null
    where="; shard${merged[1]+s} $(join_list "${merged[@]}") merged into merged-partial.json"
  fi
  why=$(printf '%s; ' "${reasons[@]}")
  echo "$me: shard${missing[1]+s} $(join_list "${missing[@]}") of $count missing (${why%; })$where"
  return 1
}

if [[ ${1:-} == --stage ]]; then
  (($# == 3)) || usage_error "--stage takes STAGE DIR (the jobs submit makes call it)"
  out_dir=$3
  # shellcheck source=/dev/null
  source "$out_dir/sweep.settings"
  case $2 in
    build) build_stage ;;
    shard) shard_stage ;;
    merge) merge_stage ;;
    *) usage_error "unknown stage '$2'" ;;
  esac
else
  submit "$@"
fi

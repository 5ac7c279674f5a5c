#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (docs/cuda.md, "Checking on a GPU machine"),
# sized for a GPU machine held for minutes, from which at most 8 files come back. In order,
# each step under its own timeout, the whole script done by LATTN_DEVICE_CHECK_SECONDS (420):
#   1. configure and build lattnbench and lattn_cuda_tests for this GPU's architecture alone
#      (build folder under /tmp), or, with LATTN_DEVICE_PREBUILT=DIR, use DIR/lattnbench and
#      DIR/tests/lattn_cuda_tests where they start here (built elsewhere for this GPU: minutes of
#      the machine saved), building only when they do not;
#   2. correctness: lattn_cuda_tests (the correctness table and the CUDA tests on the GPU), then
#      the chunked kernels' launch figures and occupancy (its hidden [occupancy] test);
#   3. compute-sanitizer (memcheck, racecheck, synccheck) on the small [sanitize] cases, each
#      tool's verdict read from its exit status (--error-exitcode);
#   4. benchmarks: the headline shape first (batch 4, heads 64, seq 4096, dim 128; scan and
#      chunked, fwd and fwd_bwd; bf16 then float32), then, as time allows, a short kernel sweep,
#      the layer suite, and flash-linear-attention's kernels as a Python impl where they import.
# Writes two files into OUTDIR: summary.txt (each step's verdict and time, the occupancy and the
# headline table against docs/cuda.md's estimate; also printed at the end) and device-check.tar.gz
# (every log and result JSON). A step that cannot finish in the time left is cut short or skipped,
# and says so.
#
#   scripts/device_check.sh [--table] [--dry-run] [OUTDIR]   (default: $OUT, else ./out/device-check)
#
# --table: steps 1 and 2, then the table of every rule x decay beside flash-linear-attention's
# kernels (examples/python/fla.py) at FLA's benchmark shapes, instead of steps 3 and 4: the
# shapes whose estimate fits the time left, cheapest first (docs/cuda.md, "FLA beside ours");
# then the further families at two of those shapes, each beside its outside kernels: RWKV-7 (dplr)
# and RWKV-6 (the bonus) beside FLA's, DeltaProduct beside FLA's chunk_gated_delta_product, and
# Mamba-3's trapezoidal rule beside its authors' Triton kernel (examples/python/mamba3.py).
# --dry-run: prints the table's commands and their estimates, checks that lattnbench parses each
# (--list-cases; LATTN_BINARY or build/lattnbench), and runs nothing else; no GPU needed.
#
# Dependencies: the system's, or the Debian packages scripts/fetch_device_deps.sh unpacked into
# .deps/root (used when present; LATTN_DEPS=DIR names another).
# Exit status: 0 everything ran and passed; 1 the build failed; 2 a CUDA test failed or a
# sanitizer found errors; 3 a benchmark failed; 4 a step timed out or was skipped for time (the
# first of these in that order of severity: the lowest non-zero status wins).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
plan=check
dry_run=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --table) plan=table ;;
    --dry-run) dry_run=1 ;;
    *) echo "device_check: unknown option $1 (--table, --dry-run)" >&2; exit 2 ;;
  esac
  shift
done

# ---- the table: every rule x decay, ours (scan, chunked) beside FLA's (fla:chunk, fla:scan) ----
# FLA's benchmarks/ops/registry.py SHAPE_CONFIGS (B T H D) and Qwen3-Next's grouped heads (H 32,
# heads_k 16), cheapest first; bf16, and float32 at the headline shape. Each row: "B T H D HK DTYPE".
table_rows=("8 1024 8 64 0 bf16" "4 2048 16 128 0 bf16" "4 2048 32 128 16 bf16" "4 4096 64 128 0 bf16"
            "1 8192 96 128 0 bf16" "4 4096 64 128 0 float32" "8 2048 32 256 0 bf16" "2 16384 16 128 0 bf16")
fla_plugin=$root/examples/python/fla.py
mamba3_plugin=$root/examples/python/mamba3.py
# The further families, each "NAME|its lattnbench case arguments|its outside impls|its cases per
# mode" (fla: the FLA impls; mamba3: the authors' Mamba-3 kernel), at these shapes ("B T H D DTYPE").
family_rows=("8 1024 8 64 bf16" "4 2048 16 128 bf16")
families=("rwkv7|--rule dplr --decay vector|fla:chunk,fla:scan|1"
          "deltaproduct|--rule delta --decay scalar --householder 2|fla:chunk|1"
          "rwkv6|--rule additive --decay vector --bonus true|fla:chunk,fla:scan|1"
          "mamba3|--rule trapezoidal --decay scalar --mimo-rank 1,4|mamba3:siso|2")
# Each case's outputs are checked on its first 16 (sequence, head) pairs against a reference made
# for them alone (docs/harness.md, "A part checked"): the full float64 reference of one headline
# case takes about a minute on the host's CPU, the part a sixteenth of the headline's 256 pairs.
check_pairs=16
table_args() {  # B T H D HK DTYPE [fla]: the lattnbench arguments of one row
  local args=(--suite kernel --batch "$1" --seq "$2" --heads "$3" --dim "$4" --dtype "$6" --chunk 64
              --rule additive,delta --decay none,retnet,scalar,vector --mode fwd,fwd_bwd
              --warmup 1 --reps 3 --min-sample-ms 2 --check-heads "$check_pairs")
  (( $5 > 0 )) && args+=(--heads-k "$5")
  if [[ ${7:-} == fla ]]; then args+=(--plugin "$fla_plugin" --impl scan,chunked,fla:chunk,fla:scan)
  else args+=(--impl scan,chunked); fi
  printf '%s\n' "${args[@]}"
}
# Seconds one row takes on an H200 host, estimated: the float64 reference (on the host's CPU) of its
# 8 rule x decay cases with their backward, about 65 s each for all 256 pairs at B4 H64 T4096 D128
# (the headline reference measured 78 s with its timing, docs/measurements/cuda.md), here for
# check_pairs of them, scaled by T D^2; the inputs made for the whole case (about 2 s a case at the
# headline, scaled by B H T D); the GPU calls, dominated by the two scans (21 ms fwd, 85 ms fwd_bwd
# at the headline, 2-4x for the delta rule: about 30 s a row there, scaled by B H T D^2); 30 s for
# FLA's Triton compilation and autotuning in each new process; float32 doubles the scans.
row_estimate() {
  awk -v b="$1" -v t="$2" -v h="$3" -v d="$4" -v dt="$6" -v fla="${7:-}" -v pairs="$check_pairs" 'BEGIN {
    u = b * h * t * d * d / (4 * 64 * 4096 * 128 * 128)
    checked = (b * h < pairs ? b * h : pairs) / 256 * t * d * d / (4096 * 128 * 128)
    inputs = 8 * 2 * b * h * t * d / (4 * 64 * 4096 * 128)
    s = 8 * 65 * checked + inputs + 30 * u * (dt == "float32" ? 2 : 1) + (fla == "fla" ? 30 : 0) + 3
    printf "%d\n", s + 0.999 }'
}
family_args() {  # B T H D DTYPE FAMILY OUTSIDE: one family row's arguments (OUTSIDE: its plugin loads)
  local name rule impls cases
  IFS='|' read -r name rule impls cases <<<"$6"
  local args=(--suite kernel --batch "$1" --seq "$2" --heads "$3" --dim "$4" --dtype "$5" --chunk 64 $rule
              --mode fwd,fwd_bwd --warmup 1 --reps 3 --min-sample-ms 2 --check-heads "$check_pairs")
  if [[ -n ${7:-} ]]; then
    args+=(--plugin "$([[ $impls == mamba3:* ]] && echo "$mamba3_plugin" || echo "$fla_plugin")" --impl "scan,chunked,$impls")
  else args+=(--impl scan,chunked); fi
  printf '%s\n' "${args[@]}"
}
family_estimate() {  # B T H D DTYPE FAMILY OUTSIDE: a grid row's estimate for the family's cases (of 8)
  local name rule impls cases
  IFS='|' read -r name rule impls cases <<<"$6"
  local whole
  whole=$(row_estimate "$1" "$2" "$3" "$4" 0 "$5" "${7:+fla}")
  echo $(( (whole * cases + 7) / 8 + 3 ))
}
family_plugin_loads() {  # BIN FAMILY LOG: whether the family's outside plugin loads in BIN
  local name rule impls cases
  IFS='|' read -r name rule impls cases <<<"$2"
  "$1" --list --plugin "$([[ $impls == mamba3:* ]] && echo "$mamba3_plugin" || echo "$fla_plugin")" >"$3" 2>&1
}
table_seconds=${LATTN_DEVICE_TABLE_SECONDS:-}

if (( dry_run )); then
  bin=${LATTN_BINARY:-$root/build/lattnbench}
  [[ -x $bin ]] || { echo "device_check --dry-run: no lattnbench at $bin (set LATTN_BINARY)" >&2; exit 2; }
  fla=fla
  "$bin" --list --plugin "$fla_plugin" >/dev/null 2>&1 || fla=
  if [[ -n $fla ]]; then echo "device_check --dry-run: $bin, with $fla_plugin"
  else echo "device_check --dry-run: $bin, without the FLA impls ($fla_plugin does not load)"; fi
  total=0 bad=0
  for row in "${table_rows[@]}"; do
    read -r B T H D HK DT <<<"$row"
    mapfile -t args < <(table_args $B $T $H $D $HK $DT $fla)
    est=$(row_estimate $B $T $H $D $HK $DT $fla)
    total=$(( total + est ))
    printf 'B %s T %s H %s D %s heads_k %s %s: estimate %s s (running total %s s)\n' $B $T $H $D $HK $DT $est $total
    echo "  lattnbench --backend cuda --quiet --out table-B${B}-T${T}-H${H}-D${D}-Hk${HK}-${DT}.json ${args[*]}"
    if ! "$bin" --list-cases "${args[@]}" >/tmp/lattn-dry-run.$$ 2>&1; then
      echo "  does not parse: $(tail -1 /tmp/lattn-dry-run.$$)"; bad=$(( bad + 1 ))
    else
      echo "  parses: $(grep -c . /tmp/lattn-dry-run.$$) lines of --list-cases"
    fi
  done
  for row in "${family_rows[@]}"; do
    read -r B T H D DT <<<"$row"
    for family in "${families[@]}"; do
      outside=yes
      family_plugin_loads "$bin" "$family" /dev/null || outside=
      mapfile -t args < <(family_args $B $T $H $D $DT "$family" $outside)
      est=$(family_estimate $B $T $H $D $DT "$family" $outside)
      total=$(( total + est ))
      printf 'B %s T %s H %s D %s %s %s: estimate %s s (running total %s s)\n' $B $T $H $D $DT "${family%%|*}" $est $total
      echo "  lattnbench --backend cuda --quiet --out table-B${B}-T${T}-H${H}-D${D}-Hk0-${DT}-${family%%|*}.json ${args[*]}"
      if ! "$bin" --list-cases "${args[@]}" >/tmp/lattn-dry-run.$$ 2>&1; then
        echo "  does not parse: $(tail -1 /tmp/lattn-dry-run.$$)"; bad=$(( bad + 1 ))
      else
        echo "  parses: $(grep -c . /tmp/lattn-dry-run.$$) lines of --list-cases"
      fi
    done
  done
  rm -f /tmp/lattn-dry-run.$$
  echo "estimate of the whole table: $total s; with --table the rows run cheapest first while their estimate fits the time left"
  exit $(( bad ? 2 : 0 ))
fi
out=${1:-${OUT:-$root/out/device-check}}
mkdir -p "$out"
build=${LATTN_DEVICE_BUILD_DIR:-/tmp/lattn-device-build}
deps=${LATTN_DEPS:-$root/.deps/root}
# The FLA kernels fetch_device_deps.sh installed beside the Debian packages (fla-core, flash-qla).
[[ -d $deps/../python ]] && export PYTHONPATH=$(cd "$deps/../python" && pwd)${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d "${TMPDIR:-/tmp}/lattn-device-check.XXXXXX")
logs=$work/device-check
mkdir -p "$logs"
summary=$logs/summary.txt
: >"$summary"
started=$(date +%s)
total=${LATTN_DEVICE_CHECK_SECONDS:-420}
deadline=$(( started + total ))
status=0

note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(( $(date +%s) - started )); }
worsen() { (( status == 0 || $1 < status )) && status=$1; return 0; }  # keep the most severe (lowest) status
# Seconds a step may take: its own cap, less what must stay for the steps after it (the reserves
# are written for the 420 s default and scale with the total).
budget() {
  local cap=$1 reserve=$(( ${2:-0} * total / 420 )) left
  left=$(( deadline - $(date +%s) - reserve ))
  (( left < cap )) && cap=$left
  echo $(( cap > 0 ? cap : 0 ))
}
# run_step NAME CAP RESERVE LOG COMMAND...: runs COMMAND under `timeout` (TERM, then KILL 5 s
# later), its output into LOG; sets step_rc (124: timed out; 125: not started, no time left).
run_step() {
  local name=$1 cap=$2 reserve=$3 log=$4; shift 4
  local secs t0
  secs=$(budget "$cap" "$reserve")
  if (( secs < 5 )); then
    note "$(printf '%-28s skipped: no time left (%ss in)' "$name" "$(elapsed)")"
    step_rc=125
    return
  fi
  t0=$(date +%s)
  echo "[device_check +$(elapsed)s] $name (up to ${secs}s)" >&2
  timeout -k 5 "$secs" "$@" >"$log" 2>&1
  step_rc=$?
  local verdict="ok"
  (( step_rc == 0 )) || verdict="exit $step_rc"
  (( step_rc == 124 || step_rc == 137 )) && verdict="timed out after ${secs}s"
  note "$(printf '%-28s %-26s %4ss' "$name" "$verdict" $(( $(date +%s) - t0 )))"
}

# The archive (and the summary beside it) are written however the script ends.
finish() {
  note "device_check: status $status after $(elapsed)s (0 ok, 1 build, 2 tests or sanitizer, 3 benchmark, 4 timed out or skipped)"
  cp "$summary" "$out/summary.txt"
  # Logs are cut to their last 2 MiB each, so the archive stays far under the 16 MiB a file may have.
  find "$logs" -name '*.log' -size +2M -exec sh -c 'tail -c 2097152 "$1" >"$1.cut" && mv "$1.cut" "$1"' _ {} \;
  tar -czf "$out/device-check.tar.gz" -C "$work" device-check
  rm -rf "$work"
  cat "$out/summary.txt"
}
trap finish EXIT
trap 'note "interrupted"; worsen 4; exit "$status"' TERM INT

# ---- environment ----
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin  # appended: stand-ins on PATH win
{
  echo "== environment"; date -u; uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 | tail -2; cmake --version | head -1; c++ --version | head -1
} >"$logs/env.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)
note "gpu: ${gpu:-none found}"
# Machine code for this GPU alone (sm_90a on Hopper: wgmma-capable, as the normal build makes it).
cc=$(echo "$gpu" | awk -F', *' '{print $2}' | tr -d .)
archs=${LATTN_DEVICE_CUDA_ARCHITECTURES:-$([[ $cc == 90 ]] && echo 90a-real || { [[ -n $cc ]] && echo "$cc-real"; } || echo "80-real;90a-real")}

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DLATTN_CUDA=ON -DBUILD_TESTING=ON -DLATTN_CUDA_EMULATION=OFF
            "-DLATTN_CUDA_ARCHITECTURES=$archs")
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# The Python to embed is the python3 on PATH, the one that holds torch on the GPU image (CMake
# would otherwise take /usr/bin/python3, which does not): fla.py's impls need it.
command -v python3 >/dev/null && cmake_args+=("-DPython3_EXECUTABLE=$(command -v python3)")
if [[ -d $deps/usr ]]; then
  multiarch=$deps/usr/lib/x86_64-linux-gnu
  # Debian's OpenBLAS config hard-codes /usr paths: write one that names the unpacked copies.
  mkdir -p "$build/openblas-config"
  cat >"$build/openblas-config/OpenBLASConfig.cmake" <<CFG
set(OpenBLAS_VERSION "0.3.21")
set(OpenBLAS_INCLUDE_DIRS "$deps/usr/include/x86_64-linux-gnu/openblas-pthread")
set(OpenBLAS_LIBRARIES "$multiarch/openblas-pthread/libopenblas.so")
CFG
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr" -DOpenBLAS_DIR="$build/openblas-config")
  export LD_LIBRARY_PATH=$multiarch/openblas-pthread:$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "== dependencies from $deps" >>"$logs/env.log"
fi

# ---- 1. build (the time after it is kept for at least the tests and the headline) ----
prebuilt=${LATTN_DEVICE_PREBUILT:-}
# Binaries built elsewhere start here only when their libraries resolve (the loader exits 127
# otherwise); Catch2's --list-tests exits with the number of tests, so its listing is what counts.
if [[ -n $prebuilt ]] && "$prebuilt/lattnbench" --list >"$logs/prebuilt.log" 2>&1 \
   && { "$prebuilt/tests/lattn_cuda_tests" --list-tests >>"$logs/prebuilt.log" 2>&1;
        grep -q "test cases" "$logs/prebuilt.log"; }; then
  note "$(printf '%-28s %s' build "prebuilt: $prebuilt")"
  bin=$prebuilt/lattnbench
  tests=$prebuilt/tests/lattn_cuda_tests
else
  [[ -n $prebuilt ]] && note "$(printf '%-28s %s' prebuilt "does not start here: $(tail -1 "$logs/prebuilt.log" 2>/dev/null); building")"
  run_step configure 60 150 "$logs/configure.log" cmake -S "$root" -B "$build" "${cmake_args[@]}"
  # Embedding Python needs the interpreter's library and headers: without them, no Python impls.
  if (( step_rc == 1 )) && grep -q "Python3" "$logs/configure.log"; then
    mv "$logs/configure.log" "$logs/configure-with-python.log"
    run_step "configure (no Python)" 60 150 "$logs/configure.log" \
      cmake -S "$root" -B "$build" "${cmake_args[@]}" -DLATTN_EMBED_PYTHON=OFF
  fi
  (( step_rc == 0 )) && run_step build 200 150 "$logs/build.log" \
    cmake --build "$build" --parallel "$(nproc)" --target lattnbench lattn_cuda_tests
  if (( step_rc != 0 )); then
    (( step_rc == 124 || step_rc == 137 || step_rc == 125 )) && worsen 4 || worsen 1
    tail -30 "$logs/build.log" 2>/dev/null || tail -30 "$logs/configure.log"
    exit "$status"
  fi
  bin=$build/lattnbench
  tests=$build/tests/lattn_cuda_tests
fi
# The tests that run the CLI find it here, not where it was built.
export LATTN_BINARY=$bin

# ---- 2. correctness on the GPU, and the chunked kernels' occupancy ----
run_step cuda-tests 110 110 "$logs/cuda-tests.log" "$tests" --durations yes
case $step_rc in
  0) ;;
  77) note "  (skipped: $(head -1 "$logs/cuda-tests.log"))"; worsen 2 ;;
  124|137|125) worsen 4 ;;
  *) worsen 2; grep -E "FAILED|failed|SKIPPED" "$logs/cuda-tests.log" | head -10 | tee -a "$summary" ;;
esac
run_step occupancy 20 100 "$logs/occupancy.log" "$tests" "[occupancy]"
grep "^occupancy" "$logs/occupancy.log" | tee -a "$summary"
(( step_rc == 0 )) || worsen "$( (( step_rc == 124 || step_rc == 125 )) && echo 4 || echo 2)"

if [[ $plan == table ]]; then
  # ---- 3'. the table, cheapest row first, each while its estimate fits the time left ----
  fla=
  if "$bin" --list --plugin "$fla_plugin" >"$logs/fla-load.log" 2>&1; then fla=fla
  else note "$(printf '%-28s %s' "fla impls" "left out: $(tail -1 "$logs/fla-load.log")")"; fi
  for row in "${table_rows[@]}"; do
    read -r B T H D HK DT <<<"$row"
    name=table-B${B}-T${T}-H${H}-D${D}-Hk${HK}-${DT}
    est=$(row_estimate $B $T $H $D $HK $DT $fla)
    left=$(( deadline - $(date +%s) ))
    if (( est > left )); then
      note "$(printf '%-28s skipped: estimate %ss, %ss left' "$name" "$est" "$left")"
      continue
    fi
    mapfile -t args < <(table_args $B $T $H $D $HK $DT $fla)
    run_step "$name" $(( 2 * est )) 0 "$logs/$name.log" "$bin" --backend cuda --quiet --out "$logs/$name.json" "${args[@]}"
    case $step_rc in
      0) ;;
      124|137|125) worsen 4 ;;
      *) worsen 3 ;;
    esac
  done
  for row in "${family_rows[@]}"; do
    read -r B T H D DT <<<"$row"
    for family in "${families[@]}"; do
      name=table-B${B}-T${T}-H${H}-D${D}-Hk0-${DT}-${family%%|*}
      outside=yes
      if ! family_plugin_loads "$bin" "$family" "$logs/$name-load.log"; then
        outside=
        note "$(printf '%-28s %s' "$name outside impls" "left out: $(tail -1 "$logs/$name-load.log")")"
      fi
      est=$(family_estimate $B $T $H $D $DT "$family" $outside)
      left=$(( deadline - $(date +%s) ))
      if (( est > left )); then
        note "$(printf '%-28s skipped: estimate %ss, %ss left' "$name" "$est" "$left")"
        continue
      fi
      mapfile -t args < <(family_args $B $T $H $D $DT "$family" $outside)
      run_step "$name" $(( 2 * est )) 0 "$logs/$name.log" "$bin" --backend cuda --quiet --out "$logs/$name.json" "${args[@]}"
      case $step_rc in
        0) ;;
        124|137|125) worsen 4 ;;
        *) worsen 3 ;;
      esac
    done
  done
  # The table: one line per shape, rule (with its form: n writes, the bonus, the MIMO rank R),
  # decay and mode; each impl's median and rel_err.
  python3 - "$logs" <<'PY' 2>&1 | tee -a "$summary"
import glob, json, os, sys
impls = ["scan", "chunked", "fla:scan", "fla:chunk", "mamba3:siso"]
print("table (ms, rel_err; -: not run, with the reason in the JSON):")
print(f"{'shape':48} {'rule':14} {'decay':6} {'mode':7} " + " ".join(f"{i:>20}" for i in impls))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "table-*.json"))):
    doc = json.load(open(path))
    rows = {}
    for r in doc["results"]:
        rule = r.get("rule", "additive")
        if int(r.get("householder", 1)) > 1:
            rule += f" n{r['householder']}"
        if str(r.get("bonus", "false")).lower() == "true":
            rule += " bonus"
        if int(r.get("mimo_rank", 1)) > 1:
            rule += f" R{r['mimo_rank']}"
        key = (rule, r.get("decay", "none"), r["mode"])
        cell = "-"
        if r["status"] == "ok":
            cell = f"{r['median_ms']:.3f} {r['rel_err']:.0e}"
        elif r["status"] == "failed":
            cell = "FAILED"
        rows.setdefault(key, {})[r["impl"]] = cell
    shape = os.path.basename(path)[len("table-"):-len(".json")]
    for (rule, decay, mode), cells in sorted(rows.items()):
        print(f"{shape:48} {rule:14} {decay:6} {mode:7} " + " ".join(f"{cells.get(i, '-'):>20}" for i in impls))
PY
  exit "$status"
fi

# ---- 3. compute-sanitizer on small cases ----
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -z $sanitizer ]]; then
  note "compute-sanitizer: not found"
else
  for tool in memcheck racecheck synccheck; do
    # Exit 9: the tool found errors. Any other failure is the tool not running here (on gVisor
    # it cannot attach): reported, not counted as the kernels' fault.
    run_step "sanitize $tool" 30 90 "$logs/sanitize-$tool.log" \
      "$sanitizer" --tool "$tool" --error-exitcode 9 "$tests" "[sanitize]"
    case $step_rc in
      0) ;;
      9) worsen 2; grep -m3 -E "^=========.*(Invalid|Race|Barrier|ERROR)" "$logs/sanitize-$tool.log" | tee -a "$summary" ;;
      124|137|125) worsen 4 ;;
      *) note "  (compute-sanitizer did not run here: $(grep -m1 -iE "error|not supported" "$logs/sanitize-$tool.log"))" ;;
    esac
  done
fi

# ---- 4. benchmarks: the headline shape first ----
bench() {  # NAME CAP RESERVE ARGS...
  local name=$1 cap=$2 reserve=$3; shift 3
  run_step "bench $name" "$cap" "$reserve" "$logs/bench-$name.log" \
    "$bin" --backend cuda --quiet --out "$logs/$name.json" "$@"
  case $step_rc in
    0) ;;
    124|137|125) worsen 4 ;;
    *) worsen 3 ;;
  esac
}
head=(--suite kernel --batch 4 --heads 64 --seq 4096 --dim 128 --impl chunked,scan --mode fwd,fwd_bwd
      --warmup 3 --reps 10 --min-sample-ms 20 --check-heads "$check_pairs")
# The float64 reference of the large cases, made for their first check_pairs pairs: the whole one
# took most of a headline run (78 s for bf16 on an H200 host).
bench headline-bf16 120 60 "${head[@]}" --chunk 64,128 --dtype bf16
bench headline-float32 60 0 "${head[@]}" --chunk 64 --dtype float32
short=(--suite kernel --batch 2 --heads 4 --seq 512,2048,8192 --dim 32,64,128 --chunk 64 --warmup 2 --reps 5 --min-sample-ms 5)
bench kernel-bf16 40 0 "${short[@]}" --dtype bf16
bench layer-float32 40 0 --suite layer --seq 512,2048 --dtype float32 --warmup 2 --reps 5 --min-sample-ms 5
# A Python impl on the GPU through the bridge (docs/plugins.md): flash-linear-attention's Triton
# kernels beside ours, where torch with CUDA and fla import (fla.py declines every case otherwise).
if python3 -c "import torch, fla; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  bench python-fla 40 0 --suite kernel --batch 2 --heads 4 --seq 2048,8192 --dim 128 --mode fwd \
    --plugin "$root/examples/python/fla.py" --impl fla:chunk,chunked --warmup 2 --reps 5 --min-sample-ms 5
else
  note "$(printf '%-28s %s' "bench python-fla" "skipped: torch with CUDA and fla do not import here")"
fi

# The headline against docs/cuda.md's estimates for an H200 (bf16; an estimate, not a measurement).
if command -v python3 >/dev/null; then
  python3 - "$logs" <<'PY' 2>&1 | tee -a "$summary"
import json, os, sys
estimate = {("chunked", "fwd", 64): "0.7-1.2", ("chunked", "fwd_bwd", 64): "2.0-3.0"}
for name in ("headline-bf16", "headline-float32"):
    path = os.path.join(sys.argv[1], name + ".json")
    if not os.path.exists(path):
        print(f"{name}: no results"); continue
    doc = json.load(open(path))
    print(f"{name} on {doc['device'].get('gpu')} (cc {doc['device'].get('compute_capability')}):")
    for r in doc["results"]:
        what = f"  {r['impl']:7} {r['mode']:7} chunk {r.get('chunk', 0):3}"
        if r.get("status") != "ok":
            print(what, r.get("status"), r.get("check_failure") or r.get("error") or r.get("skip_reason")); continue
        est = estimate.get((r["impl"], r["mode"], r.get("chunk"))) if r.get("dtype") == "bf16" else None
        print(what, f"median {r['median_ms']:.4f} ms (q1 {r['q1_ms']:.4f}, q3 {r['q3_ms']:.4f}) rel_err {r['rel_err']:.1e}"
              f" temp {r.get('temp_mb', 0):.0f} MB" + (f"  estimate {est} ms" if est else ""))
PY
fi
exit "$status"

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
#   scripts/device_check.sh [OUTDIR]        (default: $OUT, else ./out/device-check)
#
# Dependencies: the system's, or the Debian packages scripts/fetch_device_deps.sh unpacked into
# .deps/root (used when present; LATTN_DEPS=DIR names another).
# Exit status: 0 everything ran and passed; 1 the build failed; 2 a CUDA test failed or a
# sanitizer found errors; 3 a benchmark failed; 4 a step timed out or was skipped for time (the
# first of these in that order of severity: the lowest non-zero status wins).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$root/out/device-check}}
mkdir -p "$out"
build=${LATTN_DEVICE_BUILD_DIR:-/tmp/lattn-device-build}
deps=${LATTN_DEPS:-$root/.deps/root}
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
      --warmup 3 --reps 10 --min-sample-ms 20)
# The float64 reference of the four large cases takes most of a headline run (78 s for bf16 on an H200 host).
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
estimate = {("chunked", "fwd", 64): "0.7-1.0", ("chunked", "fwd_bwd", 64): "2.3-2.9",
            ("chunked", "fwd", 128): "0.6-0.9", ("chunked", "fwd_bwd", 128): "2.0-2.6"}
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

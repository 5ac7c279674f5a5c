#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (docs/cuda.md): configures and builds
# lattnbench with the CUDA backend from scratch (build folder under /tmp; nothing built elsewhere
# is used), runs the whole CTest suite (the CUDA tests included), then a short benchmark of the
# kernel suite in float32 and bf16, the layer suite in float32, and the headline shape (batch 4,
# heads 64, seq 4096, dim 128).
#
#   scripts/device_check.sh [OUTDIR]        (default: $OUT, else ./out/device-check)
#
# Writes at most 9 files into OUTDIR: build.log, test.log, sanitize.log, bench.log and five result
# JSONs.
# Dependencies: the system's, or the Debian packages scripts/fetch_device_deps.sh unpacked into
# .deps/root (used when present; LATTN_DEPS=DIR names another). Every step has a timeout; the whole
# script ends within about 8 minutes. Exit status: 0 all passed, else the first failing step's.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$root/out/device-check}}
mkdir -p "$out"
build=${LATTN_DEVICE_BUILD_DIR:-/tmp/lattn-device-build}
deps=${LATTN_DEPS:-$root/.deps/root}
jobs=$(nproc)
status=0
started=$(date +%s)
deadline=$(( started + ${LATTN_DEVICE_CHECK_SECONDS:-465} ))  # the whole script ends before this
limit() { local left=$(( deadline - $(date +%s) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
log() { echo "[device_check +$(( $(date +%s) - started ))s] $*" | tee -a "$out/bench.log" >&2; }
: >"$out/bench.log"

# ---- 1. environment and configure ----
{
  echo "== environment"; date -u; uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  nvcc --version 2>&1 | tail -2; cmake --version | head -1; c++ --version | head -1
} >"$out/build.log" 2>&1
export PATH=/usr/local/cuda/bin:$PATH

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DLATTN_CUDA=ON -DBUILD_TESTING=ON)
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# The Python tools' tests need numpy, scipy and matplotlib: the first python3 that has them.
for py in "$(command -v python3)" /usr/bin/python3; do
  if [[ -x $py ]] && "$py" -c "import numpy, scipy, matplotlib" 2>/dev/null; then cmake_args+=(-DLATTN_PYTHON="$py"); break; fi
done
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
  echo "== dependencies from $deps (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >>"$out/build.log"
else
  echo "== dependencies from the system (no $deps)" >>"$out/build.log"
fi

log "configure and build in $build"
if ! { echo "== configure: cmake ${cmake_args[*]}"
       timeout "$(limit 120)" cmake -S "$root" -B "$build" "${cmake_args[@]}" &&
       echo "== build" && timeout "$(limit "${LATTN_DEVICE_BUILD_SECONDS:-300}")" cmake --build "$build" --parallel "$jobs"; } >>"$out/build.log" 2>&1; then
  log "BUILD FAILED (see build.log)"; tail -30 "$out/build.log" >&2; exit 1
fi
grep -E "Found (fmt|yaml|Catch2|CLI11|nlohmann)|OpenBLAS|dependencies from" "$out/build.log" | head -10 >&2
log "built"

# ---- 2. tests ----
log "ctest"
(cd "$build" && timeout "$(limit 200)" ctest --output-on-failure --parallel 4 --timeout 180) >"$out/test.log" 2>&1 || status=2
tail -15 "$out/test.log" >&2
log "tests done (status $status); CUDA tests: $(grep -E 'cuda_kernels' "$out/test.log" | tail -1)"

# ---- 3. benchmarks ----
bin=$build/lattnbench
bench() {  # name, timeout seconds, args...
  local name=$1 limit=$2; shift 2
  log "bench $name: $*"
  if (( $(date +%s) + 10 > deadline )); then log "bench $name: skipped, out of time"; status=${status/#0/3}; return 0; fi
  timeout "$(limit "$limit")" "$bin" --backend cuda --quiet --out "$out/$name.json" "$@" >>"$out/bench.log" 2>&1
  local rc=$?
  log "bench $name: exit $rc"
  [[ $rc -eq 0 || $status -ne 0 ]] || status=3
  return 0
}
short=(--batch 2 --heads 4 --seq 512,2048,8192 --dim 32,64,128 --chunk 64 --warmup 2 --reps 5 --min-sample-ms 5)
head=(--batch 4 --heads 64 --seq 4096 --dim 128 --impl scan,chunked --mode fwd,fwd_bwd --warmup 3 --reps 10 --min-sample-ms 20)
bench kernel-float32 60 --suite kernel "${short[@]}" --dtype float32
bench kernel-bf16 60 --suite kernel "${short[@]}" --dtype bf16
bench layer-float32 45 --suite layer --seq 512,2048 --dtype float32 --warmup 2 --reps 5 --min-sample-ms 5
bench headline-float32 120 --suite kernel "${head[@]}" --chunk 64 --dtype float32
bench headline-bf16 150 --suite kernel "${head[@]}" --chunk 64,128 --dtype bf16

# The bar (H200): chunked bf16 fwd < 0.6 ms, fwd_bwd < 2.5 ms at batch 4, heads 64, seq 4096, dim 128.
if [[ -f $out/headline-bf16.json ]] && command -v python3 >/dev/null; then
  python3 - "$out/headline-bf16.json" <<'PY' 2>&1 | tee -a "$out/bench.log" >&2
import json, sys
doc = json.load(open(sys.argv[1]))
print("gpu:", doc["device"].get("gpu"), "cc", doc["device"].get("compute_capability"))
for r in doc["results"]:
    if r.get("status") != "ok":
        print(r["impl"], r["mode"], "chunk", r["chunk"], r.get("status"), r.get("check_failure") or r.get("error") or r.get("skip_reason")); continue
    bar = {"fwd": 0.6, "fwd_bwd": 2.5}[r["mode"]] if r["impl"] == "chunked" else None
    verdict = "" if bar is None else ("  under the bar %.1f ms" % bar if r["median_ms"] < bar else "  OVER the bar %.1f ms" % bar)
    print("%-7s %-7s chunk %3d: median %.4f ms (q1 %.4f, q3 %.4f), rel_err %.2e%s" % (
        r["impl"], r["mode"], r["chunk"], r["median_ms"], r["q1_ms"], r["q3_ms"], r["rel_err"], verdict))
PY
fi
# ---- 4. compute-sanitizer on small shapes (memcheck, racecheck, synccheck), where it works ----
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
: >"$out/sanitize.log"
if [[ -n $sanitizer && -x $build/tests/lattn_cuda_tests ]]; then
  for tool in memcheck racecheck synccheck; do
    log "compute-sanitizer --tool $tool"
    echo "== $tool" >>"$out/sanitize.log"
    timeout "$(limit 45)" "$sanitizer" --tool "$tool" --error-exitcode 9 "$build/tests/lattn_cuda_tests" "[sanitize]" \
      >>"$out/sanitize.log" 2>&1
    rc=$?
    echo "== $tool: exit $rc" >>"$out/sanitize.log"
    log "compute-sanitizer --tool $tool: exit $rc $([[ $rc -eq 124 ]] && echo '(timed out)')"
    # A sanitizer that cannot attach (gVisor: "Device not supported") is not a failure; errors it found are.
    found=$(grep -o "ERROR SUMMARY: [0-9]*" "$out/sanitize.log" | tail -1 | grep -o "[0-9]*$")
    [[ ${found:-0} -eq 0 || $status -ne 0 ]] || status=2
  done
else
  echo "no compute-sanitizer" >>"$out/sanitize.log"
fi

log "done in $(( $(date +%s) - started ))s, status $status (0 ok, 1 build, 2 tests or sanitizer, 3 a benchmark)"
exit $status

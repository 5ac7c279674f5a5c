#!/usr/bin/env bash
# scripts/device_check.sh without a GPU: its logic run against stand-ins for what it calls
# (cmake, nvcc, nvidia-smi, compute-sanitizer, and the lattnbench and lattn_cuda_tests the fake
# build leaves), each told by environment variables how to behave; then its --table plan and its
# --dry-run (every table command printed and parsed by lattnbench --list-cases). Checked per scenario: the exit
# status (which step's failure wins), that OUTDIR holds the summary and one archive and nothing
# else (a GPU machine returns at most 8 files), what the archive holds, what the summary says,
# and that a step past its time is killed (TERM, then KILL for one that ignores TERM) within its
# budget. Run by CTest (device_check_dry).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lattn-device-check-test.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
fakes=$tmp/bin
mkdir -p "$fakes"
failures=0
fail() { echo "FAIL [$scenario]: $*"; failures=$((failures + 1)); }

# ---- the stand-ins ----
cat >"$fakes/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
[[ "$*" == *--query-gpu* ]] && { echo "NVIDIA H200, 9.0"; exit 0; }
echo "fake nvidia-smi: NVIDIA H200"
EOF
cat >"$fakes/nvcc" <<'EOF'
#!/usr/bin/env bash
echo "Cuda compilation tools, release 13.0 (stand-in)"
EOF
cat >"$fakes/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
tool=; while (($#)); do [[ $1 == --tool ]] && tool=$2; shift; done
echo "========= COMPUTE-SANITIZER ($tool, stand-in)"
var=FAKE_SAN_${tool^^}_RC
rc=${!var:-0}
(( rc == 9 )) && echo "========= Race reported between Write access at 0x10 and Read access at 0x20 (stand-in)"
(( rc == 255 )) && echo "========= Error: Device not supported (stand-in)"
exit "$rc"
EOF
# cmake: configuring leaves the two executables the script runs in the build folder.
cat >"$fakes/cmake" <<EOF
#!/usr/bin/env bash
if [[ "\$*" == *--version* ]]; then echo "cmake version 3.25 (stand-in)"; exit 0; fi
if [[ "\$*" == *--build* ]]; then sleep "\${FAKE_BUILD_SLEEP:-0}"; echo "building (stand-in)"; exit "\${FAKE_BUILD_RC:-0}"; fi
if [[ -n \${FAKE_NO_PYTHON:-} && "\$*" != *LATTN_EMBED_PYTHON=OFF* ]]; then
  echo "Could NOT find Python3 (missing: Development.Embed) (stand-in)"; exit 1
fi
build=; while ((\$#)); do [[ \$1 == -B ]] && build=\$2; shift; done
mkdir -p "\$build/tests"
cp "$fakes/lattnbench.in" "\$build/lattnbench"
cp "$fakes/lattn_cuda_tests.in" "\$build/tests/lattn_cuda_tests"
chmod +x "\$build/lattnbench" "\$build/tests/lattn_cuda_tests"
exit "\${FAKE_CONFIGURE_RC:-0}"
EOF
cat >"$fakes/lattn_cuda_tests.in" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--list-tests*) echo "2 test cases (stand-in)"; exit 2 ;;  # Catch2 exits with the count
  *occupancy*) echo "occupancy on NVIDIA H200: bf16 chunk 64 chunk_rows_kernel: 128 threads (stand-in)" ;;
  *sanitize*) echo "sanitize shapes (stand-in)" ;;
  *) echo "All tests passed (stand-in)"; exit "${FAKE_TESTS_RC:-0}" ;;
esac
EOF
# lattnbench: keeps a journal beside its result file while it runs, as the real one does, writes
# the result file at the end; FAKE_BENCH_HANG names the result file whose run hangs.
cat >"$fakes/lattnbench.in" <<'EOF'
#!/usr/bin/env bash
# --list (a plugin loads) and --list-cases (the plan parses): FAKE_LIST_RC says how it ends.
[[ " $* " == *" --list"* ]] && { echo "listing (stand-in)"; exit "${FAKE_LIST_RC:-0}"; }
out=; dtype=float32; while (($#)); do case $1 in --out) out=$2 ;; --dtype) dtype=$2 ;; esac; shift; done
echo '{"case": 1}' >"$out.journal.jsonl"
if [[ -n ${FAKE_BENCH_HANG:-} && $out == *"$FAKE_BENCH_HANG"* ]]; then
  [[ -n ${FAKE_BENCH_IGNORE_TERM:-} ]] && trap '' TERM
  sleep 1000 & wait $!; sleep 1000 & wait $!
fi
cat >"$out" <<JSON
{"device": {"gpu": "NVIDIA H200", "compute_capability": "9.0"},
 "results": [{"impl": "chunked", "mode": "fwd", "chunk": 64, "dtype": "$dtype", "status": "ok", "median_ms": 0.5,
              "q1_ms": 0.49, "q3_ms": 0.51, "rel_err": 1e-3, "temp_mb": 512},
             {"impl": "scan", "mode": "fwd_bwd", "chunk": 64, "dtype": "$dtype", "status": "failed",
              "check_failure": "rel_err over tolerance (stand-in)"}]}
JSON
rm -f "$out.journal.jsonl"
exit "${FAKE_BENCH_RC:-0}"
EOF
chmod +x "$fakes"/*

# ---- one run of the script in a scenario: env assignments, then the checks ----
script_args=()  # the script's options (--table) for the scenarios that set them
run() {  # SCENARIO [VAR=value...]
  scenario=$1; shift
  out=$tmp/$scenario/out
  mkdir -p "$out"
  local t0=$(date +%s)
  env PATH="$fakes:$PATH" LATTN_DEVICE_BUILD_DIR="$tmp/$scenario/build" LATTN_DEPS="$tmp/none" "$@" \
    "$root/scripts/device_check.sh" "${script_args[@]}" "$out" >"$tmp/$scenario/stdout" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  files=$(find "$out" -type f | wc -l)
  (( files <= 8 )) || fail "$files files in OUTDIR (at most 8 come back)"
  [[ -f $out/summary.txt && -f $out/device-check.tar.gz ]] || fail "no summary.txt or device-check.tar.gz in OUTDIR"
  (( files == 2 )) || fail "OUTDIR holds more than the summary and the archive: $(ls "$out")"
  listing=$(tar -tzf "$out/device-check.tar.gz" 2>/dev/null)
  grep -q "status $rc after" "$out/summary.txt" || fail "the summary does not end with the exit status $rc"
}
expect_rc() { (( rc == $1 )) || fail "exit status $rc, expected $1 (output: $(tail -5 "$tmp/$scenario/stdout"))"; }
expect_file() { for f; do grep -qx "device-check/$f" <<<"$listing" || fail "the archive lacks $f"; done; }
expect_summary() { grep -qE "$1" "$out/summary.txt" || fail "the summary lacks /$1/"; }

run all-passing
expect_rc 0
expect_file env.log configure.log build.log cuda-tests.log occupancy.log sanitize-memcheck.log sanitize-racecheck.log \
  sanitize-synccheck.log bench-headline-bf16.log headline-bf16.json headline-float32.json kernel-bf16.json \
  layer-float32.json summary.txt
expect_summary "^gpu: NVIDIA H200, 9.0"
expect_summary "^occupancy on NVIDIA H200"
expect_summary "chunked fwd     chunk  64 median 0.5000 ms .*estimate 0.7-1.2 ms"
expect_summary "scan    fwd_bwd chunk  64 failed rel_err over tolerance"
grep -q "journal" <<<"$listing" && fail "a finished benchmark left its journal"

run sanitizer-finds-a-race FAKE_SAN_RACECHECK_RC=9
expect_rc 2
expect_summary "sanitize racecheck +exit 9"
expect_summary "Race reported"

run sanitizer-cannot-attach FAKE_SAN_MEMCHECK_RC=255 FAKE_SAN_RACECHECK_RC=255 FAKE_SAN_SYNCCHECK_RC=255
expect_rc 0
expect_summary "did not run here: .*Device not supported"

run tests-fail FAKE_TESTS_RC=1 FAKE_BENCH_RC=1
expect_rc 2  # the tests' failure outranks the benchmarks'
expect_file bench-headline-bf16.log headline-bf16.json

run no-gpu FAKE_TESTS_RC=77
expect_rc 2
expect_summary "skipped: All tests passed"

run benchmark-fails FAKE_BENCH_RC=1
expect_rc 3

run build-fails FAKE_BUILD_RC=2
expect_rc 1
expect_file build.log
grep -q "bench-" <<<"$listing" && fail "benchmarks ran after a failed build"

# No Python library to embed: configured again without the Python impls.
run no-python-to-embed FAKE_NO_PYTHON=1
expect_rc 0
expect_summary "^configure +exit 1"
expect_summary "^configure \\(no Python\\) +ok"
expect_file configure-with-python.log configure.log build.log headline-bf16.json

# Binaries built elsewhere: used where they start (no configure or build), built over where not.
mkdir -p "$tmp/prebuilt/tests" "$tmp/prebuilt-broken/tests"
cp "$fakes/lattnbench.in" "$tmp/prebuilt/lattnbench"
cp "$fakes/lattn_cuda_tests.in" "$tmp/prebuilt/tests/lattn_cuda_tests"
printf '#!/usr/bin/env bash\necho "error while loading shared libraries: libfmt.so.9 (stand-in)"; exit 127\n' \
  >"$tmp/prebuilt-broken/lattnbench"
cp "$tmp/prebuilt-broken/lattnbench" "$tmp/prebuilt-broken/tests/lattn_cuda_tests"
chmod +x "$tmp"/prebuilt*/lattnbench "$tmp"/prebuilt*/tests/lattn_cuda_tests

run prebuilt LATTN_DEVICE_PREBUILT="$tmp/prebuilt"
expect_rc 0
expect_summary "^build +prebuilt: $tmp/prebuilt"
expect_file cuda-tests.log headline-bf16.json
grep -q "configure.log\|build.log" <<<"$listing" && fail "configured or built beside prebuilt binaries that start"

run prebuilt-does-not-start LATTN_DEVICE_PREBUILT="$tmp/prebuilt-broken"
expect_rc 0
expect_summary "^prebuilt +does not start here: .*libfmt.so.9"
expect_file configure.log build.log headline-bf16.json

# A hanging benchmark (one that ignores TERM, too) is killed within its budget and leaves no
# journal in OUTDIR; what has no time left after it is skipped, and says so.
run benchmark-hangs LATTN_DEVICE_CHECK_SECONDS=8 FAKE_BENCH_HANG=headline-bf16 FAKE_BENCH_IGNORE_TERM=1
expect_rc 4
expect_summary "bench headline-bf16 +timed out after"
expect_summary "skipped: no time left"
expect_file bench-headline-bf16.log cuda-tests.log
(( took <= 8 + 10 )) || fail "took ${took}s with an 8 s budget"

# So little time that not even the configuration starts: skipped, status 4, the archive written.
run out-of-time LATTN_DEVICE_CHECK_SECONDS=3
expect_rc 4
expect_summary "configure +skipped: no time left"
expect_file env.log summary.txt

# --table: the cuda tests, then the table's rows cheapest first while their estimate fits the time
# left (with instant stand-ins and 130 s the four cheapest fit; the others are skipped and say
# so), and the table in the summary; no sanitizer, no headline.
script_args=(--table)
run table LATTN_DEVICE_CHECK_SECONDS=130
expect_rc 0
expect_file cuda-tests.log table-B8-T1024-H8-D64-Hk0-bf16.json table-B4-T2048-H32-D128-Hk16-bf16.json \
  table-B4-T4096-H64-D128-Hk0-bf16.json
expect_summary "^table-B8-T1024-H8-D64-Hk0-bf16 +ok"
expect_summary "^table-B1-T8192-H96-D128-Hk0-bf16 +skipped: estimate 133s"
expect_summary "^table-B2-T16384-H16-D128-Hk0-bf16 +skipped: estimate 186s"
expect_summary "^B8-T1024-H8-D64-Hk0-bf16 +additive +none +fwd +- +0.500 1e-03"
grep -q "sanitize\|headline" <<<"$listing" && fail "the table plan ran the sanitizer or the headline"
# A lattnbench without Python (the prebuilt one): the table runs ours alone and says why.
run table-no-python FAKE_LIST_RC=2 LATTN_DEVICE_CHECK_SECONDS=130
expect_rc 0
expect_summary "^fla impls +left out: listing"
expect_summary "^table-B8-T1024-H8-D64-Hk0-bf16 +ok"
script_args=()

# --dry-run: every command printed with its estimate and parsed by lattnbench --list-cases; exit 2
# when one does not parse; no OUTDIR written.
scenario=dry-run
dry=$(env LATTN_BINARY="$fakes/lattnbench.in" "$root/scripts/device_check.sh" --dry-run "$tmp/dry-out" 2>&1); rc=$?
expect_rc 0
[[ -e $tmp/dry-out ]] && fail "the dry run wrote $tmp/dry-out"
# 8 rule x decay rows, and 4 further families (RWKV-7, DeltaProduct, RWKV-6, Mamba-3) at 2 shapes
(( $(grep -c "^  lattnbench --backend cuda" <<<"$dry") == 16 )) || fail "not 16 table commands: $dry"
(( $(grep -c "^  parses" <<<"$dry") == 16 )) || fail "not every command parsed: $dry"
grep -q "^B 4 T 4096 H 64 D 128 heads_k 0 bf16: estimate 112 s" <<<"$dry" || fail "no headline estimate: $dry"
grep -q "estimate of the whole table: 982 s" <<<"$dry" || fail "no total: $dry"
(( $(grep -c -- "--check-heads 16" <<<"$dry") == 16 )) || fail "not every row checks its first 16 pairs: $dry"
grep -q -- "--rule dplr --decay vector .*--plugin .*fla.py --impl scan,chunked,fla:chunk,fla:scan" <<<"$dry" ||
  fail "no RWKV-7 row with FLA: $dry"
grep -q -- "--rule delta --decay scalar --householder 2 .*--impl scan,chunked,fla:chunk" <<<"$dry" ||
  fail "no DeltaProduct row with FLA: $dry"
grep -q -- "--bonus true .*--impl scan,chunked,fla:chunk,fla:scan" <<<"$dry" || fail "no RWKV-6 row with FLA: $dry"
grep -q -- "--rule trapezoidal --decay scalar --mimo-rank 1,4 .*--plugin .*mamba3.py --impl scan,chunked,mamba3:siso" \
  <<<"$dry" || fail "no Mamba-3 row with the authors' kernel: $dry"
grep -q -- "--heads-k 16 --plugin .*fla.py --impl scan,chunked,fla:chunk,fla:scan" <<<"$dry" || fail "no grouped-heads row with FLA: $dry"
scenario=dry-run-does-not-parse
dry=$(env LATTN_BINARY="$fakes/lattnbench.in" FAKE_LIST_RC=2 "$root/scripts/device_check.sh" --dry-run 2>&1); rc=$?
expect_rc 2
grep -q "does not parse: listing" <<<"$dry" || fail "no line saying what does not parse: $dry"
scenario=unknown-option
"$root/scripts/device_check.sh" --bogus >/dev/null 2>&1; rc=$?
expect_rc 2

if (( failures )); then
  echo "device_check_test: $failures failures"
  exit 1
fi
echo "device_check_test: every scenario passed"

#!/usr/bin/env bash
# Installs what is missing (Debian's Slurm, munge and Chromium among it, for tests/slurm and the
# history page's screenshot), then: builds
# everything with the tests (build/), builds and runs the whole suite again under ASan + UBSan
# (build-asan/; the CUDA emulation's tests among them), the CUDA emulation's tests alone under
# ThreadSanitizer (build-emu-tsan/), fuzzes the config loader, the
# command-line parser and the journal reader for 30 s each (build-fuzz/), runs clang-tidy (without
# the static analyzer: scripts/lint.sh runs it all), and
# finally runs the main suite through CTest, its Python-kernel tests in a virtual environment with
# NumPy and JAX (scripts/setup.sh --python-tests; made once, then reused: LATTN_TEST_VENV names
# another, an empty one runs them on Debian's Python, where the JAX group skips). torch stays
# opt-in (scripts/setup.sh --python-examples, then VIRTUAL_ENV).
# Skip the slow extras locally with LATTN_QUICK=1. Extra arguments go to the final ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LATTN_BUILD_DIR:-$root/build}
quick=${LATTN_QUICK:-0}
# --test-tools: the sweep test (tests/slurm) starts a private Slurm cluster; the history page's
# test opens it in Chromium.
"$root/scripts/setup.sh" --test-tools

# Each step's line says when it starts (seconds since test.sh began) and the CPU seconds the steps
# before it took (user + system, children included): CI's budget is wall time on two cores, and the
# CPU seconds say which step to shorten.
start_s=$SECONDS
step() {
  local cpu
  # Fields 16 and 17 of /proc/PID/stat: the waited-for children's user and system time, in ticks.
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.0f", ($14 + $15) / hz }' "/proc/$$/stat")
  printf '\n== %s (at %d s, %s CPU s so far)\n' "$*" $((SECONDS - start_s)) "$cpu"
}

step "build ($build_dir)"
LATTN_BUILD_DIR=$build_dir "$root/scripts/build.sh" -DBUILD_TESTING=ON

if [[ $quick != 1 ]]; then
  step "tests under ASan + UBSan (build-asan)"
  # -O1: instrumented code compiles in half the time of -O3 and still inlines enough for the
  # sanitizers to see through; CI's time goes to finding errors, not to optimising them.
  LATTN_BUILD_DIR=$root/build-asan "$root/scripts/build.sh" -DBUILD_TESTING=ON -DLATTN_CUDA=OFF \
    -DLATTN_SANITIZE=address,undefined "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"
  # The tests labelled `spawns` (tests/CMakeLists.txt) run once, in the main suite: they start
  # lattnbench, a script or an install as a child process, and test what it does (exit statuses,
  # signals, journal, files) at seconds of start-up measurements a start; under the sanitizers
  # smoke_run, the in-process cases and the fuzzers reach the same code. So does the op table on
  # emulated AMX tiles (amx_emulated_table): five minutes of scalar tile arithmetic under the
  # sanitizers, on kernels whose memory amx_emulated's own cases exercise here.
  (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --parallel "$(nproc)" --label-exclude spawns --exclude-regex "^amx_emulated_table$" | tail -4)

  step "CUDA emulation under ThreadSanitizer (build-emu-tsan)"
  # Only the emulation's targets: every CUDA thread of an emulated block is a host thread, so a data
  # race ThreadSanitizer reports there is a race between the threads of a block of a CUDA kernel
  # (and the missing-barrier test checks that it reports one).
  LATTN_BUILD_DIR=$root/build-emu-tsan LATTN_BUILD_TARGET=cuda_emulation "$root/scripts/build.sh" -DBUILD_TESTING=ON \
    -DLATTN_CUDA=OFF -DLATTN_SANITIZE=thread "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"
  (cd "$root/build-emu-tsan" && ctest --output-on-failure --parallel "$(nproc)" --tests-regex "^cuda_emulation_" | tail -4)

  # The fuzzers run one after another for a fixed time each on one core; clang-tidy takes the other
  # meanwhile.
  step "fuzzers (config, cli, journal: ${LATTN_FUZZ_SECONDS:-30} s each) and clang-tidy, side by side"
  "$root/scripts/fuzz.sh" "${LATTN_FUZZ_SECONDS:-30}" &
  fuzz_pid=$!
  lint_status=0
  "$root/scripts/lint.sh" --fast "$build_dir" || lint_status=$?
  fuzz_status=0
  wait "$fuzz_pid" || fuzz_status=$?
  ((lint_status == 0 && fuzz_status == 0)) || { echo "test.sh: clang-tidy or a fuzzer failed" >&2; exit 1; }
fi

step "tests"
test_venv=${LATTN_TEST_VENV-$HOME/.cache/lattnbench/python-tests}
if [[ -n $test_venv ]]; then
  # Without PyPI (offline) the JAX group skips, as it says; the rest of the suite runs all the same.
  if "$root/scripts/setup.sh" --python-tests "$test_venv"; then
    export VIRTUAL_ENV=$test_venv
  else
    echo "test.sh: no NumPy and JAX venv in $test_venv: python_kernels_jax will skip" >&2
  fi
fi
cd "$build_dir"
ctest --output-on-failure --parallel "$(nproc)" "$@"
step "done"

#!/usr/bin/env bash
# Builds the config fuzzer with clang (build-fuzz/) and runs it for SECONDS (default 60) from a
# seed corpus of configs/ and fuzz/regressions/. A crashing input is copied to fuzz/regressions/,
# where tests/test_fuzz_regressions.cpp replays it from then on, and the script fails.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
build_dir=${LATTN_FUZZ_BUILD_DIR:-$root/build-fuzz}
mkdir -p "$build_dir"
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DLATTN_FUZZ=ON -DLATTN_CUDA=OFF -DBUILD_TESTING=OFF >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log" >&2; exit 1; }
cmake --build "$build_dir" --target config_fuzzer --parallel "$(nproc)" >"$build_dir/build.log" 2>&1 \
  || { tail -50 "$build_dir/build.log" >&2; exit 1; }

corpus=$build_dir/corpus
artifacts=$build_dir/artifacts
mkdir -p "$corpus" "$artifacts"
cp "$root"/configs/*.yaml "$root"/fuzz/regressions/* "$corpus"/ 2>/dev/null || true
status=0
"$build_dir/config_fuzzer" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$artifacts/" "$corpus" >"$build_dir/fuzz.log" 2>&1 || status=$?
tail -3 "$build_dir/fuzz.log"
if ((status != 0)); then
  for crash in "$artifacts"/*; do
    [[ -f $crash ]] && cp "$crash" "$root/fuzz/regressions/$(basename "$crash")" && echo "fuzz: kept $(basename "$crash") in fuzz/regressions/" >&2
  done
  echo "fuzz: the config fuzzer found a failing input (log: $build_dir/fuzz.log)" >&2
  exit 1
fi

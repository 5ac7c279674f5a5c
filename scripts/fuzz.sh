#!/usr/bin/env bash
# Builds the fuzzers with clang (build-fuzz/) and runs each for SECONDS (default 30), one after
# another on one core: config_fuzzer (the config loader, seeded from configs/), cli_fuzzer (the
# command-line parser) and journal_fuzzer (the journal reader and its records), each also seeded
# from fuzz/regressions/<kind>/. A crashing input is copied to fuzz/regressions/<kind>/, where
# tests/config/test_fuzz_regressions.cpp replays it from then on, and the script fails.
# Usage: scripts/fuzz.sh [SECONDS [TARGET...]]   (targets: config cli journal; default all three)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-30}
shift || true
kinds=("$@")
((${#kinds[@]})) || kinds=(config cli journal)
build_dir=${LATTN_FUZZ_BUILD_DIR:-$root/build-fuzz}
mkdir -p "$build_dir"
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DLATTN_FUZZ=ON -DLATTN_CUDA=OFF -DBUILD_TESTING=OFF >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log" >&2; exit 1; }
targets=()
for kind in "${kinds[@]}"; do targets+=("${kind}_fuzzer"); done
cmake --build "$build_dir" --target "${targets[@]}" --parallel "$(nproc)" >"$build_dir/build.log" 2>&1 \
  || { tail -50 "$build_dir/build.log" >&2; exit 1; }

failed=0
for kind in "${kinds[@]}"; do
  corpus=$build_dir/corpus-$kind
  artifacts=$build_dir/artifacts-$kind
  mkdir -p "$corpus" "$artifacts"
  [[ $kind == config ]] && cp "$root"/configs/*.yaml "$corpus"/
  cp "$root"/fuzz/regressions/"$kind"/* "$corpus"/ 2>/dev/null || true
  status=0
  "$build_dir/${kind}_fuzzer" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$artifacts/" "$corpus" >"$build_dir/fuzz-$kind.log" 2>&1 || status=$?
  echo "fuzz $kind: $(tail -1 "$build_dir/fuzz-$kind.log")"
  if ((status != 0)); then
    for crash in "$artifacts"/*; do
      [[ -f $crash ]] && cp "$crash" "$root/fuzz/regressions/$kind/$(basename "$crash")" &&
        echo "fuzz: kept $(basename "$crash") in fuzz/regressions/$kind/" >&2
    done
    echo "fuzz: the $kind fuzzer found a failing input (log: $build_dir/fuzz-$kind.log)" >&2
    failed=1
  fi
done
exit "$failed"

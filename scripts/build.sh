#!/usr/bin/env bash
# Configures and builds lattnbench (Release) in build/ (or $LATTN_BUILD_DIR). Extra arguments go
# to the CMake configure step, e.g. -DLATTN_CUDA=OFF.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LATTN_BUILD_DIR:-$root/build}
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
# ccache, where installed, makes a second checkout's (or a clean clone's) build mostly cache hits.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
mkdir -p "$build_dir"
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log" >&2; exit 1; }
# Quiet when it works; on a failure the end of the log says why.
if ! cmake --build "$build_dir" --parallel "$(nproc)" ${LATTN_BUILD_TARGET:+--target "$LATTN_BUILD_TARGET"} \
    >"$build_dir/build.log" 2>&1; then
  tail -60 "$build_dir/build.log" >&2
  echo "build: failed (whole log: $build_dir/build.log)" >&2
  exit 1
fi

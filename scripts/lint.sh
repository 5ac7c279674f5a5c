#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over core/, kernels/, backends/ and src/ with the build's compile_commands.json; exits
# non-zero on any finding. Usage: scripts/lint.sh [--fast] [BUILD_DIR]
# --fast leaves out the clang static analyzer (about 45% of the time); scripts/test.sh uses it to
# keep CI short. Run the full check before a release or after touching kernels.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extra=()
if [[ ${1:-} == --fast ]]; then
  extra=(--checks=-clang-analyzer-*)
  shift
fi
build_dir=${1:-${LATTN_BUILD_DIR:-$root/build}}
[[ -f $build_dir/compile_commands.json ]] || { echo "lint: no $build_dir/compile_commands.json (build first)" >&2; exit 2; }
cd "$root"
# CUDA sources are left to nvcc's own warnings: clang-tidy 14 does not know CUDA 13.
mapfile -t files < <(git ls-files 'core/*.cpp' 'kernels/*.cpp' 'backends/*.cpp' 'src/*.cpp')
log=$(mktemp)
if ! printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy -p "$build_dir" --quiet "${extra[@]}" >"$log" 2>/dev/null; then
  grep -E "(warning|error):" "$log" >&2 || cat "$log" >&2
  echo "lint: clang-tidy found problems" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "lint: clang-tidy clean on ${#files[@]} files"

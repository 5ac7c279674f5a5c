#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, run lattnbench with the given
# flags (none: the built-in default suite). Example: scripts/run.sh --suite kernel --seq 8192
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
LATTN_BUILD_TARGET=lattnbench "$root/scripts/build.sh"
exec "${LATTN_BUILD_DIR:-$root/build}/lattnbench" "$@"

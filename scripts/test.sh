#!/usr/bin/env bash
# Installs what is missing, builds everything with the tests, and runs them through CTest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" -DBUILD_TESTING=ON
cd "${LATTN_BUILD_DIR:-$root/build}"
ctest --output-on-failure --parallel "$(nproc)" "$@"

#!/usr/bin/env bash
# Installs the Debian packages lattnbench builds and tests with, when any is missing.
# Idempotent, and silent when everything is already there.
set -euo pipefail

packages=(
  cmake g++ ninja-build git
  libcli11-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libopenblas-dev catch2
  python3 python3-numpy python3-scipy python3-matplotlib libbenchmark-tools
  python3-pandas python3-venv python3-setuptools python3-dev
  clang clang-tidy libclang-rt-14-dev libomp-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

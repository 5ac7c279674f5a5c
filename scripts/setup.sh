#!/usr/bin/env bash
# Installs the Debian packages lattnbench builds and tests with, when any is missing.
# Idempotent, and silent when everything is already there.
#
#   scripts/setup.sh --python-examples [DIR]   also makes a virtual environment DIR (default
#       ~/.cache/lattnbench/python-examples) over Debian's packages with what examples/python
#       needs from PyPI: torch and jax, and flash-linear-attention where nvidia-smi sees a GPU.
#       Never done without the flag. Runs then use it with VIRTUAL_ENV=DIR (docs/plugins.md).
#   scripts/setup.sh --python-tests [DIR]      the same with JAX alone (NumPy comes with it; torch's
#       wheels are gigabytes): the venv scripts/test.sh runs the Python-kernel tests in (default
#       ~/.cache/lattnbench/python-tests). Reused when JAX already imports there.
#   scripts/setup.sh --test-tools              also what only tests use: Debian's Slurm and munge
#       (slurmctld, slurmd, slurm-client, munge), for the test that runs scripts/slurm-sweep.sh on a
#       private one-node cluster (tests/slurm), and Chromium with PIL, for the test that opens
#       history.py's page and reads its screenshot; scripts/test.sh asks for them. No daemon is
#       configured or started.
set -euo pipefail

examples_venv=""
wanted=(torch jax)
test_tools=0
if [[ ${1:-} == --test-tools && $# -eq 1 ]]; then
  test_tools=1
elif [[ ${1:-} == --python-examples ]]; then
  examples_venv=${2:-$HOME/.cache/lattnbench/python-examples}
elif [[ ${1:-} == --python-tests ]]; then
  examples_venv=${2:-$HOME/.cache/lattnbench/python-tests}
  wanted=(jax)
elif [[ ${1:-} == --test-tools ]]; then
  echo "setup.sh: --test-tools takes no other argument, got '${2}'" >&2
  exit 2
elif [[ $# -gt 0 ]]; then
  echo "setup.sh: unknown argument '$1' (expected --test-tools, --python-examples [DIR] or --python-tests [DIR])" >&2
  exit 2
fi

install_python_examples() {
  [[ -n $examples_venv ]] || return 0
  [[ -x $examples_venv/bin/pip ]] || /usr/bin/python3 -m venv --system-site-packages "$examples_venv"
  if [[ ${wanted[*]} == jax ]] && "$examples_venv/bin/python3" -c "import jax, numpy" 2>/dev/null; then
    return 0
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && [[ ${wanted[*]} != jax ]] &&
    wanted+=(flash-linear-attention)
  echo "setup: installing ${wanted[*]} into $examples_venv" >&2
  "$examples_venv/bin/pip" install -q "${wanted[@]}"
  echo "setup: run lattnbench with VIRTUAL_ENV=$examples_venv for examples/python" >&2
}

packages=(
  cmake g++ ninja-build git
  libcli11-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libopenblas-dev catch2
  python3 python3-numpy python3-scipy python3-matplotlib libbenchmark-tools
  python3-pandas python3-venv python3-setuptools python3-dev
  clang clang-tidy libclang-rt-14-dev libomp-dev
)
((test_tools)) && packages+=(slurmctld slurmd slurm-client munge chromium python3-pil)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  install_python_examples
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_python_examples

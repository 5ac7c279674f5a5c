#!/usr/bin/env bash
# `pip install ./python` into a temporary virtual environment, without the network (the build
# backend and pandas come from Debian: python3-setuptools, python3-pandas), then the installed
# package (not the source tree) loads a result file and compares two. Exits 77 (skipped) where
# this Python cannot make a venv with pip (Debian: python3-venv).
#   package_install_test.sh PYTHON SOURCE_DIR
set -euo pipefail
python=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! "$python" -m venv --system-site-packages "$work/venv" >"$work/venv.log" 2>&1; then
  echo "SKIPPED: $python cannot make a venv with pip here:"; tail -3 "$work/venv.log"; exit 77
fi
# Built from a copy: pip must not leave build/ or *.egg-info in the source tree.
cp -rL "$source/python" "$work/src"
"$work/venv/bin/python" -m pip install --quiet --no-index --no-build-isolation "$work/src" >"$work/pip.log" 2>&1 \
  || { cat "$work/pip.log"; exit 1; }
rm -rf "$work/src"

cd "$work"
"$work/venv/bin/python" - "$work/venv" "$source/tests/python/fixtures" <<'PY'
import os, sys
import lattnbench
venv, fixtures = sys.argv[1], sys.argv[2]
assert lattnbench.__file__.startswith(venv), lattnbench.__file__
frame = lattnbench.load(os.path.join(fixtures, "lattnbench-real.json"))
assert len(frame) > 0 and "device.cpu_model" in frame.columns and "config.threads" in frame.columns
same = lattnbench.compare(os.path.join(fixtures, "lattnbench-cpu.json"), os.path.join(fixtures, "lattnbench-cpu.json"))
assert set(same["verdict"]) <= {"SAME", "SKIPPED"}, set(same["verdict"])
assert same.attrs["exit_status"] == 0
print("installed lattnbench package:", os.path.dirname(lattnbench.__file__), len(frame), "records")
PY

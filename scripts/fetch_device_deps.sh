#!/usr/bin/env bash
# Run HERE (Debian bookworm, with apt): downloads the Debian packages lattnbench's build needs and
# unpacks them with dpkg -x into .deps/root (ignored by git, never into /), for a machine that has
# nvcc, CMake and a C++ compiler but no package registry (the GPU machine). Trims what the build
# does not use (static BLAS, LAPACK, docs) so the folder stays under ~60 MiB. Also the
# flash-linear-attention kernels (fla-core, pure Python: the `fla` package whose fla.ops
# examples/python/fla.py calls; torch, triton and einops are on the GPU image) and QwenLM's FlashQLA
# (pure Python, but it needs TileLang, which is not carried: its binary wheel alone is larger than a
# call carries), installed with pip --no-deps --target into .deps/python, which device_check.sh puts
# on PYTHONPATH. Then carry `.deps` to that machine and run scripts/device_check.sh there
# (docs/cuda.md).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$root/.deps
packages=(
  libcli11-dev nlohmann-json3-dev catch2          # header-only (Catch2 v2 also ships a small static main)
  libfmt-dev libfmt9 libyaml-cpp-dev libyaml-cpp0.7
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0                       # what libopenblas.so.0 links against beyond the base system
)
rm -rf "$deps/debs" "$deps/root"
mkdir -p "$deps/debs" "$deps/root"
(cd "$deps/debs" && apt-get download "${packages[@]}")
for deb in "$deps"/debs/*.deb; do dpkg -x "$deb" "$deps/root"; done
rm -rf "$deps/debs"
multiarch=$deps/root/usr/lib/x86_64-linux-gnu
rm -rf "$deps/root/usr/share/doc" "$deps/root/usr/share/man" "$deps/root/usr/share/lintian"
rm -f "$multiarch"/openblas-pthread/*.a "$multiarch"/openblas-pthread/liblapack.so* "$multiarch"/openblas-pthread/libblas.so*
# The alternatives symlinks point into /etc/alternatives, which is not there; the build uses the
# openblas-pthread folder directly (device_check.sh writes an OpenBLAS config that says so).
find "$deps/root" -xtype l -delete
python_packages=(fla-core==0.6.0 flash-qla==0.1.3)
rm -rf "$deps/wheels" "$deps/python"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$deps/wheels" "${python_packages[@]}"
python3 -m pip install -q --no-deps --no-index --no-compile --target "$deps/python" "$deps"/wheels/*.whl
rm -rf "$deps/wheels"
du -sh "$deps/root" "$deps/python"
echo "unpacked into $deps/root; carry '.deps' in the device tool's run call"

#!/usr/bin/env bash
# Compiles CUDA kernel files with nvcc for sm_80 and sm_90a (the backend's machine code) with
# `-Xptxas -v` and prints each kernel's registers, stack frame and spill bytes; exits 1 when any
# kernel has a stack frame or spills (docs/cuda.md). No GPU needed.
#   scripts/ptxas_check.sh                       every .cu under kernels/
#   scripts/ptxas_check.sh kernels/x/cuda/y.cu   the files named
# NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc) picks the compiler.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || { echo "ptxas_check: no nvcc (set NVCC)" >&2; exit 2; }
files=("$@")
[[ ${#files[@]} -eq 0 ]] && mapfile -t files < <(cd "$root" && find kernels -name '*.cu' | sort)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for f in "${files[@]}"; do
  [[ -f $root/$f || -f $f ]] || { echo "ptxas_check: no file $f" >&2; exit 2; }
  src=$f
  [[ -f $root/$f ]] && src=$root/$f
  # The flags of backends/cuda/CMakeLists.txt (CUDA_STANDARD 17, --expt-relaxed-constexpr).
  if ! "$nvcc" -std=c++17 --expt-relaxed-constexpr -O3 -I"$root" -gencode=arch=compute_80,code=sm_80 \
      -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c "$src" -o "$work/out.o" >"$work/log" 2>&1; then
    cat "$work/log" >&2
    echo "ptxas_check: $f does not compile" >&2
    exit 2
  fi
  python3 - "$f" "$work/log" <<'PY' || status=1
import re, subprocess, sys
name, log = sys.argv[1], sys.argv[2]
bad, cur = 0, None
for line in open(log):
    m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", line)
    if m:
        cur = [m.group(1), m.group(2)]
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur:
        cur += [int(x) for x in m.groups()]
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and cur and len(cur) == 5:
        kernel = subprocess.run(["c++filt", cur[0]], capture_output=True, text=True).stdout.strip()
        kernel = re.sub(r"lattn::cuda::\(anonymous namespace\)::|\(lattn::\S+\)", "", kernel)
        flag = "  <-- stack frame or spills" if any(cur[2:]) else ""
        bad += bool(flag)
        print(f"{name}: {cur[1]:7s} {int(m.group(1)):3d} registers, {cur[2]} bytes stack, "
              f"{cur[3]}/{cur[4]} bytes spilled: {kernel.replace('__nv_bfloat16', 'bf16')}{flag}")
        cur = None
sys.exit(1 if bad else 0)
PY
done
[[ $status -eq 0 ]] && echo "ptxas_check: no stack frames, no spills" || echo "ptxas_check: stack frames or spills above" >&2
exit $status

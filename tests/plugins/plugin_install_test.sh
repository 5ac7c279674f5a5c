#!/usr/bin/env bash
# A plugin built outside the tree against an installed lattnbench (docs/plugins.md), in a temporary
# folder: `cmake --install` of this build into a prefix, the example plugin project copied elsewhere
# and configured with find_package(lattnbench) (CMAKE_PREFIX_PATH=prefix), built, and the
# installed binary running it beside the built-in scan and chunked, checked (exit 0) and ranked.
#   plugin_install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -x "$work/prefix/bin/lattnbench"
test -f "$work/prefix/include/lattn/plugin.h"
test -f "$work/prefix/include/lattn/plugin_v2.h"

cp -r "$source/examples/plugins" "$work/mine"
cmake -S "$work/mine" -B "$work/mine/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/mine/build" --target mine >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

cd "$work/mine/build"
# The done-when command at the kernel suite's smallest default head dim, with fewer samples.
"$work/prefix/bin/lattnbench" --plugin ./libmine.so --impl mine:scan,scan,chunked --seq 2048 --suite kernel \
  --dim 32 --mode fwd --reps 3 --warmup 1 --min-sample-ms 5 --out results.json | tee "$work/run.log"
grep -q "^kernel  mine:scan " "$work/run.log"
grep -q "Fastest impl per shape and mode:" "$work/run.log"
grep -q "then " "$work/run.log"  # the third impl is ranked too
grep -q '"sha256"' results.json
echo "plugin_install_test: ok"

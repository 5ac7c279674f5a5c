#!/usr/bin/env bash
# What `cmake --install` puts under share/lattnbench/ and beside it, used from a temporary prefix:
# the installed binary finds a config of the installed configs folder by name (one that exists
# only there), runs one, and the installed Python tools read its result file from where they lie
# (they import lattn_results.py from beside them); the man page and the bash completion list every
# flag the binary's --help lists.
#   install_test.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
bin=$work/prefix/bin/lattnbench
share=$work/prefix/share/lattnbench
for name in default smoke gated; do test -f "$share/configs/$name.yaml" || fail "no configs/$name.yaml"; done
for tool in compare ab merge plot perf_table gate_experiment history; do test -x "$share/scripts/$tool.py" || fail "no scripts/$tool.py"; done

# A config that only the installed folder holds, by its name from an unrelated folder.
printf 'suites: [kernel]\nwarmup: 1\nreps: 5\nmin_sample_ms: 1\nkernel:\n  batch: 1\n  heads: 1\n  chunk: 8\n  seq: [16]\n  dim: [4]\n  mode: [fwd]\n' \
  >"$share/configs/installtest.yaml"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$bin" --config installtest --list-cases >list.txt || fail "--config installtest: $(cat list.txt)"
grep -q '^000-kernel-scan-fwd-b1h1t16d4c8-none ' list.txt || fail "installtest's cases not listed: $(cat list.txt)"
"$bin" --config installtest.yaml --quiet --out a.json >/dev/null
"$bin" --config smoke --list-cases | grep -q -- '-layer-' || fail "--config smoke did not find the installed smoke.yaml"

# The installed tools, run as they lie.
"$share/scripts/compare.py" a.json a.json >compare.txt || fail "compare.py: $(cat compare.txt)"
grep -q 'no significant regression' compare.txt || fail "compare.py said: $(cat compare.txt)"
"$share/scripts/perf_table.py" a.json >/dev/null || fail "perf_table.py failed"
"$share/scripts/merge.py" --help >/dev/null || fail "merge.py --help failed"
"$share/scripts/history.py" add --history h.jsonl --commit install-test a.json >/dev/null || fail "history.py add failed"
"$share/scripts/history.py" html --history h.jsonl -o h.html >/dev/null || fail "history.py html failed"
grep -q 'class="chart"' h.html || fail "history.py wrote no chart"
"$share/scripts/gate_experiment.py" --pairs 1 --tries 0 "$bin" -- --config installtest >gate.txt 2>&1 ||
  fail "gate_experiment.py: $(cat gate.txt)"
grep -q '^| A/A pairs ' gate.txt || fail "gate_experiment.py printed no table: $(cat gate.txt)"

# Every flag of --help in the man page (roff writes - as \-) and in the bash completion.
man=$work/prefix/share/man/man1/lattnbench.1
completion=$work/prefix/share/bash-completion/completions/lattnbench
test -f "$man" || fail "no man page"
test -f "$completion" || fail "no bash completion"
flags=$("$bin" --help | grep -o -E '(^|[ ,])--?[a-z][a-z0-9-]*' | sed 's/^[ ,]*//' | sort -u)
[[ $(wc -l <<<"$flags") -gt 30 ]] || fail "too few flags read from --help: $flags"
for flag in $flags; do
  grep -q -F -- "$(sed 's/-/\\-/g' <<<"$flag")" "$man" || fail "the man page lacks $flag"
  grep -q -E -- "(^|[ \"])$flag( |\")" "$completion" || fail "the bash completion lacks $flag"
done
bash -n "$completion" || fail "the bash completion is not valid bash"
echo "install_test: ok ($(wc -w <<<"$flags") flags)"

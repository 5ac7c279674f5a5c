#!/bin/sh
# Writes the man page (lattnbench.1) and the bash completion of lattnbench from the built binary's
# own --help, so that both list exactly the flags the binary takes (tests/cli/install_test.sh checks
# every flag of --help is in both). Run by the build (CMakeLists.txt); POSIX sh and awk only.
#   cli_docs.sh BINARY VERSION MAN_OUT COMPLETION_OUT CONFIG_NAMES...
set -eu
binary=$1 version=$2 man_out=$3 completion_out=$4
shift 4
help=$("$binary" --help)

# Option lines of CLI11's help: two spaces, the flags (and their argument's type), two or more
# spaces, the description; flags too long for their column have the description on the next line.
options=$(printf '%s\n' "$help" | awk '
function flush() { if (flags != "") print flags "\t" text; flags = ""; text = "" }
/^  -/ {
  flush()
  line = substr($0, 3)
  split_at = match(line, /   +/)
  if (split_at == 0) { flags = line } else { flags = substr(line, 1, split_at - 1); text = substr(line, split_at); sub(/^ +/, "", text) }
  next
}
/^          +[^ ]/ && flags != "" { sub(/^ +/, ""); text = (text == "" ? $0 : text " " $0); next }
{ flush() }
END { flush() }')

{
  printf '.TH LATTNBENCH 1 "" "lattnbench %s" "User Commands"\n' "$version"
  printf '.SH NAME\nlattnbench \\- benchmark causal linear-attention kernels (scan vs chunked) on CPU and GPU\n'
  printf '.SH SYNOPSIS\n.B lattnbench\n[\\fB\\-\\-config\\fR \\fIFILE\\fR|\\fINAME\\fR] [\\fIoverrides\\fR...] [\\fB\\-\\-out\\fR \\fIFILE\\fR] [\\fB\\-\\-filter\\fR \\fIREGEX\\fR] [\\fB\\-\\-list\\-cases\\fR]\n'
  printf '.SH DESCRIPTION\n'
  printf 'Runs a suite config: each case of the plan through one backend, timed (a cold call, warm-up, a calibrated inner loop, samples until the noise target, the most samples or the timeout), checked against a float64 reference, with its scratch memory counted; writes a JSON result file.\n'
  printf 'Every config key has a flag; the command line beats the file, which beats the defaults shown below.\n'
  printf '.SH OPTIONS\n'
  printf '%s\n' "$options" | awk -F '\t' '{
    flags = $1; text = $2
    gsub(/\{[^}]*\}/, "", flags)  # the value CLI11 shows beside a negated flag: --no-interleave{false}
    gsub(/\\/, "\\\\", flags); gsub(/\\/, "\\\\", text)
    gsub(/-/, "\\-", flags)
    if (text ~ /^[.'"'"']/) text = "\\&" text
    print ".TP"
    print ".B " flags
    print text
  }'
  printf '.SH EXIT STATUS\n'
  printf '.TP\n0\nevery case ran and passed its check (unsupported cases are skipped, not failed)\n'
  printf '.TP\n1\na case failed its check or broke; the result file is still written\n'
  printf '.TP\n2\nbad usage or config: one line saying where and what\n'
  printf '.TP\n3\nan internal error\n'
  printf '.TP\n4\nthe disk refused a write; the finished cases are kept in the journal (\\-\\-resume)\n'
  printf '.TP\n130, 143\ninterrupted by SIGINT or SIGTERM; the finished cases are written\n'
  printf '.SH FILES\n'
  printf '.TP\n.I PREFIX/share/lattnbench/configs/\nthe suite configs that \\fB\\-\\-config\\fR \\fINAME\\fR finds (%s)\n' "$*"
  printf '.TP\n.I PREFIX/share/lattnbench/scripts/\ncompare.py (the regression gate), ab.py, merge.py, plot.py, perf_table.py, history.py\n'
  printf '.SH SEE ALSO\nThe project'"'"'s docs/cli.md, docs/config.md, docs/harness.md, docs/results.md and docs/compare.md.\n'
} >"$man_out"

flags=$(printf '%s\n' "$options" | cut -f1 | tr ',' '\n' | sed 's/^ *//; s/[ {].*//' | grep '^-' | tr '\n' ' ')
# The values of each flag that takes one of a list, "FLAG|FLAG WORD...", from the lists the
# binary's parser checks against (its hidden --completion-words).
words=$("$binary" --completion-words)
{
  printf '# bash completion of lattnbench %s, generated from its --help and --completion-words (cmake/cli_docs.sh)\n' "$version"
  printf '_lattnbench() {\n'
  printf '  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} list=\n'
  printf '  case $prev in\n'
  printf '%s\n' "$words" | awk '{
    flags = $1; values = ""
    for (i = 2; i <= NF; i++) values = values (i > 2 ? " " : "") $i
    # A config NAME or a path; the others are comma lists or single names: complete the word after
    # the last comma, keeping what comes before it.
    if (flags ~ /--config/) { printf "    %s) COMPREPLY=($(compgen -W \"%s\" -- \"$cur\") $(compgen -f -- \"$cur\")); return ;;\n", flags, values; next }
    printf "    %s) list=\"%s\" ;;\n", flags, values
  }'
  printf '    -o|--out|--gbench-out|--resume|--plugin) COMPREPLY=($(compgen -f -- "$cur")); return ;;\n'
  printf '    --dump) COMPREPLY=($(compgen -d -- "$cur")); return ;;\n'
  printf '  esac\n'
  printf '  if [[ -n $list ]]; then\n'
  printf '    local head= last=$cur\n'
  printf '    [[ $cur == *,* ]] && head=${cur%%,*}, last=${cur##*,}\n'
  printf '    COMPREPLY=($(compgen -P "$head" -W "$list" -- "$last"))\n'
  printf '    return\n'
  printf '  fi\n'
  printf '  COMPREPLY=($(compgen -W "%s" -- "$cur"))\n' "$flags"
  printf '}\n'
  printf 'complete -F _lattnbench lattnbench\n'
} >"$completion_out"

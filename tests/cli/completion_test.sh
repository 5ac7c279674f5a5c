#!/usr/bin/env bash
# The bash completion the build writes (build/lattnbench.bash, cmake/cli_docs.sh), run as bash
# runs it: after each flag that takes one of a list (--impl, --suite, --decay, --rule, --backend,
# ...), it offers exactly the values the binary's parser accepts, completes the word after the
# last comma of a comma list, and every value it offers is accepted by the binary.
#   completion_test.sh LATTNBENCH COMPLETION_FILE
set -euo pipefail
binary=$1
completion=$2
fail() { echo "completion_test: $*" >&2; exit 1; }
[[ -f $completion ]] || fail "no completion file $completion"
# shellcheck disable=SC1090
source "$completion"

# COMPREPLY for the command line "lattnbench WORDS... CUR", sorted, one line.
complete_words() {
  COMP_WORDS=(lattnbench "$@")
  COMP_CWORD=$(($# ))
  COMPREPLY=()
  _lattnbench
  printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' '
}

words=$("$binary" --completion-words)
for flag in --impl --suite --decay --rule --backend --mode --dtype --format --config --bwd-states; do
  grep -q -E -- "(^|\|)$flag( |$)" <<<"$words" || fail "--completion-words has no values for $flag: $words"
done

small=(--suite kernel --seq 16 --dim 4 --batch 1 --heads 1 --chunk 8)
# A key of several suites (--impl) offers the names any of them takes, and a key of one suite
# (--attention, --tokens) needs that suite: a value is accepted when one suite takes it.
small_decode=(--suite decode --dim 4 --batch 1 --heads 1 --tokens 1)
small_layer=(--suite layer --seq 16 --batch 1 --heads 1 --head-dim 4 --window 4 --chunk 8)
# The layer block's parts that need another part beside them (docs/config.md).
declare -A companion=([--attention none]="--output-gate norm" [--output-gate norm]="--attention none"
  [--gates projected]="--decay scalar --rule delta")
# A kernel key that applies beside one rule and decay only, and is refused beside the others.
declare -A kernel_companion=([--bonus true]="--rule additive --decay vector")
accepted() {
  "$binary" "$@" --list-cases >/dev/null 2>"${TMPDIR:-/tmp}/completion_test.err"
}
checked=0
while read -r flags values; do
  flag=${flags##*|}
  expected=$(tr ' ' '\n' <<<"$values" | sort | tr '\n' ' ')
  offered=$(complete_words "$flag" "")
  if [[ $flag == --config ]]; then
    # Config names and, beside them, the files of the folder: every name must be among them.
    for name in $values; do [[ " $offered " == *" $name "* ]] || fail "$flag: '$name' not offered: $offered"; done
  else
    [[ $offered == "$expected" ]] || fail "after $flag: offered '$offered', the parser's list is '$expected'"
  fi
  for value in $values; do
    # The parser takes the value: --list-cases parses and plans, and runs nothing.
    case $flag in
      --config) args=(--config "$value") ;;
      --format) args=("${small[@]}" --format "$value") ;;
      --suite) args=(--suite "$value") ;;
      *) args=("${small[@]}" "$flag" "$value") ;;
    esac
    accepted "${args[@]}" ${kernel_companion["$flag $value"]:-} || accepted "${small_decode[@]}" "$flag" "$value" ||
      accepted "${small_layer[@]}" "$flag" "$value" ${companion["$flag $value"]:-} ||
      # A build without a backend knows its name and says it was built without it.
      { [[ $flag == --backend ]] && { accepted "${small[@]}" "$flag" "$value" ||
        grep -q "was built without the" "${TMPDIR:-/tmp}/completion_test.err"; }; } ||
      fail "the completion offers '$flag $value', which the binary refuses: $(cat "${TMPDIR:-/tmp}/completion_test.err")"
    checked=$((checked + 1))
  done
done <<<"$words"

# A comma list: the word after the last comma is completed, what comes before it kept.
offered=$(complete_words --decay "none,sc")
[[ $offered == "none,scalar " ]] || fail "--decay none,sc: offered '$offered'"
offered=$(complete_words --impl "scan,")
[[ $offered == "scan,chunked scan,scan scan,step " ]] || fail "--impl scan,: offered '$offered'"
# A value the parser refuses names the same list the completion offers.
refused=$("$binary" --decay nonsense --list-cases 2>&1 || true)
for decay in $(complete_words --decay ""); do
  [[ $refused == *"$decay"* ]] || fail "the parser's message for a bad --decay does not list '$decay': $refused"
done
echo "completion_test: ok ($checked values, each accepted by the binary)"

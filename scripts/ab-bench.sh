#!/usr/bin/env bash
# A / B of two qwen36 binaries on one machine: rounds alternate (A, B, A, B, ...) so that clock
# and thermal drift within a machine start falls on both alike; each result line of `qwen36
# bench` comes out prefixed with its binary's label. Used for every "before / after" row of
# bench/RESULTS.md: compare figures of one start only, never across starts.
#   scripts/ab-bench.sh [-r ROUNDS] [-e VAR=VALUE ...] A_BIN B_BIN -- BENCH_ARGS...
#   scripts/ab-bench.sh build/base/qwen36 build/dev90/src/cli/qwen36 -- \
#       --backend cuda --synthetic qwen3.6-35b-a3b --type bf16 -p "" -n 64 -r 2 -b 1,4
# -e sets an environment variable for B only (to A / B one binary's switch: pass it twice).
set -euo pipefail
rounds=2
benv=()
while [ $# -gt 0 ]; do
  case "$1" in
    -r) rounds=$2; shift 2 ;;
    -e) benv+=("$2"); shift 2 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -lt 3 ] || [ "$3" != "--" ]; then
  echo "usage: $0 [-r ROUNDS] [-e VAR=VALUE ...] A_BIN B_BIN -- BENCH_ARGS..." >&2
  exit 2
fi
a=$1 b=$2
shift 3
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "ab-bench: $bin is not an executable" >&2; exit 2; }; done
for ((i = 1; i <= rounds; ++i)); do
  for side in A B; do
    if [ $side = A ]; then
      out=$("$a" bench "$@" 2>&1) || true
    else
      out=$(env ${benv[@]+"${benv[@]}"} "$b" bench "$@" 2>&1) || true
    fi
    # Result rows are the table's lines with a test name (pp512, tg64, ...); errors pass through.
    lines=$(printf '%s\n' "$out" | grep -E '^\| .* \| (pp|tg)[0-9]|[Ee]rror' || true)
    [ -n "$lines" ] || lines="(no result line; last output: $(printf '%s\n' "$out" | tail -1))"
    printf '%s\n' "$lines" | sed "s/^/$side round $i: /"
  done
done

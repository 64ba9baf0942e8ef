#!/usr/bin/env bash
# Runs the front-end fuzzer for a number of inputs, seeded with every cell in
# the repository, and says how many it ran. Exits non-zero on any crash.
set -euo pipefail
fuzzer=$(realpath "$1")
runs=$2
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
for f in "$top"/examples/*.cell "$top"/test/Frontend/*.cell; do
  cp "$f" "$work/corpus/$(basename "$(dirname "$f")")-$(basename "$f")"
done
cd "$work"
# ASan's leak check would flag the context the fuzzer keeps for speed.
export ASAN_OPTIONS=detect_leaks=0
if ! "$fuzzer" -runs="$runs" -max_len=4096 -timeout=10 \
     -dict="$top/test/Fuzz/cell.dict" -print_final_stats=1 corpus \
     > log 2>&1; then
  tail -60 log
  echo "fuzz: FAILED; the crashing input is in $(ls "$work"/crash-* 2>/dev/null || echo the log above)"
  cp "$work"/crash-* "$top"/ 2>/dev/null || true
  exit 1
fi
done_runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' log | grep -o '[0-9]*$')
secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' log | grep -o 'in [0-9]*' | grep -o '[0-9]*')
echo "fuzz: ${done_runs} inputs in ${secs}s, no crash"

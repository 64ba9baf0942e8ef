#!/usr/bin/env bash
# CPU benchmark: cellc against torch.nn.LSTM/GRU (and a PyTorch loop for a
# custom cell), side by side in one run, at the same thread counts. Prints
# medians in ms and the bytes kept between forward and backward per mode.
# Usage: bench/cpu/run.sh [build-dir] [repeats]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$top/build}
repeats=${2:-5}
bench=$build/bin/cellc-bench
py=/usr/bin/python3
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for threads in 1 2; do
  for cell in lstm gru; do
    for shape in "64 100" "8 500" "256 50"; do
      set -- $shape
      echo
      "$bench" "$top/examples/$cell.cell" -D H=256 -D I=256 --batch-size "$1" \
        --seq-len "$2" --cpu-threads "$threads" --repeats "$repeats" \
        --mode none,full,chunk:16
      OMP_NUM_THREADS=$threads "$py" "$top/bench/cpu/torch_rnn.py" --cell "$cell" \
        --batch "$1" --seq-len "$2" --threads "$threads" --repeats "$repeats"
    done
  done
  echo
  "$bench" "$top/examples/peephole_lstm.cell" -D H=256 -D I=256 --batch-size 64 \
    --seq-len 100 --cpu-threads "$threads" --repeats "$repeats" --mode none,full
  OMP_NUM_THREADS=$threads "$py" "$top/bench/cpu/torch_rnn.py" --cell peephole_lstm \
    --batch 64 --seq-len 100 --threads "$threads" --repeats "$repeats"
done

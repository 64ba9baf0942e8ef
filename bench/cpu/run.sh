#!/usr/bin/env bash
# The CPU benchmark: cellc against torch.nn.LSTM/GRU, oneDNN's LSTM/GRU
# training primitives and a PyTorch loop of a custom cell, side by side in one
# process per thread count (bench/cpu/compare.py). One core means one core for
# everyone: taskset, and one BLAS and OpenMP thread for torch, oneDNN and
# cellc alike; two threads give everyone two.
# Usage: bench/cpu/run.sh [build-dir] [rounds]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$top/build}
rounds=${2:-7}
py=/usr/bin/python3
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# Debian's OpenBLAS 0.3.21 does not know AMD's AVX-512 cores (Zen 4 and
# later) and runs its AVX2 kernels on them, at half the speed of its AVX-512
# ones. Where the core has AVX-512, everyone here gets those (torch's BLAS,
# the sgemm ceiling and cellc's f64 GEMMs are OpenBLAS and read
# OPENBLAS_CORETYPE; cellc's f32 GEMMs run on its own AVX-512 kernel there),
# unless it is set.
has_avx512() {
  local f
  for f in avx512f avx512bw avx512dq avx512vl avx512cd; do
    grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f" || return 1
  done
}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && has_avx512; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(detected)}"
run() {
  local threads=$1 cores=$2
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads PYTHONPATH="$build/python" \
    taskset -c "$cores" "$py" "$top/bench/cpu/compare.py" --threads "$threads" \
    --repeats "$rounds" --build "$build"
}
run 1 0
echo
run 2 0,1
echo
# Variable lengths: cellc's per-sample lengths against torch's PackedSequence.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH="$build/python" \
  taskset -c 0 "$py" "$top/bench/cpu/lengths.py" --repeats "$rounds"
echo
# Cells with reductions and block-diagonal weights against PyTorch loops.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH="$build/python" \
  taskset -c 0 "$py" "$top/bench/cpu/cells.py" --repeats "$rounds"
echo
# Training memory: the process's peak over a training step against torch's,
# each in a fresh process, with cellc's prediction beside it.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH="$build/python" \
  taskset -c 0 "$py" "$top/bench/cpu/memory.py"

#!/usr/bin/env bash
# Installs what cellc needs from Debian 12's archive, if it is missing.
# Idempotent: it installs nothing when everything is there.
set -euo pipefail

packages=(
  # The toolchain.
  build-essential cmake ninja-build ccache git
  # LLVM/MLIR 19: libMLIR.so, mlir-tblgen, FileCheck, lit, not, count.
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  # lld's static libraries: the CPU kernels are linked in-process, with no C
  # compiler on the machine that compiles a cell.
  liblld-19-dev
  # clang-19 and its runtimes, for the libFuzzer target.
  clang-19 libclang-rt-19-dev
  # The CPU runtime's BLAS, tests and benchmarks.
  libgtest-dev libbenchmark-dev libopenblas-dev
  # The Python package (its libraries are loaded with ctypes), and torch for
  # autograd and the tests.
  python3 python3-numpy python3-pytest python3-torch
  # pytest's workers: make pytest runs the suite's files on JOBS of them.
  python3-pytest-xdist
  # The CPU benchmark's strongest peer (bench/cpu): oneDNN's RNN primitives.
  libdnnl-dev
  # dnnl-config.cmake requires OpenCL; libdnnl-dev only recommends it, and
  # --no-install-recommends below skips recommends: without it cmake fails.
  ocl-icd-opencl-dev
  # `pip install .` and its test: pip, venv (scikit-build-core comes from PyPI).
  python3-pip python3-venv
)
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "cellc: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"

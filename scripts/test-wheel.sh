#!/usr/bin/env bash
# make test-wheel: the wheel (make wheel) as a stranger's machine sees it.
# In a private mount namespace (unshare -m, as root) LLVM 19, the C compilers,
# the source tree and its builds are hidden, and so are Debian's OpenBLAS and oneDNN unless
# the torch that needs them is Debian's; a fresh venv installs the wheel and uses it
# from elsewhere: it compiles a cell from a string, trains an LSTM against
# torch.nn.LSTM, runs cellc, cellc-opt and cellc-tune from the venv's bin/,
# and builds and loads a CPU package (scripts/check_installed.py).
#
#   test-wheel.sh full   torch from PyPI (its wheels, about 4 GB with CUDA's,
#                        from $CELLC_WHEELS, by default ~/.cache/cellc-wheels,
#                        downloaded once): everything above hidden.
#   test-wheel.sh lite   Debian's torch (--system-site-packages), which links
#                        Debian's OpenBLAS and oneDNN, so that those stay;
#                        the wheel's libraries are checked (ldd) to need
#                        neither. What `make test` runs: no 4 GB download.
set -euo pipefail
mode="${1:-full}"
root="$(cd "$(dirname "$0")/.." && pwd)"
wheels="${CELLC_WHEELS:-$HOME/.cache/cellc-wheels}"
torch_version="${CELLC_TORCH2:-2.9.1}"
wheel="$(ls "$root"/dist/cellc-*.whl 2>/dev/null | head -1 || true)"
[ -n "$wheel" ] || { echo "test-wheel: no dist/cellc-*.whl: run make wheel" >&2; exit 1; }
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  # make test runs the lite part as root (README: a fresh Debian 12 as root);
  # elsewhere it says so and passes over it.
  echo "test-wheel ($mode): skipped: it needs root and unshare -m (a private mount namespace)"
  [ "$mode" = lite ] && exit 0
  exit 1
fi
work="$(mktemp -d /tmp/cellc-wheel.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cp "$wheel" "$root/scripts/check_installed.py" "$root/scripts/check_any_python.py" "$work/"
build="${WHEEL_BUILD:-build-wheel}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
cp -r "$build/deps" "$work/deps"

if [ "$mode" = full ]; then
  mkdir -p "$wheels"
  /usr/bin/python3 -m pip download -q -d "$wheels" "torch==$torch_version" numpy
fi

# What a stranger's machine lacks; Debian's OpenBLAS too where torch is PyPI's.
# The C compilers too (gcc's cc1 and collect2, clang-14's whole tree): a CPU
# package is linked in-process, by the lld inside the wheel.
hide=(/usr/lib/llvm-19 "$root" /usr/lib/gcc /usr/lib/llvm-14)
if [ "$mode" = full ]; then
  hide+=(/usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu/blas
         /usr/lib/x86_64-linux-gnu/lapack)
fi
hidden_files=(/usr/lib/x86_64-linux-gnu/libdnnl.so* /usr/lib/x86_64-linux-gnu/libopenblas*)
[ "$mode" = full ] || hidden_files=()

unshare -m --propagation private env MODE="$mode" WORK="$work" WHEELS="$wheels" \
  TORCH="$torch_version" ROOT="$root" WHEEL="$(basename "$wheel")" \
  bash -s -- "${hide[@]}" -- "${hidden_files[@]}" <<'EOS'
set -euo pipefail
while [ "$1" != -- ]; do
  if [ -e "$1" ]; then mount -t tmpfs -o size=1m none "$1"; fi
  shift
done
shift
for f in "$@"; do
  if [ -e "$f" ]; then mount --bind /dev/null "$f"; fi
done
echo "== hidden: /usr/lib/llvm-19 ($(ls /usr/lib/llvm-19 | wc -l) entries now), $ROOT," \
  "the C compilers$([ "$MODE" = full ] && echo ", oneDNN, OpenBLAS")"
for gone in "$ROOT/CMakeLists.txt" /usr/lib/llvm-19/lib/libMLIR.so; do
  if [ -e "$gone" ]; then echo "test-wheel: $gone is not hidden" >&2; exit 1; fi
done
if echo 'int main(void) { return 0; }' | cc -x c - -o "$WORK/a.out" 2>/dev/null; then
  echo "test-wheel: cc still compiles" >&2; exit 1
fi
cd "$WORK"
if [ "$MODE" = full ]; then
  echo "== a fresh venv with torch $TORCH from PyPI, and the wheel"
  /usr/bin/python3 -m venv venv
  venv/bin/pip install -q --no-index --find-links "$WHEELS" --find-links deps \
    "torch==$TORCH" numpy "$WHEEL"
else
  echo "== a fresh venv that sees Debian's torch, and the wheel"
  /usr/bin/python3 -m venv --system-site-packages venv
  venv/bin/pip install -q --no-index --find-links deps "$WHEEL"
fi
echo "   $(venv/bin/python -c 'import torch; print("torch", torch.__version__)'); " \
  "$(venv/bin/pip list 2>/dev/null | grep -E '^(cellc|scipy-openblas32) ' | tr -s ' ' | tr '\n' ' ')"
site="$(venv/bin/python -c 'import cellc, os; print(os.path.dirname(cellc.__file__))')"
for lib in "$site"/*.so; do
  need="$(ldd "$lib")"
  if echo "$need" | grep -E "not found|libLLVM|libMLIR|libopenblas\.|libdnnl|$root/"; then
    echo "test-wheel: $lib needs what a stranger lacks" >&2
    exit 1
  fi
done
echo "== the libraries need nothing hidden (ldd)"
mkdir elsewhere && cd elsewhere
export CELLC_CACHE_DIR="$WORK/cache"
PATH="$WORK/venv/bin:$PATH" "$WORK/venv/bin/python" "$WORK/check_installed.py" "$WORK/venv" \
  </dev/null
# The same wheel under every other CPython from 3.9 that this machine has
# (pyenv's, where there is one), without torch: its compiler and runtime
# through the package's ctypes modules (check_any_python.py).
"$WORK/venv/bin/pip" install -q --no-index --no-deps --target "$WORK/any" "$WORK/$WHEEL" \
  "$WORK"/deps/scipy_openblas32-*.whl
others=0
for py in "$HOME"/.pyenv/versions/3.*/bin/python3; do
  [ -x "$py" ] || continue
  minor=$("$py" -c 'import sys; print(sys.version_info[1])')
  [ "$minor" -ge 9 ] || continue
  "$py" "$WORK/check_any_python.py" "$WORK/any" </dev/null
  others=$((others + 1))
done
echo "== $others other CPythons ran the wheel (none but this one where there is no pyenv)"
EOS
echo "test-wheel ($mode): ok"

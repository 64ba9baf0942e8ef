#!/usr/bin/env bash
# The install path, as a user takes it: build the wheel from a clean copy of
# the tree, install it into a fresh virtual environment that sees Debian's
# torch, and use it from outside the tree: import, train an LSTM step with
# gradients against torch, compile a cell from a string, run the tools.
#
# Objects come from ccache where the main build put them: CCACHE_BASEDIR
# makes the paths of both trees relative, the wheel builds in `build-wheel/`,
# as deep as `build/`, and with the same compiler (pip's environment would
# otherwise pick x86_64-linux-gnu-g++, another name for it that ccache hashes
# apart). 25 s instead of 3 minutes here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=/usr/bin/python3
work="$(mktemp -d /tmp/cellc-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT

echo "== a clean copy of the tree (tracked and unignored files) in $work/src"
mkdir -p "$work/src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
   xargs -0 -I{} sh -c 'test -e "{}" && echo "{}"' |
   tar -cf - -T -) | tar -xf - -C "$work/src"

echo "== python3 -m venv --system-site-packages venv; venv/bin/pip install ."
$python -m venv --system-site-packages "$work/venv"
start=$(date +%s)
# `pip install .` builds the wheel (scikit-build-core from PyPI) and installs
# it, as the README says.
(cd "$work/src" && CCACHE_BASEDIR="$work/src" CC="${CC:-/usr/bin/cc}" CXX="${CXX:-/usr/bin/c++}" \
   "$work/venv/bin/python" -m pip install . -q --config-settings=build-dir=build-wheel)
echo "   built and installed in $(( $(date +%s) - start )) s:" \
  "$("$work/venv/bin/python" -m pip list 2>/dev/null | grep '^cellc ')"

echo "== used from outside the tree"
mkdir -p "$work/elsewhere"
cd "$work/elsewhere"
export CELLC_CACHE_DIR="$work/cache"
PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$root/scripts/check_installed.py" "$work/venv"
echo "install: ok"

"""The wheel's compiled part under any CPython, without torch (test-wheel.sh):
the wheel installed into SITE (pip --target), its compiler and runtime loaded
by the package's own ctypes modules, a CPU package of an Elman cell built
and run forward in float64 on plain ctypes buffers, against the same
recurrence in Python, and `cellc --version` run in-process. Which Python
runs this is the point: py3-none means no CPython ABI in the wheel.

Usage: python3.X check_any_python.py SITE
"""

import ctypes
import math
import os
import random
import subprocess
import sys
import types

site = sys.argv[1]
# The package's directory without its __init__ (which imports torch): its
# ctypes modules need nothing else.
package = types.ModuleType("cellc")
package.__path__ = [os.path.join(site, "cellc")]
sys.modules["cellc"] = package
from cellc import _cellc, _cellc_runtime  # noqa: E402

SOURCE = """
cell elman {
  input x: [I]
  state h: [H]
  param W: [H, I], U: [H, H], b: [H]
  h = tanh(W @ x + U @ h + b)
}
"""
T, B, I, H = 3, 2, 3, 4
path, *_ = _cellc.prepare_package(SOURCE, "elman.cell", {"I": I, "H": H}, "f64",
                                  use_cache=False)
cell = _cellc_runtime.load(path)
rng = random.Random(1)


def buffer(*shape):
    n = math.prod(shape)
    data = (ctypes.c_double * n)(*[rng.uniform(-0.5, 0.5) for _ in range(n)])
    return data, list(shape)


x, W, U, b = buffer(T, B, I), buffer(H, I), buffer(H, H), buffer(H)
out, h0, final = buffer(T, B, H), buffer(B, H), buffer(B, H)
pairs = lambda *bs: [(ctypes.addressof(d), shape) for d, shape in bs]  # noqa: E731
cell.forward(pairs(x), pairs(W, U, b), pairs(h0), 0, T, B, False, pairs(out), pairs(final),
             "none", [])
worst = 0.0
h = [[h0[0][r * H + j] for j in range(H)] for r in range(B)]
for t in range(T):
    for r in range(B):
        xs = [x[0][(t * B + r) * I + i] for i in range(I)]
        h[r] = [math.tanh(sum(W[0][j * I + i] * xs[i] for i in range(I))
                          + sum(U[0][j * H + k] * h[r][k] for k in range(H)) + b[0][j])
                for j in range(H)]
        worst = max(worst, max(abs(out[0][(t * B + r) * H + j] - h[r][j]) for j in range(H)))
assert worst < 1e-12, worst
tool = subprocess.run([sys.executable, "-c", f"""
import sys, types
package = types.ModuleType("cellc"); package.__path__ = [{os.path.join(site, 'cellc')!r}]
sys.modules["cellc"] = package
from cellc import _tools
_tools.run_in_process("cellc", ["--version"])
"""], capture_output=True, text=True)
assert tool.returncode == 0 and "cellc (cellc)" in tool.stdout, (tool.stdout, tool.stderr)
print(f"Python {sys.version.split()[0]}: an Elman package compiled and run, worst error "
      f"{worst:.1e}; {tool.stdout.splitlines()[0]}")

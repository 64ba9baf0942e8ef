"""cellc: a compiler for recurrent cells.

Write the gate math of one step of a cell, and train it under PyTorch autograd
with fused forward and backward kernels::

    import cellc, torch
    cell = cellc.compile(open("examples/lstm.cell").read())
    out, final = cell(x, params, states, save_gates=False, resets=is_init)

A bad cell raises `cellc.CellError` (a ValueError) with `file:line:col`
messages; `cellc.SizeError`, a CellError, when only the sizes make it bad.
`cellc.nn.LSTM` and `cellc.nn.GRU` are drop-ins for `torch.nn.LSTM`/`GRU`.
Compiled kernels are cached in `$CELLC_CACHE_DIR` (default `~/.cache/cellc`);
`cellc.autotune` (or the `cellc-tune` tool) tunes the kernel config of a cell
for this machine and the JIT uses the result.

`cellc.load_package(path)` runs a CPU package (`cellc --emit=package
--target=cpu`) with the runtime alone: importing cellc and loading a package
loads neither the compiler nor MLIR and LLVM, which load on first use of
anything that compiles.
"""

from ._cellc_runtime import __version__, empty_cache
from .package import Package, load_package
# The torch operators (torch >= 2.4), registered at import: a program that
# torch.export saved loads in a process that has only imported cellc. Their
# implementation loads the compiler when it first runs.
from . import _ops  # noqa: F401


def _make_cell(spec):
    """The Cell of an op's key (cellc._ops.make_cell), made where none lives."""
    from .core import Cell
    return Cell(spec["source"], spec["file"], spec["target"], spec["threads"],
                dict(spec["cuda"]), spec.get("unit_slices"))


_ops.make_cell = _make_cell


def _share_openmp():
    """Runs the runtime's threads on OpenMP's when torch's ops run on the same
    OpenMP runtime: after each parallel op, torch's threads spin for a while
    on the cores that a pool of the runtime's own would need. Debian's torch
    links the system's libgomp.so.1, and pip's bundles a libgomp.so.1 that the
    runtime then shares (whichever loads first serves both). LSTM 64 x 100
    trained on two threads in 58 to 67 ms this way, against 69 to 85. Not
    where the process maps two OpenMP runtimes (the wheel's, which auditwheel
    vendors under a name of its own, beside torch's), nor where $CELLC_OPENMP says
    (1 on, 0 off)."""
    import os
    import torch
    from ._cellc_runtime import set_tasks_on_openmp
    if "CELLC_OPENMP" in os.environ or not getattr(torch._C, "has_openmp", False):
        return
    runtimes = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(("libgomp", "libiomp", "libomp")):
                    runtimes.add(os.path.realpath(path))
    except (OSError, IndexError):
        return
    if len(runtimes) == 1:
        set_tasks_on_openmp(True)


_share_openmp()

_COMPILER = {"Cell": "core", "autotune": "core", "compile": "core",
             "CellError": "_cellc", "SizeError": "_cellc", "cache_dir": "_cellc"}


def __getattr__(name):
    # The compiler (libcellc_compiler.so: MLIR and LLVM) loads on first use.
    import importlib
    if name == "nn":
        return importlib.import_module(".nn", __name__)
    if name in _COMPILER:
        return getattr(importlib.import_module("." + _COMPILER[name], __name__), name)
    raise AttributeError(f"module 'cellc' has no attribute {name!r}")


__all__ = ["Cell", "CellError", "Package", "SizeError", "autotune", "compile", "cache_dir",
           "empty_cache", "load_package", "nn", "__version__"]

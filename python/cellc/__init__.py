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

_COMPILER = {"Cell": "core", "autotune": "core", "compile": "core",
             "CellError": "_cellc", "SizeError": "_cellc", "cache_dir": "_cellc"}


def __getattr__(name):
    # The compiler (the _cellc extension, MLIR and LLVM) loads on first use.
    import importlib
    if name == "nn":
        return importlib.import_module(".nn", __name__)
    if name in _COMPILER:
        return getattr(importlib.import_module("." + _COMPILER[name], __name__), name)
    raise AttributeError(f"module 'cellc' has no attribute {name!r}")


__all__ = ["Cell", "CellError", "Package", "SizeError", "autotune", "compile", "cache_dir",
           "empty_cache", "load_package", "nn", "__version__"]

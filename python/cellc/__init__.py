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
"""

from ._cellc import CellError, SizeError, __version__, cache_dir
from .core import Cell, autotune, compile
from . import nn

__all__ = ["Cell", "CellError", "SizeError", "autotune", "compile", "cache_dir", "nn",
           "__version__"]

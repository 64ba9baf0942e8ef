"""cellc: a compiler for recurrent cells.

Write the gate math of one step of a cell, and train it under PyTorch autograd
with fused forward and backward kernels::

    import cellc, torch
    cell = cellc.compile(open("examples/lstm.cell").read())
    out, final = cell(x, params, states, save_gates=False, resets=is_init)

`cellc.nn.LSTM` and `cellc.nn.GRU` are drop-ins for `torch.nn.LSTM`/`GRU`.
Compiled kernels are cached in `$CELLC_CACHE_DIR` (default `~/.cache/cellc`).
"""

from ._cellc import cache_dir
from .core import Cell, compile
from . import nn

__all__ = ["Cell", "compile", "cache_dir", "nn"]

"""Run a CPU package (`cellc --emit=package --target=cpu`) without the
compiler: the runtime alone, which loads no MLIR and no LLVM. For a server
that trains or serves cells compiled elsewhere."""

import torch

from . import _cellc_runtime, _ops
from ._front import Fixed

_TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64}


class Package:
    """A CPU package, loaded: called like a compiled cell (`cellc.Cell`), at
    the sizes it was compiled at. Outputs and gradients under autograd."""

    def __init__(self, path, threads=0):
        self._compiled = _cellc_runtime.load(str(path), threads)
        self.path = self._compiled.path
        #: The sizes it was compiled at, and its torch dtype.
        self.sizes = dict(self._compiled.sizes)
        self.dtype = _TORCH_DTYPES[self._compiled.dtype]
        #: (name, shape) of each declared input, state, param and output; a
        #: matrix state's shape is its declared dims ([NH, K, V]).
        self.inputs = list(self._compiled.inputs)
        dims = self._compiled.state_dims
        self.states = [(n, list(dims.get(n, shape))) for n, shape in self._compiled.states]
        self.params = list(self._compiled.params)
        self.outputs = list(self._compiled.outputs)
        # What a call is checked against (cellc._front), and its name in the
        # operators.
        self._front = Fixed(_ops.CpuRunner(self._compiled), "this package", self.inputs,
                            self.params, self.states, [n for n, _ in self.outputs], "cpu",
                            dtype=self.dtype)
        self._front._key = _ops.front_key(self._front, {"package": self.path})

    @property
    def saved_bytes(self):
        """Bytes the last call keeps for its backward (0 without autograd)."""
        return self._front.saved_bytes

    def __repr__(self):
        return (f"cellc.Package({self.path!r}, sizes={self.sizes}, "
                f"inputs={[n for n, _ in self.inputs]}, states={[n for n, _ in self.states]}, "
                f"params={[n for n, _ in self.params]}, outputs={[n for n, _ in self.outputs]})")

    @property
    def threads(self):
        return self._compiled.threads

    @threads.setter
    def threads(self, value):
        self._compiled.threads = value

    def __call__(self, x, params, states=None, *, save_gates=True, resets=None,
                 recompute=None, batch_first=False, lengths=None):
        """As `cellc.Cell.__call__`: `x` a tensor `[T, B, n]` (or a dict of
        them), `params` and `states` dicts; returns (output, final states)."""
        return _ops.call(self._front, x, params, states, save_gates=save_gates,
                         resets=resets, recompute=recompute, batch_first=batch_first,
                         lengths=lengths)

    def memory_stats(self):
        """The bytes the runtime held in the last call (see Cell.memory_stats)."""
        return self._compiled.memory_stats()

    def memory_plan(self, steps, batch, recompute="full"):
        """What a training step of `steps` x `batch` holds (see Cell.memory_plan)."""
        return self._compiled.memory_plan(steps, batch, recompute)


def load_package(path, threads=0):
    """Loads the CPU package in directory `path` (kernels.json, save.so and
    replay.so, as `cellc --emit=package --target=cpu -o path` writes them)
    with the runtime alone: no compiler, MLIR or LLVM is loaded. `threads`:
    threads for the recurrent kernels (0: one per core)."""
    return Package(path, threads)

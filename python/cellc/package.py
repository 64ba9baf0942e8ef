"""Run a CPU package (`cellc --emit=package --target=cpu`) without the
compiler: the runtime alone, which loads no MLIR and no LLVM. For a server
that trains or serves cells compiled elsewhere."""

import torch

from . import _cellc_runtime
from ._autograd import (_arguments, _check_lengths, _check_resets, _flat_states, _parse_mode,
                        _run, _shaped_states)

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
        #: Bytes the last call keeps for its backward (0 without autograd).
        self.saved_bytes = 0

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
        names_in = [n for n, _ in self.inputs]
        names_par = [n for n, _ in self.params]
        inputs, params, missing = _arguments(x, params, states, names_in, names_par,
                                             [n for n, _ in self.states])
        params = [params[n] for n in names_par]
        for t in inputs + params + list((states or {}).values()):
            if t.dtype != self.dtype:
                raise TypeError(f"this package runs {self.dtype}; got a {t.dtype} tensor")
            if t.device.type != "cpu":
                raise ValueError(f"a CPU package runs CPU tensors; got one on {t.device}")
        lead = (1, 0) if batch_first else (0, 1)
        layout = "[B, T, n]" if batch_first else "[T, B, n]"
        x0 = inputs[0]
        T, B = (x0.shape[lead[0]], x0.shape[lead[1]]) if x0.dim() == 3 else (-1, -1)
        for (name, shape), t in zip(self.inputs, inputs):
            if t.dim() != 3 or (t.shape[lead[0]], t.shape[lead[1]]) != (T, B) \
                    or t.shape[2] != shape[0]:
                raise ValueError(f"input '{name}' must be {layout} with n = {shape[0]} and "
                                 f"the first input's T, B; got shape {list(t.shape)}")
        for (name, shape), t in zip(self.params, params):
            if list(t.shape) != list(shape) and name not in missing:
                raise ValueError(f"param '{name}' must have shape {list(shape)}, "
                                 f"got {list(t.shape)}")
        for name, shape in self.states:
            t = (states or {}).get(name)
            if t is not None and list(t.shape) != [B, *shape]:
                want = "n" if len(shape) == 1 else "dims"
                raise ValueError(f"state '{name}' must be [B, {want}] = {[B, *shape]}, "
                                 f"got {list(t.shape)}")
        resets = _check_resets(resets, T, B, batch_first)
        mode = _parse_mode(save_gates, recompute)
        lengths = _check_lengths(lengths, T, B)
        out, final, self.saved_bytes = _run(self._compiled, inputs, params,
                                            _flat_states(states, B), resets, mode, lengths,
                                            batch_first)
        # A matrix state comes back in its declared dims, as from cellc.Cell.
        return out, _shaped_states(final, dict(self.states))

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

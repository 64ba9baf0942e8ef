"""The front door of a call: the one checker of a call's arguments, shared by
compiled cells (cellc.compile), CPU packages (cellc.load_package) and CUDA
packages (cellc.cuda.CudaCell), with one wording. `check` turns what a caller
gave into a `Call`: time-major tensors in declaration order, the sizes they
bind, the recompute mode. cellc._ops runs it.

What a call is checked against is a *front*: an object with
- `inputs`, `params`, `states` ((name, dims) each) and `outputs` (names);
- Sizes' `bind_sizes`, `_state_shapes` and `shape` (cellc._sizes) over its
  declarations `_decls`;
- `_placement(device)`: whether tensors there run the CUDA kernels, after
  checking that the front runs tensors there at all;
- `_storage_dtype()`: the CUDA kernels' storage of the sequences (None:
  the inputs' dtype);
- `_check_dtype(dtype)` (a package runs the dtype it was compiled for);
- `_runner(sizes, dtype, device, batch, seq_len)` and `layout(sizes, dtype,
  mode, has_lengths, device)`, which cellc._ops uses.

This file imports torch, the standard library and cellc._sizes alone, so
that a GPU machine without cellc's extensions loads it beside cuda.py."""

import collections

import torch

from ._sizes import Sizes


def _flat_states(states, B):
    """The states given (a dict, or None) as the kernels' `[B, n]`: a matrix
    state `[B, NH, K, V]` is the vector of its elements in row-major order."""
    if states is None:
        return None
    return {n: t if t.dim() == 2 else t.reshape(B, -1) for n, t in states.items()}


#: The dtypes the CPU kernels run, by their names in the compiler.
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def _one_dtype(tensors):
    """The dtype all of `tensors` share (an error names two that differ)."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise TypeError(f"all tensors must have one dtype; got {dtype} and {t.dtype}")
    return dtype


def _check_lengths(lengths, T, B):
    """Per-sample lengths as a list of B ints in [0, T] ([] for none): from
    an int64 CPU tensor of shape [B], as torch's PackedSequence keeps them, or
    a list."""
    if lengths is None:
        return []
    lengths = _lengths_tensor(lengths, B).tolist()
    bad = [n for n in lengths if n < 0 or n > T]
    if bad:
        raise ValueError(f"lengths must be in [0, T = {T}], got {bad[0]}")
    return lengths


def _lengths_tensor(lengths, B):
    """Per-sample lengths as an int64 CPU tensor [B] (or None), its
    values unread: what the torch operators take."""
    if lengths is None:
        return None
    if isinstance(lengths, torch.Tensor):
        if lengths.dtype != torch.int64:
            raise TypeError(f"lengths must be an int64 tensor, got {lengths.dtype}")
        if lengths.device.type != "cpu":
            raise ValueError(f"lengths must be on the CPU (as PackedSequence keeps them), "
                             f"got {lengths.device}")
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be [B], got shape {list(lengths.shape)}")
    elif isinstance(lengths, (list, tuple)) and all(isinstance(n, int) for n in lengths):
        lengths = torch.tensor(list(lengths), dtype=torch.int64)
    else:
        raise TypeError("lengths must be an int64 tensor or a list of ints")
    if lengths.shape[0] != B:
        raise ValueError(f"expected {B} lengths, one a sample, got {lengths.shape[0]}")
    return lengths


def _arguments(x, params, states, names_in, names_par, names_st):
    """Checks a call's tensors against the cell's names: `x` is a tensor (one
    input) or a dict, `params` a dict, `states` None or a dict of some
    states. Returns the inputs in declaration order, the params with a
    tensor of no elements for each one not given, and the names of those:
    a param the cell declares and never reads may be left out (the runtime
    says which param is missing where the kernels read it)."""
    if not names_in:
        raise ValueError("this cell declares no input; the Python API needs one to "
                         "know T and B")
    if isinstance(x, dict):
        missing = [n for n in names_in if n not in x]
        if missing:
            raise ValueError(f"no tensor for input {missing[0]!r}")
        inputs = [x[n] for n in names_in]
    else:
        if len(names_in) != 1:
            raise ValueError(f"this cell has inputs {names_in}: pass a dict of tensors")
        inputs = [x]
    if not isinstance(params, dict):
        raise TypeError("params must be a dict from param names to tensors")
    extra = [n for n in params if n not in names_par]
    if extra:
        raise ValueError(f"{extra[0]!r} is not a param of this cell; it has {names_par}")
    if states is not None:
        if not isinstance(states, dict):
            raise TypeError("states must be None or a dict from state names to tensors")
        extra = [n for n in states if n not in names_st]
        if extra:
            raise ValueError(f"{extra[0]!r} is not a state of this cell; it has {names_st}")
    for t in list(inputs) + list(params.values()) + list((states or {}).values()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
    missing = [n for n in names_par if n not in params]
    if missing:
        params = dict(params)
        for n in missing:
            params[n] = inputs[0].new_empty(0)
    return inputs, params, missing


def _bind(cell, shapes, missing, given=None):
    """`cell.bind_sizes(shapes, given)`, where a size that only a missing
    param would bind says that the param is missing."""
    try:
        return cell.bind_sizes(shapes, given)
    except ValueError as e:
        if missing and not str(e).startswith(("sizes names", "the size ")):
            raise ValueError(f"no tensor for param {missing[0]!r}") from None
        raise


def _check_resets(resets, T, B, batch_first, device=None):
    """Resets as a uint8 tensor [T, B] ([B, T] batch-first), or None; on
    `device`, the other tensors', where it is given."""
    if resets is None:
        return None
    want = (B, T) if batch_first else (T, B)
    if not isinstance(resets, torch.Tensor) or tuple(resets.shape) != want:
        raise ValueError(f"resets must be a bool tensor of shape {list(want)}")
    if device is not None and resets.device != device:
        raise ValueError(f"resets are on {resets.device}, but the other tensors are on "
                         f"{device}")
    return resets.to(torch.uint8).contiguous()


def _autocast_cpu_of_torch():
    """The function that says whether autocast is on for the CPU, as this
    torch asks it: chosen once, since a streaming step asks every call (a
    TypeError caught each time cost 0.4 us of a 31 us step)."""
    try:
        torch.is_autocast_enabled("cpu")
        return lambda: torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled


_autocast_cpu = _autocast_cpu_of_torch()


def _compiling_of_torch():
    """Whether torch.compile or torch.export is tracing: torch.compiler's
    is_compiling, looked up once (a torch without it never compiles)."""
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


_compiling = _compiling_of_torch()


def recompute_mode(save_gates, recompute):
    """The recompute mode of a call, as the runtime parses it: `recompute`
    ("none", "full" or "chunk:K"), or without it "none" where gates are
    saved and "full" where not. The runtime checks the words and says what
    it takes (the one message, runtime/driver); here only that it is a
    string."""
    if recompute is None:
        return "none" if save_gates else "full"
    if not isinstance(recompute, str):
        raise ValueError(f"recompute must be 'none', 'full' or 'chunk:K' with K > 0, "
                         f"not {recompute!r}")
    return recompute


def shaped_states(final, dims):
    """The final states (each `[B, n]`) in their declared dims: `dims` maps a
    matrix state to its `[NH, K, V]`; any other state is returned as it is."""
    return {n: t.reshape(t.shape[0], *dims[n]) if n in dims else t for n, t in final.items()}


def one_step(x, batch_first, dims=3):
    """The step of a one-step sequence `x` ([1, B, n], [B, 1, n] batch-first;
    a dict of them; with `dims` 2, unbatched [1, n]) as a step takes it
    ([B, n] or [n]), or None where `x` is not one step of tensors."""
    at = 1 if batch_first and dims == 3 else 0
    if isinstance(x, torch.Tensor):
        return x.select(at, 0) if x.dim() == dims and x.shape[at] == 1 else None
    if type(x) is dict and x:
        steps = {n: one_step(t, batch_first, dims) for n, t in x.items()}
        return None if any(t is None for t in steps.values()) else steps
    return None


#: A checked call: `inputs` time-major [T, B, n] in declaration order,
#: `params` in declaration order (an empty tensor for one not given),
#: `states` None or a dict of [B, n], `resets` uint8 [T, B] or None,
#: `lengths` an int64 CPU tensor [B] (values unread) or None.
Call = collections.namedtuple(
    "Call", "inputs params states resets lengths mode sizes B batch_first cuda")


def check(front, x, params, states=None, *, save_gates=True, resets=None, recompute=None,
          batch_first=False, lengths=None, sizes=None):
    """Checks a call of `front` (see the module's doc) and returns its Call,
    or None for a batch of B = 0 rows (which `empty_batch` runs)."""
    names_in = [n for n, _ in front.inputs]
    names_par = [n for n, _ in front.params]
    inputs, params, missing = _arguments(x, params, states, names_in, names_par,
                                         [n for n, _ in front.states])
    tensors = list(inputs) + [params[n] for n in names_par] + list((states or {}).values())
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"cellc runs cells on CPU and CUDA tensors, not {device.type}")
    cuda = front._placement(device)
    if cuda:
        for t in tensors:
            if t.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"cellc's CUDA kernels take float32 or bfloat16 tensors, "
                                f"not {t.dtype}")
        # The kernels store the sequences as the CUDA option `storage` says,
        # or else as the inputs are: the inputs are cast to it
        # (differentiably) and the outputs come in it; the params and
        # states are float32.
        storage = front._storage_dtype() or _one_dtype(inputs)
        inputs = [t.to(storage) for t in inputs]
        params = {n: t.float() for n, t in params.items()}
        states = {n: t.float() for n, t in states.items()} if states is not None else None
    else:
        if _autocast_cpu():
            # Under autocast, the CPU kernels run float32, as autocast runs
            # its float32 ops: lower-precision tensors are cast up.
            up = lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
            inputs = [up(t) for t in inputs]
            params = {n: up(t) for n, t in params.items()}
            states = {n: up(t) for n, t in states.items()} if states is not None else None
        front._check_dtype(inputs[0].dtype)
        dtype = _one_dtype(list(inputs) + list(params.values())
                           + list((states or {}).values()))
        if dtype not in _DTYPES:
            raise TypeError(f"cellc runs float32 and float64 tensors on the CPU, not "
                            f"{dtype} (under torch.autocast it casts bfloat16 and "
                            f"float16 to float32)")
    for name, t in zip(names_in, inputs):
        if t.dim() != 3:
            layout = "[B, T, n]" if batch_first else "[T, B, n]"
            raise ValueError(f"input '{name}' must be {layout}, got shape {list(t.shape)}")
    T, B = (inputs[0].shape[1], inputs[0].shape[0]) if batch_first else inputs[0].shape[:2]
    if T == 0:
        raise ValueError(f"the sequence needs T >= 1 steps; input '{names_in[0]}' has "
                         f"shape {list(inputs[0].shape)}")
    for n, t in zip(names_in, inputs):
        lead = (t.shape[1], t.shape[0]) if batch_first else tuple(t.shape[:2])
        if lead != (T, B):
            raise ValueError(f"input '{n}' has T, B = {lead}, but '{names_in[0]}' has {(T, B)}")
    shapes = {n: (t.shape[2],) for n, t in zip(names_in, inputs)}
    shapes.update({n: tuple(params[n].shape) for n in names_par if n not in missing})
    shapes.update(front._state_shapes(states, B))
    given = dict(getattr(front, "given_sizes", None) or {})
    given.update(sizes or {})
    sizes = _bind(front, shapes, missing, given)
    mode = recompute_mode(save_gates, recompute)
    resets = _check_resets(resets, T, B, batch_first, device)
    lengths = _lengths_tensor(lengths, B)
    if B == 0:
        _check_lengths(lengths, T, B)
        return None
    if batch_first:
        inputs = [t.transpose(0, 1) for t in inputs]
        resets = resets.transpose(0, 1).contiguous() if resets is not None else None
    return Call(inputs, [params[n] for n in names_par], _flat_states(states, B), resets,
                lengths, mode, sizes, B, batch_first, cuda)


class Fixed(Sizes):
    """The front of a package, at the sizes it was compiled at: its
    declarations are numbers, bound as a Cell binds symbols (one wording).
    `runner` runs it (cellc._ops.CpuRunner, or a CudaCell); `devices` says
    which tensors it runs: "cpu", "cuda", or "emulator" (the CUDA kernels on
    CPU tensors)."""

    size_symbols = []

    def __init__(self, runner, name, inputs, params, states, outputs, devices, storage=None,
                 dtype=None):
        self.runner, self.name, self.devices = runner, name, devices
        self.storage, self.dtype = storage, dtype
        self.inputs = [(n, list(dims)) for n, dims in inputs]
        self.params = [(n, list(dims)) for n, dims in params]
        self.states = [(n, list(dims)) for n, dims in states]
        self.outputs = list(outputs)
        number = lambda dims: [[(int(d), ())] for d in dims]
        self._decls = ([("input", n, number(d)) for n, d in self.inputs]
                       + [("state", n, number(d)) for n, d in self.states]
                       + [("param", n, number(d)) for n, d in self.params])
        self.saved_bytes = 0
        self._last = None

    def _placement(self, device):
        want = "cuda" if self.devices == "cuda" else "cpu"
        if device.type != want:
            runs = {"cpu": "CPU tensors", "cuda": "CUDA tensors",
                    "emulator": "CPU tensors (the SIMT emulator's)"}[self.devices]
            raise ValueError(f"{self.name} runs {runs}, but the tensors are on {device}")
        return self.devices != "cpu"

    def _storage_dtype(self):
        return self.storage

    def _check_dtype(self, dtype):
        if self.dtype is not None and dtype != self.dtype:
            raise TypeError(f"{self.name} runs {self.dtype} tensors, not {dtype}")

    def _runner(self, sizes, dtype, device, batch=0, seq_len=100):
        return self.runner

    def layout(self, sizes, dtype, mode, has_lengths, device=None):
        return self.runner.layout(mode, has_lengths)

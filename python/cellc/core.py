"""The functional API: compile a cell, bind its sizes from tensors, run it
under autograd."""

import builtins
import collections
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import shutil
import warnings

import torch

from . import _cellc, _cellc_runtime, _ops, _tools
from ._autograd import (_arguments, _autocast_cpu, _bind, _check_lengths, _check_resets,
                        _compiling, _flat_states, _lengths_tensor, _parse_mode, _run,
                        _shaped_states)

_DTYPES = {torch.float32: "f32", torch.float64: "f64"}

#: What a direct step needs, checked once per shape (Cell._step_plan): the
#: step's compiled cell, the names of the inputs and params, the outputs'
#: widths, each state's (name, width, shape), the states' names in order,
#: a one-item list holding the step bound to these shapes (a BoundStep,
#: made by the first step that gives every state; None until then), and one
#: holding Cell.step's short path once bound (_stream_step).
_StepPlan = collections.namedtuple(
    "_StepPlan", "compiled names_in names_par widths_out widths_st state_names bound stream")


def _stream_function(plan, signature, guard, fetch, result, tensors, new_shapes, env):
    """The short path of a stream's steps once `plan`'s step is bound: a
    function of `signature` that runs the step where `guard` holds and the
    tensors that `fetch` gives (the inputs, params and states in `plan`'s
    order) each have the type, shape, dtype and layout of those in
    `tensors`, no gradient is wanted and autocast is off, and returns
    `result` (over the outputs o0.. and the new states n0.., shaped as
    `new_shapes`); None, running nothing, where any of that differs (the
    caller then takes the checked path, which says what is wrong).

    Its code is written out for these tensors, as namedtuple writes its
    class: straight-line checks cost half of the same in a loop, and at B = 1
    a microsecond of Python is 3% of a step."""
    first_state = len(plan.names_in) + len(plan.names_par)
    env = dict(env, T=(torch.Tensor, torch.nn.Parameter), D=tensors[0].dtype,
               grad_enabled=torch.is_grad_enabled, autocast=_autocast_cpu,
               bound=plan.bound, empty_like=torch.empty_like)
    ts = [f"t{i}" for i in range(len(tensors))]
    checks = []
    for i, t in enumerate(ts):
        env[f"S{i}"] = tensors[i].shape
        checks.append(f"type({t}) not in T or {t}.shape != S{i} or {t}.dtype is not D "
                      f"or not {t}.is_cpu or not {t}.is_contiguous()")
    B = tensors[0].shape[0]
    allocs = [f"o{i} = t0.new_empty(({B}, {w}))" for i, w in enumerate(plan.widths_out)]
    for i, shape in enumerate(new_shapes):
        old = tensors[first_state + i]
        # empty_like is torch's cheapest allocation.
        allocs.append(f"n{i} = empty_like({ts[first_state + i]})" if tuple(old.shape) == shape
                      else f"n{i} = t0.new_empty({tuple(shape)})")
    results = [f"o{i}" for i in range(len(plan.widths_out))] + [
        f"n{i}" for i in range(len(new_shapes))]
    params = ts[len(plan.names_in):first_state]
    nl = "\n        "
    source = f"""
def step({signature}):
    if not ({guard}):
        return None
    {", ".join(ts)}, = {", ".join(fetch)},
    if ({(" or" + nl).join(checks)}):
        return None
    if grad_enabled() and ({" or ".join(t + ".requires_grad" for t in ts)}):
        return None
    if autocast() or bound[0] is None:
        return None
    {"; ".join(allocs)}
    if not bound[0].run([{", ".join(t + ".data_ptr()" for t in ts + results)}],
                        [{", ".join(p + "._version" for p in params)}]):
        bound[0] = None  # another B stepped since, or other threads
        return None
    return {result}
"""
    exec(builtins.compile(source, f"<cellc stream of {plan.compiled.path}>", "exec"), env)
    step = env["step"]
    step.plan = plan
    return step


def _no_stream(plan):
    """The short path of steps that cannot take one: always the checked path."""
    step = lambda *args: None
    step.plan = plan
    return step


def _stream_step(plan, x, params, states, output_names):
    """Cell.step's short path (_stream_function) for steps whose x, params
    and states come as in this call: the same names, tensors alike; none
    (_no_stream) where they do not come as dicts of tensors."""
    named = isinstance(x, dict)
    if (type(params) is not dict or type(states) is not dict
            or named and type(x) is not dict):
        return _no_stream(plan)
    names_in, names_par, names_st = plan.names_in, plan.names_par, plan.state_names
    guard = [f"type(params) is dict and len(params) == {len(params)}",
             f"type(states) is dict and len(states) == {len(states)}"]
    if named:
        guard.append(f"type(x) is dict and len(x) == {len(x)}")
        fetch = [f"x.get({n!r})" for n in names_in]
    else:
        guard.append("type(x) is not dict")
        fetch = ["x"]
    fetch += [f"params.get({n!r})" for n in names_par]
    fetch += [f"states.get({n!r})" for n in names_st]
    tensors = [x[n] for n in names_in] if named else [x]
    tensors += [params.get(n) for n in names_par] + [states.get(n) for n in names_st]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return _no_stream(plan)
    B = tensors[0].shape[0]
    outs = (["o0"] if len(output_names) == 1 else
            ["{" + ", ".join(f"{n!r}: o{i}" for i, n in enumerate(output_names)) + "}"])
    news = "{" + ", ".join(f"{n!r}: n{i}" for i, n in enumerate(names_st)) + "}"
    return _stream_function(plan, "x, params, states", " and ".join(guard), fetch,
                            f"{outs[0]}, {news}", tensors,
                            [(B, *shape) for _, _, shape in plan.widths_st], {})


def _size_text(terms):
    parts = []
    for coefficient, names in terms:
        factors = ([str(coefficient)] if coefficient != 1 or not names else []) + list(names)
        parts.append("*".join(factors))
    return " + ".join(parts)


def _mismatch(kind, name, shape, actual, terms, dim, known, sizes, source):
    """What bind_sizes says of a tensor whose dim `dim` is not the `known`
    value of its declared `terms`: the sizes it reads, and which tensor bound
    each."""
    symbols = sorted({n for t in shape for _, ns in t for n in ns if n in sizes})
    origins = []
    for n in symbols:
        by = source.get(n)
        origins.append(f"{n}={sizes[n]}" + (f" from {by[0]} '{by[1]}' {list(by[2])}"
                                            if by and by[1] != name else ""))
    origin = ", ".join(origins)
    if kind == "input":
        return (f"input '{name}' has width {dim}, but the cell expects {_size_text(terms)} = "
                f"{known} ({origin})")
    want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
    return (f"{kind} '{name}' is declared {want} (with {origin}) but the tensor for it has "
            f"shape {list(actual)}")


def _size_value(terms, sizes):
    """A declared size's value: the sum of its terms, each a coefficient times
    bound symbols."""
    total = 0
    for coefficient, names in terms:
        value = coefficient
        for n in names:
            if n not in sizes:
                raise ValueError(f"the size {n} is not bound; give it as {n}=...")
            value *= sizes[n]
        total += value
    return total


def _jit(source, file_name, sizes, dtype, threads, batch, step=False, unit_slices=None):
    """The JIT: the cell's CPU package, built by the compiler (or found in the
    kernel cache), loaded by the runtime as cellc.load_package loads one.
    `step`: the package of a streaming step, whose kernels compute the
    products of inputs themselves. `unit_slices`: Cell's."""
    path, from_cache, origin, temporary, threads, unit_slices = _cellc.prepare_package(
        source, file_name, sizes, dtype, threads, True, batch, step, unit_slices)
    try:
        compiled = _cellc_runtime.load(path, threads, from_cache, origin)
        compiled.unit_slices = unit_slices
        return compiled
    finally:
        if temporary:  # no cache: the shared objects stay mapped
            shutil.rmtree(path, ignore_errors=True)


class Cell:
    """A cell compiled from source: parsed and checked now, JIT-compiled per
    (sizes, dtype) on first use, and cached on disk."""

    def __init__(self, source, file_name="<cell>", target=None, threads=0, cuda=None,
                 unit_slices=None):
        targets = list(_cellc.Target.__members__) + [EMULATED]
        if target is not None and target not in targets:
            raise ValueError(f"unknown target {target!r}; expected None, "
                             + " or ".join(repr(t) for t in targets))
        self.cuda_options = dict(cuda or {})
        #: The emulator's schedule: nonzero shuffles the threads' order between
        #: sync points with this seed (target="cuda-emu" only).
        self.shuffle_seed = self.cuda_options.pop("shuffle_seed", 0)
        if self.shuffle_seed and target != EMULATED:
            raise TypeError(f"the CUDA option 'shuffle_seed' is the SIMT emulator's; it "
                            f"needs target={EMULATED!r}")
        unknown = set(self.cuda_options) - _CUDA_OPTIONS
        if unknown:
            raise TypeError(f"unknown CUDA option {sorted(unknown)[0]!r}; expected one of "
                            f"{sorted(_CUDA_OPTIONS)}")
        # The words as the command line takes them, checked now rather than
        # at the first call.
        for option, words in (("storage", _cellc.Storage), ("precision", _cellc.Precision)):
            value = self.cuda_options.get(option)
            if value is not None and value not in words.__members__:
                raise ValueError(f"unknown {option} {value!r}; expected "
                                 + " or ".join(repr(w) for w in words.__members__))
        self.source = source
        self.file_name = file_name
        self.target = target
        #: Whether the CUDA kernels run in the SIMT emulator, on CPU tensors.
        self.emulated = target == EMULATED
        self.threads = threads
        #: With fewer batch tiles than threads on the CPU: True, the threads
        #: of a tile split its units; False, its rows; None, its rows where
        #: each thread gets 4 or more and its copy of the weights is small.
        self.unit_slices = unit_slices
        decls = _cellc.declarations(source, file_name)
        self._decls = decls
        pick = lambda kind: [(name, [_size_text(t) for t in shape])
                             for k, name, shape in decls if k == kind]
        self.inputs = pick("input")
        self.states = pick("state")
        self.params = pick("param")
        # Checked now, at a size that most chunk counts divide, so that errors
        # that do not depend on sizes (unknown names, a state never assigned)
        # show at compile time; warnings (an unused param) are issued here.
        symbols = {n for _, _, shape in decls for terms in shape for _, names in terms
                   for n in names}
        #: The size symbols, in the order the torch operators list their values.
        self.size_symbols = sorted(symbols)
        self.outputs = _cellc.output_names(source, file_name)
        try:
            _, messages = _cellc.emit(source, file_name, {s: 60 for s in symbols},
                                      "f32", "mlir")
        except _cellc.SizeError:
            pass  # wrong only at the trial size; the real sizes are checked on use
        else:
            if messages:
                warnings.warn(messages, stacklevel=3)
        self._compiled = {}
        self._layouts = {}
        self._cuda = {}
        self._key = _ops.cell_key(self) if _ops.AVAILABLE else None
        #: Bytes the last call keeps for its backward (0 without autograd).
        self.saved_bytes = 0
        # The compiled cell of the last call on the CPU (memory_stats).
        self._last = None
        # Direct steps' checked plans, by the tensors' shapes and dtypes.
        self._step_plans = {}
        # The short paths (_stream_step) of the last bound steps, the latest
        # first.
        self._streams = []

    # What a Cell compiled and bound is its own: a copy (copy.deepcopy,
    # torch.save of a module) starts without it and compiles again, from the
    # kernel cache, with its own name in the ops and its own memory_stats.
    _RUNTIME_STATE = {"_compiled": dict, "_layouts": dict, "_cuda": dict,
                      "_step_plans": dict, "_last": lambda: None,
                      "_streams": list, "_key": lambda: None,
                      "saved_bytes": int}

    def __getstate__(self):
        state = dict(self.__dict__)
        for name, empty in self._RUNTIME_STATE.items():
            state[name] = empty()
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("unit_slices", None)  # pickled before it was
        self._key = _ops.cell_key(self) if _ops.AVAILABLE else None

    def __repr__(self):
        return (f"cellc.Cell(inputs={self.inputs}, states={self.states}, "
                f"params={[n for n, _ in self.params]}, outputs={self.outputs})")

    # Sizes -------------------------------------------------------------------

    def shape(self, name, sizes):
        """The shape of the declared `name` at `sizes` (a dict from size
        symbols to ints)."""
        for _, declared, shape in self._decls:
            if declared == name:
                return [_size_value(terms, sizes) for terms in shape]
        raise KeyError(f"the cell declares no {name!r}")

    def bind_sizes(self, shapes):
        """Solves the symbolic sizes from `shapes`, a dict from declared names
        to the shapes of the tensors given for them. The params bind first,
        then the states, then the inputs: where a tensor disagrees with sizes
        already bound, the error is about that tensor (the data is more often
        the odd one out than the weights) and names what bound them."""
        sizes, source = {}, {}
        pending = []
        first = {"param": 0, "state": 1, "input": 2}
        for kind, name, shape in sorted(self._decls, key=lambda d: first.get(d[0], 3)):
            if name not in shapes:
                continue
            actual = tuple(shapes[name])
            if len(actual) != len(shape):
                want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
                raise ValueError(f"{kind} '{name}' is declared {want} but the tensor for it "
                                 f"has shape {list(actual)}")
            for terms, dim in zip(shape, actual):
                pending.append((kind, name, shape, actual, terms, dim))

        def settle(stage):
            """Binds what the tensors of the kinds in `stage` (None: all)
            determine, until nothing more is."""
            progress = True
            while pending and progress:
                progress = False
                for item in list(pending):
                    kind, name, shape, actual, terms, dim = item
                    if stage is not None and kind not in stage:
                        continue
                    known, unknown = 0, []
                    for coefficient, names in terms:
                        missing = [n for n in names if n not in sizes]
                        value = coefficient
                        for n in names:
                            value *= sizes.get(n, 1)
                        if missing:
                            unknown.append((value, missing))
                        else:
                            known += value
                    if not unknown:
                        if known != dim:
                            raise ValueError(_mismatch(kind, name, shape, actual, terms, dim,
                                                       known, sizes, source))
                        pending.remove(item)
                        progress = True
                    elif len(unknown) == 1 and len(unknown[0][1]) == 1:
                        coefficient, (symbol,) = unknown[0]
                        rest = dim - known
                        if rest <= 0 or rest % coefficient:
                            want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
                            raise ValueError(f"{kind} '{name}' is declared {want} but the "
                                             f"tensor for it has shape {list(actual)}: no size "
                                             f"{symbol} fits")
                        sizes[symbol] = rest // coefficient
                        source[symbol] = (kind, name, actual)
                        progress = True

        # The params first, to a fixed point; then with the states; then all.
        for stage in (("param",), ("param", "state"), None):
            settle(stage)
        if pending:
            names = sorted({n for *_, terms, _ in pending for _, ns in terms for n in ns
                            if n not in sizes})
            raise ValueError(f"cannot bind the sizes {', '.join(names)} from the tensors given")
        return sizes

    def _state_shapes(self, states, B):
        """The shape of each state given (a dict of `[B, ...]`, or None) without
        its B, for bind_sizes."""
        declared = dict(self.states)
        shapes = {}
        for n, t in (states or {}).items():
            dims = declared.get(n, ["n"])
            if t.dim() != 1 + len(dims) or t.shape[0] != B:
                want = "n" if len(dims) == 1 else ", ".join(dims)
                raise ValueError(f"state '{n}' must be [B, {want}] with B={B}, got "
                                 f"{list(t.shape)}")
            shapes[n] = tuple(t.shape[1:])
        return shapes

    def jit(self, sizes, dtype, batch=0, seq_len=100, step=False):
        """The compiled cell for `sizes` and a torch dtype (cached). With the
        `batch` it will run at, a tuned config for that batch's power-of-two
        bucket (cellc-tune, `cellc.autotune`) is used; with CELLC_AUTOTUNE=1 a
        missing one is tuned first (budget: CELLC_AUTOTUNE_BUDGET seconds,
        default 30). `step`: the kernels of `Cell.step`, which compute the
        products of inputs in the step instead of a GEMM over the sequence."""
        if dtype not in _DTYPES:
            raise TypeError(f"cellc runs float32 and float64 tensors on the CPU, not {dtype}")
        # The batch's bucket picks the kernels' default shape (per-row kernels
        # for one row, a batch tile that fits a small batch) whatever the
        # threads; a tuned config applies only with the default threads.
        bucket = _bucket(batch) if batch else 0
        key = (tuple(sorted(sizes.items())), dtype, bucket, step)
        if key not in self._compiled:
            if (bucket and not step and self.threads == 0 and os.environ.get("CELLC_AUTOTUNE") == "1"
                    and _cellc.tuned_config(self.source, sizes, _DTYPES[dtype], batch) is None):
                budget = float(os.environ.get("CELLC_AUTOTUNE_BUDGET", "30"))
                autotune(self, sizes, batch=batch, seq_len=seq_len, dtype=dtype,
                         budget=budget)
            self._compiled[key] = _jit(self.source, self.file_name, sizes, _DTYPES[dtype],
                                       self.threads, batch if bucket else 0, step,
                                       self.unit_slices)
        return self._compiled[key]

    def layout(self, sizes, dtype, mode, has_lengths, device=torch.device("cpu")):
        """What a call at `sizes` returns and keeps, from the cell's interface
        (no sizes of T or B in it): a dict with the (width, dtype) of the
        "outputs" and final "states", the "kept" buffers of a training
        forward in `mode` as (per chunk, width, dtype) and the outputs it
        "read"s as states' histories. Compiles the cell at `sizes` if it is
        not compiled yet."""
        key = (tuple(sorted(sizes.items())), dtype, mode, has_lengths, device.type)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._runner(sizes, dtype, device).layout(mode, has_lengths)
            self._layouts[key] = layout
        return layout

    def _runner(self, sizes, dtype, device, batch=0, seq_len=100):
        """What runs the torch operators' calls at `sizes` on `device`: the
        JIT-compiled cell (for `batch`'s tuned config; batch 0: any compiled
        one) or the CUDA kernels, each with layout, forward_kept and
        backward_kept."""
        if self._runs_cuda(device):
            return self._cuda_cell(sizes, dtype, device)
        same = [c for (s, d, _, step), c in self._compiled.items()
                if s == tuple(sorted(sizes.items())) and d == dtype and not step
                ] if not batch else []
        return _ops.CpuRunner(same[0] if same
                              else self.jit(sizes, dtype, batch=batch, seq_len=seq_len))

    def emit(self, stage, sizes=None, dtype=torch.float32, save_gates=None):
        """The IR at `stage`: "mlir", "split", "grad", "saves", "plan", "phases",
        "kernels", "llvm" or "ptx" (the CUDA kernels for sm_90, gates saved
        unless `save_gates` is False). `sizes` binds the symbolic sizes."""
        if stage == _cellc.Emit.ptx.name:
            path = self.cuda_package(sizes or {})
            with open(os.path.join(path, "replay.ptx" if save_gates is False else "save.ptx")) as f:
                return f.read()
        text, _ = _cellc.emit(self.source, self.file_name, sizes or {}, _DTYPES.get(dtype, "f32"),
                              stage, -1 if save_gates is None else int(bool(save_gates)))
        return text

    # Running -----------------------------------------------------------------

    def __call__(self, x, params, states=None, *, save_gates=True, resets=None,
                 recompute=None, batch_first=False, lengths=None):
        names_in = [n for n, _ in self.inputs]
        names_par = [n for n, _ in self.params]
        inputs, params, missing = _arguments(x, params, states, names_in, names_par,
                                             [n for n, _ in self.states])
        if _autocast_cpu() and inputs[0].device.type == "cpu":
            # Under autocast, the CPU kernels run float32, as autocast runs
            # its float32 ops: lower-precision tensors are cast up.
            up = lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
            inputs = [up(t) for t in inputs]
            params = {n: up(t) for n, t in params.items()}
            states = {n: up(t) for n, t in states.items()} if states is not None else None
        tensors = list(inputs) + [params[n] for n in names_par]
        devices = {t.device for t in tensors + list((states or {}).values())}
        if len(devices) > 1:
            raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
        device = devices.pop()
        storage = self._storage_dtype() if self._runs_cuda(device) else None
        if storage is None:
            dtype = _one_dtype(tensors + list((states or {}).values()))
        else:
            # The CUDA option `storage` chooses how the kernels store the
            # sequences: the inputs are cast to it (differentiably), and the
            # outputs come in it; the params and states are float32.
            for t in tensors + list((states or {}).values()):
                if t.dtype not in (torch.float32, torch.bfloat16):
                    raise TypeError(f"cellc's CUDA kernels take float32 or bfloat16 tensors, "
                                    f"not {t.dtype}")
            inputs = [t.to(storage) for t in inputs]
            params = {n: t.float() for n, t in params.items()}
            states = ({n: t.float() for n, t in states.items()} if states is not None
                      else None)
            dtype = storage
        if device.type not in ("cpu", "cuda"):
            raise RuntimeError(f"cellc runs cells on CPU and CUDA tensors, not {device.type}")
        cuda = _cellc.Target.cuda.name
        if self.emulated and device.type != "cpu":
            raise ValueError(f"target={EMULATED!r} runs the CUDA kernels in the SIMT emulator "
                             f"on CPU tensors, but the tensors are on {device}")
        if ((device.type == "cuda") != (self.target == cuda) and self.target is not None
                and not self.emulated):
            raise ValueError(f"this cell was compiled with target={self.target!r}, "
                             f"but the tensors are on {device}")
        for name, t in zip(names_in, inputs):
            if t.dim() != 3:
                layout = "[B, T, n]" if batch_first else "[T, B, n]"
                raise ValueError(f"input '{name}' must be {layout}, got shape {list(t.shape)}")
        T, B = (inputs[0].shape[1], inputs[0].shape[0]) if batch_first else inputs[0].shape[:2]
        if T == 0:
            raise ValueError(f"the sequence needs T >= 1 steps; input '{names_in[0]}' has "
                             f"shape {list(inputs[0].shape)}")
        shapes = {n: (t.shape[2],) for n, t in zip(names_in, inputs)}
        for n, t in zip(names_in, inputs):
            lead = (t.shape[1], t.shape[0]) if batch_first else tuple(t.shape[:2])
            if lead != (T, B):
                raise ValueError(f"input '{n}' has T, B = {lead}, but '{names_in[0]}' has {(T, B)}")
        shapes.update({n: tuple(params[n].shape) for n in names_par if n not in missing})
        shapes.update(self._state_shapes(states, B))
        sizes = _bind(self, shapes, missing)
        mode = _parse_mode(save_gates, recompute)
        if B == 0:
            _check_resets(resets, T, B, batch_first, device)
            _check_lengths(lengths, T, B)
            return self._call_empty_batch(names_in, inputs, params, states, resets,
                                          batch_first, save_gates=save_gates,
                                          recompute=recompute)
        states = _flat_states(states, B)
        resets = _check_resets(resets, T, B, batch_first, device)
        if dtype == torch.bfloat16 and self._runs_cuda(device):
            # bf16 is the CUDA kernels' storage of the sequences; their params
            # and states are float32 (autograd casts the gradients back).
            params = {n: t.float() for n, t in params.items()}
            states = ({n: t.float() for n, t in states.items()} if states is not None
                      else None)
        if _ops.AVAILABLE:
            out, final = self._call_op(sizes, inputs, [params[n] for n in names_par], states,
                                       resets, mode, batch_first, lengths)
        elif self._runs_cuda(device):
            out, final = self._call_cuda(sizes, names_in, inputs, names_par, params, states,
                                         resets, save_gates, recompute, batch_first, device,
                                         _check_lengths(lengths, T, B))
        else:
            compiled = self.jit(sizes, dtype, batch=B, seq_len=T)
            out, final, self.saved_bytes = _run(compiled, inputs,
                                                [params[n] for n in names_par], states, resets,
                                                mode, _check_lengths(lengths, T, B),
                                                batch_first)
            self._last = compiled
        return out, _shaped_states(final, {n: self.shape(n, sizes) for n, dims in self.states
                                           if len(dims) > 1})

    def _call_empty_batch(self, names_in, inputs, params, states, resets, batch_first,
                          **options):
        """A call over B = 0 rows, as torch's RNNs take one: empty outputs and
        final states, and gradients of zeros for the params. One row of zeros
        runs in the batch's place and is cut away, so that the call and its
        backward take the usual path (CPU, CUDA, the torch operator)."""
        dim = 0 if batch_first else 1

        def pad(t, at=dim):
            return torch.cat([t, t.new_zeros(*t.shape[:at], 1, *t.shape[at + 1:])], at)

        x = {n: pad(t) for n, t in zip(names_in, inputs)}
        out, final = self(x if len(names_in) > 1 else x[names_in[0]], params,
                          None if states is None else {n: pad(t, 0) for n, t in states.items()},
                          resets=None if resets is None else pad(resets),
                          batch_first=batch_first, **options)
        cut = lambda t, at=dim: t.narrow(at, 0, 0)
        out = {n: cut(o) for n, o in out.items()} if isinstance(out, dict) else cut(out)
        return out, {n: cut(t, 0) for n, t in final.items()}

    def step(self, x, params, states=None):
        """One step, as a stream runs the cell (an RL actor, a model served
        token by token): `x` is `[B, n]` (a dict for several inputs),
        `params` as for a call, `states` a dict of `[B, n]` (those missing
        start at zero). Returns `(output, new_states)`: the output `[B, n]`
        (a dict when there are several) and every state after the step.
        Under no_grad on the CPU it calls the kernel directly, with what it
        checked and allocated kept per shape; where gradients are wanted, or
        on CUDA, it is the call of a one-step sequence, and gradients flow
        as through any call."""
        for stream in self._streams:
            done = stream(x, params, states)
            if done is not None:
                return done
        plan = self._step_plan(x, params, states)
        if plan is None:
            return self._step_as_sequence(x, params, states)
        inputs = [x[n] for n in plan.names_in] if isinstance(x, dict) else [x]
        st = ([None] * len(plan.state_names) if states is None
              else [states.get(n) for n in plan.state_names])
        outs, news = self._step_run(plan, inputs, params, st)
        if plan.bound[0] is not None:
            # Made once a plan, and the last few kept: steps that alternate
            # between plans (the layers of a module, each its own sizes) each
            # find theirs. A stream that does not fit returns at its first
            # check that differs.
            if plan.stream[0] is None:
                plan.stream[0] = _stream_step(plan, x, params, states, self.outputs)
            self._streams = [plan.stream[0], *[s for s in self._streams
                                               if s is not plan.stream[0]][:3]]
        out = outs[0] if len(outs) == 1 else dict(zip(self.outputs, outs))
        return out, dict(zip(plan.state_names, news))

    def _step_run(self, plan, inputs, params, states, lead=()):
        """Runs a step that `plan` (_step_plan) checked: `states` a list in
        the cell's order of contiguous tensors of B * n elements (or None:
        zeros). Returns the outputs and new states as lists; the new states
        have the leading dims `lead` (the nn modules' [1, B, n])."""
        compiled, widths_st = plan.compiled, plan.widths_st
        x0 = inputs[0]
        B = x0.shape[0]
        # A param the cell never reads may be left out (_arguments).
        par = [params[n] if n in params else x0.new_empty(0) for n in plan.names_par]
        outs = [x0.new_empty(B, w) for w in plan.widths_out]
        news = [x0.new_empty(*lead, B, *shape) for _, _, shape in widths_st]
        versions = [p._version for p in par]
        given = all([t is not None for t in states])
        bound = plan.bound[0]
        if bound is not None and given:
            # The step bound to these shapes: only the tensors' data.
            if bound.run([t.data_ptr() for t in (*inputs, *par, *states, *outs, *news)],
                         versions):
                return outs, news
            plan.bound[0] = None  # another B stepped since, or other threads
        buf = lambda ts: [(t.data_ptr(), list(t.shape)) for t in ts]
        # A state is passed as the kernel's [B, n] (a matrix state [B, NH, K, V]
        # as [B, NH*K*V]).
        flat = [(t.data_ptr(), [B, w]) if t is not None else None
                for t, (_, w, _) in zip(states, widths_st)]
        for i, (_, w, _) in enumerate(widths_st):
            if flat[i] is None:
                z = x0.new_zeros(B, w)
                flat[i] = (z.data_ptr(), [B, w])
                states[i] = z  # alive through the call
        # The versions say whether the weights the last step packed still hold.
        args = (buf(inputs), buf(par), flat, buf(outs),
                [(t.data_ptr(), [B, w]) for t, (_, w, _) in zip(news, widths_st)], versions)
        if given:  # bind the step for the next ones
            plan.bound[0] = compiled.bind_step(*args)
        else:
            compiled.step(*args)
        return outs, news

    def _step_plan(self, x, params, states):
        """What a direct step needs (a _StepPlan), cached per the tensors'
        shapes, dtypes and layouts; None where the step must run as a
        sequence (gradients, CUDA, the emulator, autocast)."""
        try:
            if isinstance(x, dict):
                tensors, names = [*x.values(), *params.values()], (tuple(x), tuple(params))
            else:
                tensors, names = [x, *params.values()], (None, tuple(params))
            if states is not None:
                tensors += states.values()
                names += (tuple(states),)
            key = (names, *[(t.shape, t.dtype, t.device, t.is_contiguous()) for t in tensors])
            grad = torch.is_grad_enabled() and any([t.requires_grad for t in tensors])
        except (AttributeError, TypeError):
            return None  # not tensors, not dicts: the sequence call says what is wrong
        if grad or self.emulated or _autocast_cpu():
            return None
        plan = self._step_plans.get(key, False)
        if plan is False:
            plan = self._make_step_plan(x, params, states)
            if len(self._step_plans) > 64:
                self._step_plans.clear()
            self._step_plans[key] = plan
        return plan

    def _make_step_plan(self, x, params, states):
        """Checks a step's tensors once for their key (errors as a call
        reports them) and binds its sizes."""
        names_in = [n for n, _ in self.inputs]
        names_par = [n for n, _ in self.params]
        inputs, params, missing = _arguments(x, params, states, names_in, names_par,
                                             [n for n, _ in self.states])
        tensors = list(inputs) + [params[n] for n in names_par] + list(
            (states or {}).values())
        if any(not t.is_contiguous() for t in tensors) or inputs[0].device.type != "cpu":
            return None
        dtype = _one_dtype(tensors)
        if dtype not in _DTYPES:
            return None  # the sequence call says which dtypes run
        if self.target == _cellc.Target.cuda.name:
            return None
        for name, t in zip(names_in, inputs):
            if t.dim() != 2:
                raise ValueError(f"a step's input '{name}' must be [B, n], got shape "
                                 f"{list(t.shape)}")
        B = inputs[0].shape[0]
        for name, t in zip(names_in, inputs):
            if t.shape[0] != B:
                raise ValueError(f"input '{name}' has B = {t.shape[0]}, but "
                                 f"'{names_in[0]}' has B = {B}")
        if B == 0:
            return None  # the sequence call takes an empty batch
        shapes = {n: (t.shape[1],) for n, t in zip(names_in, inputs)}
        shapes.update({n: tuple(params[n].shape) for n in names_par if n not in missing})
        shapes.update(self._state_shapes(states, B))
        sizes = _bind(self, shapes, missing)
        compiled = self.jit(sizes, dtype, batch=B, seq_len=1, step=True)
        widths_out = [shape[0] for _, shape in compiled.outputs]
        widths_st = [(n, shape[0], tuple(self.shape(n, sizes)))
                     for n, shape in compiled.states]
        return _StepPlan(compiled, names_in, names_par, widths_out, widths_st,
                         [n for n, _, _ in widths_st], [None], [None])

    def _step_as_sequence(self, x, params, states):
        """A step as the call of a one-step sequence (autograd, CUDA)."""
        named = x if isinstance(x, dict) else {n: x for n, _ in self.inputs[:1]}
        for n, t in named.items():
            if isinstance(t, torch.Tensor) and t.dim() != 2:
                raise ValueError(f"a step's input '{n}' must be [B, n], got shape "
                                 f"{list(t.shape)}")
        if isinstance(x, dict):
            seq = {n: t.unsqueeze(0) if isinstance(t, torch.Tensor) else t
                   for n, t in x.items()}
        else:
            seq = x.unsqueeze(0) if isinstance(x, torch.Tensor) else x
        out, final = self(seq, params, states)
        if isinstance(out, dict):
            return {n: o[0] for n, o in out.items()}, final
        return out[0], final

    def _call_op(self, sizes, inputs, params, states, resets, mode, batch_first, lengths):
        """A call through the torch operator cellc::sequence (torch >= 2.4):
        what torch.compile and torch.export trace. Reads no tensor's values."""
        x0 = inputs[0]
        cuda_kernels = self._runs_cuda(x0.device)
        if cuda_kernels and x0.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"cellc's CUDA kernels take float32 or bfloat16 tensors, not "
                            f"{x0.dtype}")
        if not cuda_kernels and x0.dtype not in _DTYPES:
            raise TypeError(f"cellc runs float32 and float64 tensors on the CPU, not "
                            f"{x0.dtype} (under torch.autocast it casts bfloat16 and "
                            f"float16 to float32)")
        if batch_first:
            inputs = [t.transpose(0, 1) for t in inputs]
            resets = resets.transpose(0, 1) if resets is not None else None
        B = inputs[0].shape[1]
        lengths = _lengths_tensor(lengths, B)
        state_list = []
        if states is not None:
            for n, _ in self.states:
                t = states.get(n)
                # The CUDA kernels' states are float32 whatever the storage.
                state_list.append(t if t is not None else x0.new_zeros(
                    B, math.prod(self.shape(n, sizes)),
                    dtype=torch.float32 if cuda_kernels else x0.dtype))
        inputs, params, state_list = ([t.contiguous() for t in ts]
                                      for ts in (inputs, params, state_list))
        training = torch.is_grad_enabled() and any(
            t.requires_grad for t in (*inputs, *params, *state_list))
        # The sizes key the kernels; the fake implementation reads them too.
        # (Under torch.compile, int() makes a size that Dynamo would leave
        # symbolic a constant; T and B stay symbolic.)
        values = [int(sizes[n]) if n in sizes else -1 for n in self.size_symbols]
        results = torch.ops.cellc.sequence(self._key, mode, values, training, inputs,
                                           params, state_list,
                                           resets.contiguous() if resets is not None
                                           else None, lengths)
        n_out, n_st = len(self.outputs), len(self.states)
        if not _compiling():
            self.saved_bytes = sum(k.numel() * k.element_size()
                                   for k in results[n_out + n_st:])
        outs = [o.transpose(0, 1) if batch_first else o for o in results[:n_out]]
        out = outs[0] if n_out == 1 else dict(zip(self.outputs, outs))
        final = {n: t for (n, _), t in zip(self.states, results[n_out:n_out + n_st])}
        return out, final

    # Memory ------------------------------------------------------------------

    def memory_stats(self):
        """The bytes the CPU runtime held for this cell's last call: a dict with
        "kept_bytes" (what the last forward keeps for its backward; an output
        that is a state is not counted, it is the output), "forward_peak_bytes"
        and "backward_peak_bytes" (the most its buffers held at once during
        the last forward and backward, kept bytes and the kernels' own
        buffers included) and "live_bytes" (kept now)."""
        if self._last is None:
            raise RuntimeError("memory_stats: the cell has not run on the CPU yet")
        return self._last.memory_stats()

    def memory_plan(self, sizes, steps, batch, recompute="full", dtype=torch.float32):
        """What one training step of `steps` x `batch` holds in `recompute`
        mode, in bytes, as cellc's runtime will allocate it (the driver run on
        a backend that only counts): a dict with "kept", "forward_peak",
        "backward_peak" (the driver's buffers), the caller's "outputs",
        "final_states", "grad_outputs", "grad_inputs" and "grad_params",
        "piece_steps", and "peak" (the most held at once over the step, above
        the inputs and params) and "floor" (what any implementation holds at
        its end)."""
        if self.emulated or self.target == _cellc.Target.cuda.name:
            # The CUDA kernels' plan: the same C++ host code plans the
            # emulator's calls and a GPU's.
            device = torch.device("cpu") if self.emulated else torch.device("cuda")
            return self._cuda_cell(sizes, self._storage_dtype() or dtype,
                                   device).memory_plan(steps, batch, recompute)
        return self.jit(sizes, dtype, batch=batch).memory_plan(steps, batch, recompute)

    # CUDA --------------------------------------------------------------------

    def cuda_package(self, sizes, *, arch="sm_90", strategy=None, precision="ieee",
                     storage="f32", batch_tile=0, ctas=0, shared_limit=0, simt=False):
        """Compiles the cell for CUDA at `sizes` into an AOT package (PTX of both
        SAVE_GATES variants and kernels.json, as `cellc --emit=package` writes)
        in the cache directory, once per cell, sizes, options and compiler
        version, and returns its directory. With no `strategy`, it is chosen
        as `cellc` chooses it: batch-tiled where a CTA's buffers fit in 48
        KiB, else persistent. `shared_limit` (persistent: the dynamic shared
        memory of a CTA; 0: 49152 when persistent is named, the `arch`'s
        opt-in when chosen). With `simt`, the package holds the kernels for
        the SIMT emulator too (target="cuda-emu")."""
        strategy = strategy or ""
        options = [arch, strategy, precision, storage, batch_tile, ctas, shared_limit, simt]
        key = hashlib.sha256(json.dumps(
            [_compiler_build(), self.source, sorted(sizes.items()), options]
        ).encode()).hexdigest()[:32]
        root = os.path.join(_cellc.cache_dir(), "cuda")
        path = os.path.join(root, key)
        if not os.path.exists(os.path.join(path, "kernels.json")):
            os.makedirs(root, exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _cellc.package(self.source, self.file_name, sizes, tmp, arch, strategy,
                               precision, storage, batch_tile, ctas, shared_limit, simt)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            try:
                os.rename(tmp, path)  # atomic; a concurrent writer may have won
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _device_package(self, sizes, arch, storage, shared_optin, simt=False):
        """The package for a device of `arch` whose CTAs may opt in to
        `shared_optin` bytes of shared memory: the cell's CUDA options; when
        they name no strategy, chosen as `cuda_package` chooses it, a
        persistent CTA using the device's opt-in shared memory (a LayerNorm
        LSTM's backward at H = 256 does not fit a batch-tiled CTA)."""
        options = dict(self.cuda_options)
        options.pop("storage", None)  # `storage`, which follows it
        if "strategy" not in options:
            options["shared_limit"] = options.get("shared_limit") or shared_optin
        return self.cuda_package(sizes, arch=arch, storage=storage, simt=simt, **options)

    def _storage_dtype(self):
        """The torch dtype of the CUDA option `storage`, or None where the
        storage follows the inputs' dtype."""
        storage = self.cuda_options.get("storage")
        if storage is None:
            return None
        return torch.bfloat16 if storage == _cellc.Storage.bf16.name else torch.float32

    def _runs_cuda(self, device):
        """Whether tensors on `device` run the CUDA kernels: on a GPU, or in
        the SIMT emulator (target="cuda-emu")."""
        return device.type == "cuda" or self.emulated

    def _cuda_cell(self, sizes, dtype, device):
        """The CUDA kernels at `sizes` for `device`, stored as `dtype`
        (bfloat16, else float32): loaded once. Emulated, for an H100 (sm_90,
        and its opt-in shared memory)."""
        from . import cuda
        storage = (_cellc.Storage.bf16 if dtype == torch.bfloat16
                   else _cellc.Storage.f32).name
        if self.emulated:
            key = (tuple(sorted(sizes.items())), storage, EMULATED)
            if key not in self._cuda:
                path = self._device_package(sizes, "sm_90", storage, 232448, simt=True)
                self._cuda[key] = cuda.CudaCell(cuda.Package(path), emulate=True,
                                                shuffle_seed=self.shuffle_seed)
            return self._cuda[key]
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (tuple(sorted(sizes.items())), storage, index)
        cell = self._cuda.get(key)
        if cell is None:
            major, minor = torch.cuda.get_device_capability(index)
            props = torch.cuda.get_device_properties(index)
            optin = getattr(props, "shared_memory_per_block_optin", 0) or 49152
            path = self._device_package(sizes, f"sm_{major}{minor}", storage, optin)
            cell = cuda.CudaCell(cuda.Package(path), device=index)
            self._cuda[key] = cell
        return cell

    def _call_cuda(self, sizes, names_in, inputs, names_par, params, states, resets,
                   save_gates, recompute, batch_first, device, lengths):
        cell = self._cuda_cell(sizes, inputs[0].dtype, device)
        mode = _parse_mode(save_gates, recompute)
        xs = {n: (t.transpose(0, 1) if batch_first else t).contiguous()
              for n, t in zip(names_in, inputs)}
        if resets is not None:
            resets = resets.transpose(0, 1) if batch_first else resets
        out, final = cell(xs, {n: params[n] for n in names_par}, states, resets, mode,
                          lengths)
        self.saved_bytes = cell.saved_bytes
        if batch_first:
            out = {n: t.transpose(0, 1) for n, t in out.items()}
        if len(out) == 1:
            out = next(iter(out.values()))
        return out, final


def _one_dtype(tensors):
    """The dtype all of `tensors` share (an error names two that differ)."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise TypeError(f"all tensors must have one dtype; got {dtype} and {t.dtype}")
    return dtype


def _compiler_build():
    """The compiler's version and this build of it (the size and time of the
    extension that holds it): a CUDA package that another build wrote, whose
    kernels may differ under the same version, is not reused."""
    st = os.stat(_cellc.__file__)
    return f"{_cellc.compiler_version()}-{st.st_size}-{st.st_mtime_ns}"


#: The target that runs the CUDA kernels in the SIMT emulator, on the CPU.
EMULATED = "cuda-emu"

_CUDA_OPTIONS = {"strategy", "precision", "storage", "batch_tile", "ctas", "shared_limit"}


def _bucket(batch):
    bucket = 1
    while bucket < batch:
        bucket *= 2
    return bucket


def autotune(cell, sizes, *, batch, seq_len=100, target="cpu", dtype=torch.float32,
             save_gates=True, budget=60.0, store=True, compile_only=False,
             progress=True, json_path=None):
    """Tunes the kernel config of `cell` (a Cell, cell text or .cell path) at
    `sizes` (e.g. {"I": 256, "H": 256}) for a training step of `seq_len` x
    `batch`, as `cellc-tune` does: each candidate is checked against the
    default config and timed; the winner goes to the tuning cache, which the
    JIT then reads for this batch's power-of-two bucket. Returns the results:
    a dict with "candidates", "winner_config", "seconds", "key" and "table"
    (the printed table). Progress goes to stderr."""
    if not isinstance(cell, Cell):
        cell = compile(cell)
    if dtype not in _DTYPES:
        raise TypeError(f"cellc autotunes float32 and float64 cells, not {dtype}")
    if not isinstance(batch, int) or batch < 1 or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"batch and seq_len must be positive integers, got {batch!r} "
                         f"and {seq_len!r}")
    result = _run_tune(cell, sizes, batch=batch, seq_len=seq_len, target=target,
                       dtype=_DTYPES[dtype], save_gates=save_gates, budget=budget,
                       store=store, compile_only=compile_only, progress=progress)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    # The JIT compiles again for a new config.
    cell._compiled.clear()
    return result


def _run_tune(cell, sizes, *, batch, seq_len, target, dtype, save_gates, budget, store,
              compile_only, progress):
    """Runs cellc-tune on `cell` (the tuner forks, times and runs ptxas; the
    extension only reads the tuning cache). Returns its JSON results, with
    "table": what it printed."""
    tool = _tools.tool_path("cellc-tune")
    if tool is None:
        raise RuntimeError("cellc.autotune runs cellc-tune, which is not installed beside "
                           "the package")
    with tempfile.TemporaryDirectory() as tmp:
        json_out = os.path.join(tmp, "tune.json")
        args = [tool, "-", "--source-name", cell.file_name, "--batch", str(batch),
                "--seq-len", str(seq_len), "--target", str(target), "--dtype", dtype,
                "--save-gates", str(int(bool(save_gates))), "--budget", f"{float(budget)}s",
                "--json", json_out]
        args += [f"-D{k}={v}" for k, v in sizes.items()]
        if not store:
            args.append("--no-store")
        if compile_only:
            args.append("--compile-only")
        child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        # The table comes on stdout, progress and errors on stderr: both
        # drained at once, progress echoed as it comes.
        out = []
        reader = threading.Thread(target=lambda: out.append(child.stdout.read()))
        reader.start()
        child.stdin.write(cell.source.encode())
        child.stdin.close()
        err = b""
        for chunk in iter(lambda: child.stderr.read1(4096), b""):
            err += chunk
            if progress:
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
        reader.join()
        code = child.wait()
        message = err.decode(errors="replace").strip().splitlines()
        message = "\n".join(l for l in message if not l.startswith("[")) or f"exit {code}"
        message = message.replace("cellc-tune: error: ", "")
        if code == 3:
            raise RuntimeError(message)
        # 4: no candidate ran correctly; the results say why.
        if code not in (0, 4) or not os.path.exists(json_out):
            raise ValueError(message)
        with open(json_out) as f:
            result = json.load(f)
    result["table"] = out[0].decode(errors="replace")
    return result


def compile(source, target=None, *, threads=0, cuda=None, unit_slices=None):
    """Parses and checks a cell. `source` is the cell's text or a path to a
    .cell file. Kernels are compiled per (sizes, dtype) on first use.
    `threads` (0: every core) run the CPU kernels; with fewer batch tiles
    than threads, `unit_slices` True has the threads of a tile split its
    units (each a slice of every product, meeting at barriers; each packs
    only its slice of the weights), False its rows, and None (the default)
    its rows where each thread gets 4 or more and the threads' copies of
    the weights take at most 4 MiB.
    `cuda`: the CUDA kernels' options, from those of `Cell.cuda_package`
    (strategy, precision, storage, batch_tile, ctas, shared_limit); `storage`
    ("f32" or "bf16") is how the kernels store the sequences (x, h, the
    gates): the inputs are cast to it and the outputs come in it; without it
    the storage follows the inputs' dtype. `target`: None (the tensors' device), "cpu",
    "cuda", or "cuda-emu": the CUDA kernels, run on CPU tensors in the SIMT
    emulator (every CUDA thread a fiber, with race, bounds and deadlock
    checks; docs/cuda.md), where `cuda={"shuffle_seed": n}` shuffles the
    threads' order between sync points."""
    file_name = "<cell>"
    if "{" not in source and os.path.exists(source):
        file_name = source
        with open(source) as f:
            source = f.read()
    return Cell(source, file_name, target, threads, cuda, unit_slices)

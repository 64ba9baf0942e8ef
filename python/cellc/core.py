"""The functional API: compile a cell, bind its sizes from tensors, run it
under autograd."""

import json
import os
import shutil
import warnings

import torch

from . import _cellc, _cellc_runtime, _ops
from ._front import _DTYPES, _compiling, one_step, recompute_mode
from ._sizes import Sizes, _size_text
from ._stream import Steps
from ._targets import _CUDA_OPTIONS, EMULATED, CudaTargets
from ._tune import _bucket, _run_tune

def _jit(source, file_name, sizes, dtype, threads, batch, step=False, unit_slices=None,
         part=""):
    """The JIT: the cell's CPU package, built by the compiler (or found in the
    kernel cache), loaded by the runtime as cellc.load_package loads one.
    `step`: the package of a streaming step, whose kernels compute the
    products of inputs themselves. `unit_slices`: Cell's. `part`: that part
    of the cell's chunkwise form (cellc._chunkwise.prologue)."""
    path, from_cache, origin, temporary, threads, unit_slices = _cellc.prepare_package(
        source, file_name, sizes, dtype, threads, True, batch, step, unit_slices, part)
    try:
        compiled = _cellc_runtime.load(path, threads, from_cache, origin)
        compiled.unit_slices = unit_slices
        return compiled
    finally:
        if temporary:  # no cache: the shared objects stay mapped
            shutil.rmtree(path, ignore_errors=True)


class Cell(Sizes, Steps, CudaTargets):
    """A cell compiled from source: parsed and checked now, JIT-compiled per
    (sizes, dtype) on first use, and cached on disk."""

    def __init__(self, source, file_name="<cell>", target=None, threads=0, cuda=None,
                 unit_slices=None, sizes=None):
        #: Sizes that calls bind beside what their tensors bind (`sizes=`).
        self.given_sizes = dict(sizes or {})
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
        self._key = _ops.cell_key(self)
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
                      "saved_bytes": int, "_chunkwise_plans": dict,
                      "_chunk_parts": dict}

    def __getstate__(self):
        state = dict(self.__dict__)
        for name, empty in self._RUNTIME_STATE.items():
            state[name] = empty()
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("unit_slices", None)  # pickled before it was
        self._key = _ops.cell_key(self)

    def __repr__(self):
        return (f"cellc.Cell(inputs={self.inputs}, states={self.states}, "
                f"params={[n for n, _ in self.params]}, outputs={self.outputs})")

    # Compiling ---------------------------------------------------------------

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
                 recompute=None, batch_first=False, lengths=None, sizes=None, form="step",
                 chunk=None):
        if (not torch.is_grad_enabled() and resets is None and lengths is None
                and sizes is None and form != "chunk" and not _compiling()):
            # A one-step call under no_grad is a step: the step kernels,
            # their packed weights and short path (Cell.step), and the same
            # results as the sequence's. It runs no kernel of the mode, but
            # a mode the driver refuses is the same error.
            step = one_step(x, batch_first)
            if step is not None:
                if recompute is not None:
                    _cellc_runtime.check_mode(recompute_mode(save_gates, recompute))
                out, news = self.step(step, params, states)
                at = 1 if batch_first else 0
                one = lambda t: t.unsqueeze(at)
                return (one(out) if not isinstance(out, dict)
                        else {n: one(o) for n, o in out.items()}), news
        return _ops.call(self, x, params, states, save_gates=save_gates, resets=resets,
                         recompute=recompute, batch_first=batch_first, lengths=lengths,
                         sizes=sizes, form=form, chunk=chunk)

    def _placement(self, device):
        """Whether tensors on `device` run the CUDA kernels (cellc._front),
        once checked that this cell runs them there."""
        cuda = _cellc.Target.cuda.name
        if self.emulated and device.type != "cpu":
            raise ValueError(f"target={EMULATED!r} runs the CUDA kernels in the SIMT emulator "
                             f"on CPU tensors, but the tensors are on {device}")
        if ((device.type == "cuda") != (self.target == cuda) and self.target is not None
                and not self.emulated):
            raise ValueError(f"this cell was compiled with target={self.target!r}, "
                             f"but the tensors are on {device}")
        return self._runs_cuda(device)

    def _check_dtype(self, dtype):
        """Any dtype that reaches here runs (cellc._front checked it)."""

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

    def memory_plan(self, sizes, steps, batch, recompute="full", dtype=torch.float32,
                    form="step", chunk=None):
        """What one training step of `steps` x `batch` holds in `recompute`
        mode, in bytes, as cellc's runtime will allocate it (the driver run on
        a backend that only counts): a dict with "kept", "forward_peak",
        "backward_peak" (the driver's buffers), the caller's "outputs",
        "final_states", "grad_outputs", "grad_inputs" and "grad_params",
        "piece_steps", and "peak" (the most held at once over the step, above
        the inputs and params) and "floor" (what any implementation holds at
        its end).

        `form`: "step", "chunk" (the chunkwise form on the CPU, chunks of
        `chunk` steps: the same keys but "piece_steps", and the parts' kept
        bytes "prologue_kept", "core_kept", "between_kept" and
        "epilogue_kept", and "chunk"; `cellc --emit=plan --form=chunk`
        prints it) or "auto" (the form a call with form="auto" takes)."""
        from . import _chunkwise, _ops
        _ops.check_form(form, chunk)
        cuda = self.emulated or self.target == _cellc.Target.cuda.name
        if form == "auto":
            # As a call takes it (cellc._chunkwise.choose): the chunk form on
            # the CPU, in float32 or float64, where it is expected faster at
            # the length the call takes (a tuned one: cellc._chunktune).
            if not chunk and not cuda:
                from . import _chunktune
                chunk = _chunktune.tuned(self, sizes, dtype, batch, steps, recompute)
            form = ("chunk" if not cuda and dtype in (torch.float32, torch.float64)
                    and _chunkwise.expected(self, sizes, dtype, steps, chunk) else "step")
        if form == "chunk":
            if cuda:
                raise NotImplementedError("memory_plan(form='chunk') plans the CPU's chunk "
                                          "kernels, not the CUDA target's")
            if dtype not in (torch.float32, torch.float64):
                raise TypeError(f"the chunk form runs float32 and float64, not {dtype}")
            if not isinstance(steps, int) or not isinstance(batch, int):
                raise TypeError("steps and batch must be integers")
            from . import _chunktune
            chunk = chunk or _chunktune.tuned(self, sizes, dtype, batch, steps, recompute)
            return _cellc.chunk_plan(self.source, self.file_name, dict(sizes),
                                     "f64" if dtype == torch.float64 else "f32", steps,
                                     batch, recompute, chunk or 0)
        if cuda:
            # The CUDA kernels' plan: the same C++ host code plans the
            # emulator's calls and a GPU's.
            device = torch.device("cpu") if self.emulated else torch.device("cuda")
            return self._cuda_cell(sizes, self._storage_dtype() or dtype,
                                   device).memory_plan(steps, batch, recompute)
        return self.jit(sizes, dtype, batch=batch).memory_plan(steps, batch, recompute)


def autotune(cell, sizes, *, batch, seq_len=100, target="cpu", dtype=torch.float32,
             save_gates=True, budget=60.0, store=True, compile_only=False,
             progress=True, json_path=None, form="step", recompute="none"):
    """Tunes the kernel config of `cell` (a Cell, cell text or .cell path) at
    `sizes` (e.g. {"I": 256, "H": 256}) for a training step of `seq_len` x
    `batch`, as `cellc-tune` does: each candidate is checked against the
    default config and timed; the winner goes to the tuning cache, which the
    JIT then reads for this batch's power-of-two bucket. Returns the results:
    a dict with "candidates", "winner_config", "seconds", "key" and "table"
    (the printed table). Progress goes to stderr.

    `form="chunk"`: the chunk form's length instead (cellc._chunktune), on
    the CPU in `recompute` mode: each of 16, 32, 64 and 128 (those up to
    seq_len's power of two) checked against the default length and timed;
    form="chunk" calls that name no chunk then take the winner."""
    if not isinstance(cell, Cell):
        cell = compile(cell)
    if form not in ("step", "chunk"):
        raise ValueError(f"form must be 'step' or 'chunk', not {form!r}")
    if form == "chunk":
        from . import _chunktune
        if (target != "cpu" or compile_only or cell.emulated
                or cell.target == _cellc.Target.cuda.name):
            raise ValueError("form='chunk' tunes the chunk length on the CPU (target='cpu', "
                             "compile_only=False, a cell compiled for the CPU)")
        if not isinstance(batch, int) or batch < 1 or not isinstance(seq_len, int) or \
                seq_len < 1:
            raise ValueError(f"batch and seq_len must be positive integers, got {batch!r} "
                             f"and {seq_len!r}")
        result = _chunktune.tune(cell, sizes, batch=batch, seq_len=seq_len, dtype=dtype,
                                 budget=budget, store=store, progress=progress,
                                 recompute=recompute)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=2)
        return result
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


def compile(source, target=None, *, threads=0, cuda=None, unit_slices=None, sizes=None):
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
    threads' order between sync points. `sizes` (a dict from size names to
    ints) binds what a call's tensors leave open, as a call's `sizes=` does
    (params that carry only products, `[NH*K, I]`, and no states given)."""
    file_name = "<cell>"
    if "{" not in source and os.path.exists(source):
        file_name = source
        with open(source) as f:
            source = f.read()
    return Cell(source, file_name, target, threads, cuda, unit_slices, sizes)

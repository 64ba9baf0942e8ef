"""cellc's CPU runtime: loads and runs CPU packages (use the cellc package).

The runtime's C interface (runtime/cpu/CpuC.h) in libcellc_runtime.so,
through ctypes, so that one wheel serves every CPython: no extension module
is built for a Python. Tensors cross as (data pointer, shape) pairs, and a
call's lists of them as one int64 array; errors come back as ValueError with
the driver's message.
"""

import array
import ctypes
import json
import os
import threading

_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
_I64P, _STR = ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p
_ERR = [ctypes.c_char_p, ctypes.c_size_t]
_PP = ctypes.POINTER(ctypes.c_void_p)

#: Each function's arguments and result (None: an int status).
_SIGNATURES = {
    "cellc_runtime_version": ([], _STR),
    "cellc_cpu_load": ([_STR, _I32, _I32, _STR] + _ERR, _P),
    "cellc_cpu_free": ([_P], None),
    "cellc_cpu_describe": ([_P], _P),
    "cellc_cpu_free_text": ([_P], None),
    "cellc_cpu_threads": ([_P], _I32),
    "cellc_cpu_set_threads": ([_P, _I32], None),
    "cellc_cpu_unit_slices": ([_P], _I32),
    "cellc_cpu_set_unit_slices": ([_P, _I32], None),
    "cellc_cpu_thread_split": ([_P, _I64, _I64P], None),
    "cellc_cpu_forward": ([_P, _P, _STR] + _ERR, ctypes.c_int),
    "cellc_cpu_step": ([_P, _P, _I64P, _I64] + _ERR, ctypes.c_int),
    "cellc_cpu_bind_step": ([_P, _P, _I64P, _I64, _PP] + _ERR, ctypes.c_int),
    "cellc_cpu_bound_run": ([_P, _I64P], ctypes.c_int),
    "cellc_cpu_bound_error": ([], _STR),
    "cellc_cpu_bound_free": ([_P], None),
    "cellc_cpu_kept_layout": ([_P, _STR, _I32, _PP] + _ERR, ctypes.c_int),
    "cellc_cpu_backward_kept": ([_P, _P, _STR] + _ERR, ctypes.c_int),
    "cellc_cpu_memory_stats": ([_P, _I64P], None),
    "cellc_cpu_memory_plan": ([_P, _I64, _I64, _STR, _I64P] + _ERR, ctypes.c_int),
    "cellc_cpu_check_mode": ([_STR] + _ERR, ctypes.c_int),
    "cellc_cpu_lend": ([_I64P, _I32, _I32] + _ERR, _P),
    "cellc_cpu_capsule_destructor": ([_P], None),
    "cellc_cpu_lent_bytes": ([], _I64),
    "cellc_cpu_cached_bytes": ([], _I64),
    "cellc_cpu_empty_cache": ([], None),
    "cellc_cpu_tasks_on_openmp": ([], _I32),
    "cellc_cpu_set_tasks_on_openmp": ([_I32], None),
    "cellc_cpu_gemm_library": ([], _STR),
    "cellc_cpu_chunk_forward": ([_I32, _I64P, _I32, _I32] + [_P] * 4 + [_PP, _PP] + [_P] * 3
                                + [_I32] + _ERR, ctypes.c_int),
    "cellc_cpu_chunk_backward": ([_I32, _I64P, _I32, _I32] + [_P] * 6 + [_PP, _PP, _P]
                                 + [_P] * 4 + [_PP, _I32] + _ERR, ctypes.c_int),
    "cellc_cpu_delta_forward": ([_I32, _I64P, _I32] + [_P] * 5 + [_PP, _PP, _P, _P, _I32]
                                + _ERR, ctypes.c_int),
    "cellc_cpu_delta_backward": ([_I32, _I64P, _I32] + [_P] * 6 + [_PP, _PP, _P] + [_P] * 5
                                 + [_PP, _I32] + _ERR, ctypes.c_int),
}


def library_paths(name="libcellc_runtime.so"):
    """Where one of cellc's libraries may be: beside this file (an installed
    package) or in the build tree's lib/ (PYTHONPATH=build/python)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, name), os.path.normpath(os.path.join(here, "..", "..", "lib", name))]


def library_path(name):
    """The first of library_paths(name) that is there; ImportError if none."""
    path = next((p for p in library_paths(name) if os.path.exists(p)), None)
    if path is None:
        raise ImportError(f"{name} is not beside the cellc package nor in the build tree: "
                          + ", ".join(library_paths(name)))
    return path


def _load():
    path = library_path("libcellc_runtime.so")
    # The wheel's runtime needs libscipy_openblas.so: loaded from wherever
    # scipy-openblas32 is installed (its RPATH finds it only in the same
    # site-packages), it is found by its name. A build tree's links OpenBLAS.
    try:
        import scipy_openblas32
        blas = os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so")
        if os.path.exists(blas):
            ctypes.CDLL(blas)
    except ImportError:
        pass
    lib = ctypes.CDLL(path)
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = result
    return lib


_LIB = _load()
_run_bound = _LIB.cellc_cpu_bound_run
__version__ = _LIB.cellc_runtime_version().decode()
_errors = threading.local()


def _error():
    """This thread's buffer for a call's error (ctypes lets go of the GIL
    during a call, so that two threads may fail at once)."""
    buf = getattr(_errors, "buf", None)
    if buf is None:
        buf = _errors.buf = ctypes.create_string_buffer(4096)
    return buf


def _check(status, buf):
    if status:
        raise ValueError(buf.value.decode(errors="replace"))


def _text(pointer):
    """The JSON text at `pointer` (of malloc's), read and given back."""
    if not pointer:
        raise MemoryError("the runtime's answer did not fit in memory")
    try:
        return json.loads(ctypes.string_at(pointer).decode("utf-8", "surrogateescape"))
    finally:
        _LIB.cellc_cpu_free_text(pointer)


def _lists(head, *lists):
    """A call's array as CpuC.h lays it out: the scalars `head`, then each
    list's count and each (pointer, shape)'s pointer, rank and dims; an
    array.array, whose address the call takes (a third of a ctypes array's
    cost to build)."""
    flat = list(head)
    put, extend = flat.append, flat.extend
    for pairs in lists:
        put(len(pairs))
        for ptr, shape in pairs:
            put(ptr)
            put(len(shape))
            extend(shape)
    return array.array("q", flat)


def _ints(values):
    return (_I64 * len(values))(*values), len(values)


_MODES = {}


def _mode(mode):
    """A recompute mode as the C interface takes it, encoded once."""
    if not isinstance(mode, str):
        return mode
    encoded = _MODES.get(mode)
    if encoded is None:
        encoded = _MODES[mode] = mode.encode()
    return encoded


#: The keys of a memory plan, in the order of cellc_cpu_memory_plan's (and
#: cellc_cuda_plan's) figures, then as Cell.memory_plan returns them.
_PLAN_ORDER = ("kept", "forward_peak", "backward_peak", "outputs", "final_states",
               "grad_outputs", "grad_inputs", "grad_params", "kept_outputs", "piece_steps",
               "peak", "floor")
_PLAN_KEYS = ("kept", "kept_outputs", "forward_peak", "backward_peak", "piece_steps",
              "outputs", "final_states", "grad_outputs", "grad_inputs", "grad_params",
              "peak", "floor")


def plan_dict(values):
    """A memory plan's dict from its twelve figures in _PLAN_ORDER."""
    given = dict(zip(_PLAN_ORDER, values))
    return {key: given[key] for key in _PLAN_KEYS}


class BoundStep:
    """A step bound to its tensors' shapes (CpuCell::BoundStep); it keeps
    its cell alive."""

    def __init__(self, handle, cell):
        self._handle, self._cell = handle, cell
        self._local = threading.local()

    def __del__(self, _free=_LIB.cellc_cpu_bound_free):
        # The function is bound at definition: at the interpreter's exit
        # this module's globals may be gone before its objects.
        if getattr(self, "_handle", None):
            _free(self._handle)
            self._handle = None

    def run(self, data, versions):
        """Steps the tensors whose data pointers `data` gives (inputs,
        params, states, outputs, new states), shaped as those it was bound
        with; False, running nothing, where it must be bound again."""
        # cellc_cpu_bound_run's one array, made once a thread and filled in
        # place (0.6 us less a step than a new one): another thread that
        # steps the same binding fills its own.
        n, m = len(data), len(versions)
        local = self._local
        args = getattr(local, "args", None)
        if args is None or local.counts != (n, m):
            args = local.args = (_I64 * (n + m + 2))()
            args[0], args[n + 1], local.counts = n, m, (n, m)
        args[1:n + 1] = data
        args[n + 2:] = versions
        status = _run_bound(self._handle, args)
        if status == 1:
            raise ValueError(_LIB.cellc_cpu_bound_error().decode(errors="replace"))
        return status == 0


class CompiledCell:
    """A CPU package, loaded (load)."""

    def __init__(self, handle):
        self._handle = handle
        described = _text(_LIB.cellc_cpu_describe(handle))
        package = described["package"]
        slots = package["slots"]
        self.inputs, self.states, self.params, self.outputs = (
            [(name, list(shape)) for name, shape in slots[kind]]
            for kind in ("inputs", "states", "params", "outputs"))
        #: The declared dims of each state of several (a matrix state's [NH, K, V]).
        self.state_dims = dict(package["state_dims"])
        self.dtype, self.sizes, self.path = package["dtype"], package["sizes"], package["directory"]
        self.loaded_from_cache = described["loaded_from_cache"]
        #: The kernel config, as name=value pairs; 'tuned' in config_source
        #: when it came from the tuning cache.
        self.config, self.config_source = described["config"], described["config_source"]

    def __del__(self, _free=_LIB.cellc_cpu_free):
        if getattr(self, "_handle", None):
            _free(self._handle)
            self._handle = None

    @property
    def threads(self):
        return _LIB.cellc_cpu_threads(self._handle)

    @threads.setter
    def threads(self, value):
        _LIB.cellc_cpu_set_threads(self._handle, int(value))

    @property
    def unit_slices(self):
        """With fewer batch tiles than threads, whether a tile's threads
        split its units (True) or its rows (False); None, the default: its
        rows from 4 a thread while their copies of the weights take at most
        4 MiB."""
        mode = _LIB.cellc_cpu_unit_slices(self._handle)
        return None if mode < 0 else mode > 0

    @unit_slices.setter
    def unit_slices(self, on):
        _LIB.cellc_cpu_set_unit_slices(self._handle, -1 if on is None else int(bool(on)))

    def thread_split(self, batch):
        """(groups, slices): how a launch over `batch` rows runs on the threads."""
        out = (_I64 * 2)()
        _LIB.cellc_cpu_thread_split(self._handle, batch, out)
        return out[0], out[1]

    def forward(self, inputs, params, states, resets, steps, batch, batch_first, outputs,
                finals, mode, lengths, kept=None):
        """The forward; with `kept` (laid out as kept_layout says), a
        training forward that leaves there what backward_kept reads."""
        training = kept is not None
        call = _lists((resets or 0, steps, batch, int(batch_first), int(training), len(lengths),
                       *lengths), inputs, params, states, outputs, finals,
                      *([kept] if training else []))
        buf = _error()
        _check(_LIB.cellc_cpu_forward(self._handle, call.buffer_info()[0], _mode(mode), buf,
                                      len(buf)), buf)

    def step(self, inputs, params, states, outputs, new_states, param_versions=None):
        """One step of inference: [B, n] inputs, states stepped from, outputs
        and new states. With the params' versions (torch's `_version`), the
        weights packed by the last step serve while the params and versions
        are the same."""
        versions, n = _ints(param_versions or [])
        buf = _error()
        lists = _lists((), inputs, params, states, outputs, new_states)
        _check(_LIB.cellc_cpu_step(self._handle, lists.buffer_info()[0], versions,
                                   n if param_versions is not None else -1, buf, len(buf)), buf)

    def bind_step(self, inputs, params, states, outputs, new_states, param_versions):
        """`step`, then the step bound to these tensors' shapes (a BoundStep
        that keeps this cell alive), or None."""
        versions, n = _ints(param_versions)
        bound, buf = _P(), _error()
        lists = _lists((), inputs, params, states, outputs, new_states)
        _check(_LIB.cellc_cpu_bind_step(self._handle, lists.buffer_info()[0], versions, n,
                                        ctypes.byref(bound), buf, len(buf)), buf)
        return BoundStep(bound.value, self) if bound.value else None

    def kept_layout(self, mode, has_lengths):
        """What a training forward in `mode` keeps: (per chunk, width,
        dtype) buffers `[T or chunks, B, width]` that the caller allocates,
        and the outputs (indices) it keeps as states' histories."""
        text, buf = _P(), _error()
        _check(_LIB.cellc_cpu_kept_layout(self._handle, _mode(mode), int(has_lengths),
                                          ctypes.byref(text), buf, len(buf)), buf)
        layout = _text(text.value)
        return [tuple(b) for b in layout["buffers"]], layout["outputs"]

    @staticmethod
    def buffer(shape, element):
        """A DLPack capsule of a dense buffer of 'f32' or 'f64' from the
        runtime's buffers, for a kept buffer (torch.utils.dlpack.from_dlpack):
        its pages go back to the runtime's cache when the tensor is freed."""
        if element not in ("f32", "f64"):
            raise ValueError(f"buffer: element must be 'f32' or 'f64', got '{element}'")
        dims, rank = _ints(list(shape))
        buf = _error()
        managed = _LIB.cellc_cpu_lend(dims, rank, int(element == "f64"), buf, len(buf))
        if not managed:
            _check(1, buf)
        capsule = _capsule_new(managed, _DLTENSOR, _drop_unused)
        return capsule

    def backward_kept(self, inputs, params, states, resets, steps, batch, mode, lengths,
                      outputs, kept, grad_outputs, grad_finals, grad_inputs, grad_params,
                      grad_states):
        """The backward of a forward whose kept buffers (and outputs) the
        caller holds."""
        call = _lists((resets or 0, steps, batch, len(lengths), *lengths), inputs, params,
                      states, outputs, kept, grad_outputs, grad_finals, grad_inputs,
                      grad_params, grad_states)
        buf = _error()
        _check(_LIB.cellc_cpu_backward_kept(self._handle, call.buffer_info()[0], _mode(mode),
                                            buf, len(buf)), buf)

    def memory_stats(self):
        """The bytes the driver held in the last forward and backward."""
        out = (_I64 * 4)()
        _LIB.cellc_cpu_memory_stats(self._handle, out)
        return dict(zip(("kept_bytes", "forward_peak_bytes", "backward_peak_bytes",
                         "live_bytes"), out))

    def memory_plan(self, steps, batch, mode):
        """What a training step of steps x batch in mode holds, in bytes."""
        out, buf = (_I64 * 12)(), _error()
        _check(_LIB.cellc_cpu_memory_plan(self._handle, steps, batch, _mode(mode), out, buf,
                                          len(buf)), buf)
        return plan_dict(list(out))


#: A lent buffer's capsule, whose destructor (in C, run with the GIL held)
#: gives its buffer back unless torch took it (renamed "used_dltensor"). The
#: name must outlive every capsule (PyCapsule keeps the pointer), so it is
#: this module's.
_DLTENSOR = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [_P, ctypes.c_char_p, _P]
_capsule_new.restype = ctypes.py_object
_drop_unused = ctypes.cast(_LIB.cellc_cpu_capsule_destructor, _P)


def load(path, threads=0, from_cache=False, config_source="default"):
    """Loads the CPU package in `path` (kernels.json, save.so, replay.so)."""
    buf = _error()
    handle = _LIB.cellc_cpu_load(os.fsencode(path), int(threads), int(from_cache),
                                 config_source.encode(), buf, len(buf))
    if not handle:
        _check(1, buf)
    return CompiledCell(handle)


def check_mode(mode):
    """Raises ValueError, with the driver's one message, unless mode is a
    recompute mode the driver takes."""
    buf = _error()
    _check(_LIB.cellc_cpu_check_mode(_mode(mode), buf, len(buf)), buf)


def tasks_on_openmp():
    """Whether the runtime's threads are OpenMP's (shared with torch's where
    both use the same OpenMP runtime) rather than a pool of its own."""
    return bool(_LIB.cellc_cpu_tasks_on_openmp())


def set_tasks_on_openmp(on):
    """Runs the runtime's threads on OpenMP's (True) or on its own pool."""
    _LIB.cellc_cpu_set_tasks_on_openmp(int(bool(on)))


def gemm_library():
    """What runs the CPU's f32 GEMMs: 'cellc-avx512' (cellc's own kernel, on a
    CPU with AVX-512F unless CELLC_CPU_GEMM=openblas) or 'openblas'."""
    return _LIB.cellc_cpu_gemm_library().decode()


def lent_bytes():
    """The bytes of the runtime's buffers (`buffer`) that are not given back yet."""
    return _LIB.cellc_cpu_lent_bytes()


def cached_bytes():
    """The bytes of the buffers that calls released and the runtime keeps."""
    return _LIB.cellc_cpu_cached_bytes()


def empty_cache():
    """Unmaps the buffers that calls released and the runtime keeps for the
    next call of the same sizes."""
    _LIB.cellc_cpu_empty_cache()


def _pointers(values):
    return (_P * max(len(values), 1))(*values)


def _core(name, f64, shape, *args):
    """Runs the chunk core `name` with `args`, lists of pointers as arrays."""
    buf = _error()
    converted = [_pointers(a) if isinstance(a, (list, tuple)) else a for a in args]
    _check(getattr(_LIB, name)(int(f64), (_I64 * 5)(*shape), *converted, buf, len(buf)), buf)


def chunk_forward(f64, BH, T, K, V, L, rows, a, k, v, S0, qs, outs, starts, end, pairs,
                  threads):
    """The chunk form's diagonal core, forward (cellc/_chunkcore.py)."""
    _core("cellc_cpu_chunk_forward", f64, (BH, T, K, V, L), int(rows), len(qs), a, k, v, S0,
          qs, outs, starts, end, pairs, threads)


def chunk_backward(f64, BH, T, K, V, L, rows, a, k, v, starts, end, pairs, qs, douts, dEnd,
                   da, dk, dv, dS0, dqs, threads):
    """The chunk form's diagonal core, backward (cellc/_chunkcore.py)."""
    _core("cellc_cpu_chunk_backward", f64, (BH, T, K, V, L), int(rows), len(qs), a, k, v,
          starts, end, pairs, qs, douts, dEnd, da, dk, dv, dS0, dqs, threads)


def delta_forward(f64, BH, T, K, V, L, a, k, w, beta, S0, qs, outs, starts, end, threads):
    """The chunk form's delta-rule core, forward (cellc/_chunkcore.py)."""
    _core("cellc_cpu_delta_forward", f64, (BH, T, K, V, L), len(qs), a, k, w, beta, S0, qs,
          outs, starts, end, threads)


def delta_backward(f64, BH, T, K, V, L, a, k, w, beta, starts, end, qs, douts, dEnd, da, dk,
                   dw, dbeta, dS0, dqs, threads):
    """The chunk form's delta-rule core, backward (cellc/_chunkcore.py)."""
    _core("cellc_cpu_delta_backward", f64, (BH, T, K, V, L), len(qs), a, k, w, beta, starts,
          end, qs, douts, dEnd, da, dk, dw, dbeta, dS0, dqs, threads)

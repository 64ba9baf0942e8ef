"""Runs cellc's CUDA packages (`cellc --emit=package`): on a GPU, or in the
SIMT emulator on the CPU.

The host side of a call is C++ (runtime/cuda: the sequence driver, cuBLAS
and libcuda opened with dlopen): Python makes one C call per forward and one
per backward, through ctypes, and nothing calls back. Each call's buffers lie
in one workspace, a single torch allocation, so that torch's allocator (and
`torch.cuda.max_memory_allocated`) counts them; the kept buffers, outputs and
gradients are torch tensors too.

This file imports the standard library alone (torch on first use) and no
other part of cellc, so that a GPU machine without cellc's extensions runs
packages by loading this file and libcellc_runtime.so (test/gpu). On a
machine without a GPU it imports; using a GPU there raises `CudaUnavailable`
with the reason.
"""

import ctypes
import glob
import json
import os
import warnings
import weakref

__all__ = ["CudaUnavailable", "CudaError", "available", "Package", "CudaCell"]


class CudaUnavailable(RuntimeError):
    """No CUDA driver or GPU (or no libcellc_runtime.so) on this machine."""


class CudaError(RuntimeError):
    """A CUDA call failed; the message names the kernel and the error."""


class _Tensor(ctypes.Structure):
    """cellc_tensor (runtime/cuda/CudaC.h)."""
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * 4),
                ("rank", ctypes.c_int32), ("element", ctypes.c_int32)]


class _Tensors(ctypes.Structure):
    _fields_ = [("items", ctypes.POINTER(_Tensor)), ("count", ctypes.c_int64)]


class _Call(ctypes.Structure):
    """cellc_call (runtime/cuda/CudaC.h)."""
    _fields_ = [("mode", ctypes.c_char_p), ("steps", ctypes.c_int64),
                ("batch", ctypes.c_int64), ("inputs", _Tensors), ("params", _Tensors),
                ("initial", _Tensors), ("resets", _Tensor),
                ("lengths", ctypes.POINTER(ctypes.c_int64)), ("num_lengths", ctypes.c_int64),
                ("outputs", _Tensors), ("finals", _Tensors), ("kept", _Tensors),
                ("training", ctypes.c_int32), ("grad_outputs", _Tensors),
                ("grad_finals", _Tensors), ("grad_inputs", _Tensors),
                ("grad_params", _Tensors), ("grad_initial", _Tensors),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_int64),
                ("stream", ctypes.c_void_p), ("needed", ctypes.c_int64)]


#: CELLC_WORKSPACE_TOO_SMALL: nothing ran, the call needs `needed` bytes.
_TOO_SMALL = 2
#: The driver's element codes (cellc::driver::Element) and kernels.json's names.
_CODES = {"f32": 0, "f64": 1, "bf16": 2, "i8": 3, "i32": 4}
_LIB = None


def _library():
    global _LIB
    if _LIB is not None:
        return _LIB
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("CELLC_CUDA_LIB", ""),
                  os.path.join(here, "libcellc_runtime.so"),
                  os.path.join(here, "..", "..", "lib", "libcellc_runtime.so")]
    for path in candidates:
        if path and os.path.exists(path):
            lib = ctypes.CDLL(path)
            break
    else:
        raise CudaUnavailable(
            "libcellc_runtime.so not found (build runtime/, or set CELLC_CUDA_LIB)")
    err = [ctypes.c_char_p, ctypes.c_size_t]
    P, I64 = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    lib.cellc_cuda_available.argtypes = err
    lib.cellc_cuda_package_open.argtypes = [ctypes.c_char_p] + err
    lib.cellc_cuda_package_open.restype = P
    lib.cellc_cuda_package_free.argtypes = [P]
    lib.cellc_cuda_package_describe.argtypes = [P]
    lib.cellc_cuda_package_describe.restype = P
    lib.cellc_cuda_free_text.argtypes = [P]
    lib.cellc_cuda_cell_open.argtypes = [P, ctypes.c_int32, ctypes.c_uint64] + err
    lib.cellc_cuda_cell_open.restype = P
    lib.cellc_cuda_cell_free.argtypes = [P]
    for name in ("cellc_cuda_forward", "cellc_cuda_backward"):
        getattr(lib, name).argtypes = [P, ctypes.POINTER(_Call)] + err
    lib.cellc_cuda_kept_layout.argtypes = [P, ctypes.c_char_p, ctypes.c_int32, I64,
                                           ctypes.c_int64, I64, I64, ctypes.c_int64,
                                           I64] + err
    lib.cellc_cuda_plan.argtypes = [P, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                    I64] + err
    lib.cellc_cuda_memory_stats.argtypes = [P, I64]
    lib.cellc_cuda_memory_stats.restype = None
    lib.cellc_cuda_launch.argtypes = [P, ctypes.c_int32, ctypes.c_int32,
                                      ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.c_int64,
                                      P] + err
    lib.cellc_cuda_launch_plan.argtypes = [P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
                                           I64] + err
    lib.cellc_cuda_device_calls.argtypes = [P, ctypes.c_int32]
    lib.cellc_cuda_device_calls.restype = P
    lib.cellc_cuda_registers.argtypes = [P, ctypes.c_char_p, ctypes.c_int32,
                                         ctypes.POINTER(ctypes.c_int32)] + err
    _LIB = lib
    return lib


def _error_buffer():
    return ctypes.create_string_buffer(4096)


def _raise(buf):
    message = buf.value.decode()
    if message.startswith("no CUDA driver/GPU") or message.startswith("cuBLAS not found"):
        raise CudaUnavailable(message)
    if message.startswith(("recompute must be", "no tensor for", "the sizes overflow")):
        raise ValueError(message)
    raise CudaError(message)


def available():
    """(True, "") when a CUDA driver and device are there, else (False, why)."""
    try:
        lib = _library()
    except CudaUnavailable as e:
        return False, str(e)
    buf = _error_buffer()
    ok = lib.cellc_cuda_available(buf, len(buf))
    return bool(ok), buf.value.decode()


def _front_door():
    """cellc's one checker and autograd glue (cellc._front and cellc._ops):
    the package's own where this file is cellc.cuda; where it was loaded
    alone (a GPU machine without cellc's extensions), the files beside it,
    loaded under the same names, so that a process holds one of each (and
    torch one registration of the operators)."""
    if __package__:
        from . import _ops
        return _ops
    import importlib.util
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("_sizes", "_front", "_ops"):
        full = "cellc." + name
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, os.path.join(here, name + ".py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
    return sys.modules["cellc._ops"]


class Package:
    """A CUDA package as the runtime reads it (kernels.json, in C++): `meta`
    is what it found there, `kernels` each kernel's launch and arguments,
    `ptx` the text of each variant's PTX."""

    def __init__(self, directory):
        self.directory = str(directory)
        lib = _library()
        buf = _error_buffer()
        self._handle = lib.cellc_cuda_package_open(self.directory.encode(), buf, len(buf))
        if not self._handle:
            raise ValueError(buf.value.decode())
        self._lib = lib
        text = lib.cellc_cuda_package_describe(self._handle)
        if not text:
            raise MemoryError("cellc_cuda_package_describe: out of memory")
        try:
            self.meta = json.loads(ctypes.string_at(text).decode())
        finally:
            lib.cellc_cuda_free_text(text)
        self.cell = self.meta["cell"]
        self.kernels = self.meta["kernels"]

    def __del__(self):
        if getattr(self, "_handle", None):
            self._lib.cellc_cuda_package_free(self._handle)
            self._handle = None

    @property
    def ptx(self):
        """The PTX of each variant ("replay", "save")."""
        texts = {}
        for variant, name in self.meta["ptx"].items():
            with open(os.path.join(self.directory, name)) as f:
                texts[variant] = f.read()
        return texts


def _dtype(name):
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "i8": torch.uint8,
            "i32": torch.int32, "f64": torch.float64}[name]


def _code(tensor):
    import torch
    return {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.uint8: 3,
            torch.int32: 4}.get(tensor.dtype, -1)


def _tensor(t):
    """A tensor (or None: absent) as a cellc_tensor; `t` must be contiguous."""
    if t is None:
        return _Tensor()
    if t.dim() > 4:
        raise ValueError(f"cellc takes tensors of at most 4 dims, got {list(t.shape)}")
    out = _Tensor(data=t.data_ptr() or None, rank=t.dim(), element=_code(t))
    for i, d in enumerate(t.shape):
        out.shape[i] = d
    return out


def _list(tensors):
    items = (_Tensor * max(1, len(tensors)))(*[_tensor(t) for t in tensors])
    return _Tensors(items=items, count=len(tensors)), items


def _poison(tensors):
    """Fills freshly allocated buffers with all-ones bytes (NaN in f32 and
    bf16): the SIMT emulator's buffers come from the CPU allocator, fresh
    zero pages or the last call's identical data, where a GPU's caching
    allocator hands back whatever its blocks last held. A kernel or driver
    step that reads what it never wrote then reads NaN, in every test."""
    import torch
    for t in tensors:
        if t is not None and t.numel():
            t.view(torch.uint8).fill_(0xFF) if t.is_contiguous() else t.fill_(float("nan"))


def _find_cublas():
    """Tells the runtime where torch's cuBLAS wheel is, when torch has one and
    the process has not loaded cuBLAS already."""
    if os.environ.get("CELLC_CUBLAS"):
        return
    import torch
    root = os.path.dirname(os.path.dirname(torch.__file__))
    for pattern in ("nvidia/cublas/lib/libcublas.so.*", "nvidia/cu*/lib/libcublas.so.*"):
        found = sorted(glob.glob(os.path.join(root, pattern)))
        if found:
            os.environ["CELLC_CUBLAS"] = found[-1]
            return


class CudaCell:
    """A package's kernels loaded on one device, run on torch's current
    stream: `__call__` runs a sequence under autograd; `forward_kept` and
    `backward_kept` are the torch operators' calls (cellc._ops).

    With `emulate`, the same kernels run on the CPU in the SIMT emulator
    (runtime/emu): the package's `simt` objects, every CUDA thread a fiber,
    with its race, bounds and deadlock checks. The tensors are then CPU
    tensors, and everything else (the C++ host code, the arguments, the
    grids) is as on a GPU. `shuffle_seed` (nonzero) shuffles the threads'
    order between sync points.
    """

    #: Whether the kernels run in the SIMT emulator.
    emulate = False

    def __init__(self, package, device=0, emulate=False, shuffle_seed=0):
        if not isinstance(package, Package):
            package = Package(package)
        self.package = package
        self.emulate = emulate
        self.shuffle_seed = shuffle_seed
        self.device_index = device
        lib = _library()
        self._lib = lib
        if emulate and "simt" not in package.meta:
            raise ValueError(f"{package.directory}: the package has no kernels for the "
                             "SIMT emulator (cellc --emit=package --simt)")
        if not emulate:
            _find_cublas()
        buf = _error_buffer()
        self._handle = lib.cellc_cuda_cell_open(package._handle, -1 if emulate else device,
                                                shuffle_seed, buf, len(buf))
        if not self._handle:
            _raise(buf)
        #: Bytes the last call kept for its backward (0 without autograd).
        self.saved_bytes = 0
        #: The workspace each kind of call needed last, so that the next one
        #: is allocated once.
        self._needed = {}
        #: What a call keeps in each mode (layout), asked once.
        self._layouts = {}
        slots = package.meta["slots"]
        self.inputs = [(n, shape[-1]) for n, shape in slots["inputs"]]
        self.params = [(n, shape) for n, shape in slots["params"]]
        self.states = [(n, shape[-1]) for n, shape in slots["states"]]
        self.outputs = [(n, shape[-1]) for n, shape in slots["outputs"]]
        precision = package.meta.get("precision", "ieee")
        if precision != "ieee" and package.meta.get("mma_sites") == 0:
            warnings.warn(f"{package.cell}: precision={precision!r}, but no product runs on "
                          "the tensor cores at these sizes: they need 16 rows a tile and a "
                          f"depth that {8 if precision == 'tf32' else 16} divides, and the "
                          "products run on fp32 FMAs instead", stacklevel=2)

    def __del__(self):
        if getattr(self, "_handle", None):
            self._lib.cellc_cuda_cell_free(self._handle)
            self._handle = None

    @property
    def storage(self):
        """The dtype of the sequences in memory (x, h, the gates): float32 or
        bfloat16."""
        return _dtype(self.package.meta.get("storage") or "f32")

    @property
    def _device_kind(self):
        return "CPU (the SIMT emulator's)" if self.emulate else "CUDA"

    def _stream(self, tensor):
        if self.emulate:
            return None
        import torch
        return torch.cuda.current_stream(tensor.device).cuda_stream

    def memory_stats(self):
        """The bytes the last forward and backward held, as cellc.Cell's
        memory_stats says for the CPU: kept_bytes (what the forward keeps),
        forward_peak_bytes and backward_peak_bytes (the driver's buffers, kept
        bytes included), live_bytes, and the workspace each call used
        (forward_workspace_bytes, backward_workspace_bytes)."""
        out = (ctypes.c_int64 * 6)()
        self._lib.cellc_cuda_memory_stats(self._handle, out)
        return dict(zip(["kept_bytes", "forward_peak_bytes", "backward_peak_bytes",
                         "live_bytes", "forward_workspace_bytes",
                         "backward_workspace_bytes"], out))

    def memory_plan(self, steps, batch, recompute="full"):
        """What a training step of `steps` x `batch` holds on the device, in
        bytes, as cellc.Cell.memory_plan says for the CPU: the driver's
        forward and backward peaks are what is kept and each call's
        workspace."""
        out = (ctypes.c_int64 * 12)()
        self._check_call(self._lib.cellc_cuda_plan, self._handle, recompute.encode(), steps,
                         batch, out)
        return dict(zip(["kept", "forward_peak", "backward_peak", "outputs", "final_states",
                         "grad_outputs", "grad_inputs", "grad_params", "kept_outputs",
                         "piece_steps", "peak", "floor"], out))

    def launch_plan(self, kernel, batch, variant="save"):
        """The launch a call makes of `kernel` ("<cell>_fwd" or "_bwd") over
        `batch` rows, checked as the device would check it and not run: a dict
        of grid (x, y), block, shared_bytes (dynamic), cooperative and
        resident_per_sm (CTAs an SM keeps at once). A launch the device would
        refuse raises CudaError with the driver's words; in the emulator, the
        device is its model of an H100/H200."""
        out = (ctypes.c_int64 * 6)()
        self._check_call(self._lib.cellc_cuda_launch_plan, self._handle,
                         int(kernel.endswith("_bwd")), int(variant == "save"), batch, out)
        return {"grid": (out[0], out[1]), "block": out[2], "shared_bytes": out[3],
                "cooperative": bool(out[4]), "resident_per_sm": out[5]}

    def device_calls(self, reset=False):
        """What the device was asked since the last reset, by kind ("launch",
        "gemm", "copy", "zero", "fill_rows", "mask_past_lengths", ...): in the
        SIMT emulator, every call a GPU's driver and cuBLAS would get; {} on a
        GPU, which counts nothing. `reset` starts the count again."""
        text = self._lib.cellc_cuda_device_calls(self._handle, int(bool(reset)))
        if not text:
            raise MemoryError("cellc_cuda_device_calls: out of memory")
        try:
            return json.loads(ctypes.string_at(text).decode())
        finally:
            self._lib.cellc_cuda_free_text(text)

    def registers(self, kernel, variant="save"):
        n = ctypes.c_int32()
        self._check_call(self._lib.cellc_cuda_registers, self._handle, kernel.encode(),
                         int(variant == "save"), ctypes.byref(n))
        return n.value

    def _check_call(self, fn, *args):
        buf = _error_buffer()
        if fn(*args, buf, len(buf)):
            _raise(buf)

    def launch(self, kernel, variant, tensors, batch):
        """Launches `kernel` with one tensor (or int) per argument, in the
        kernel's order, outside the sequence driver: for tests of what the
        emulator catches."""
        args = (_Tensor * max(1, len(tensors)))()
        keep = []
        for i, t in enumerate(tensors):
            if isinstance(t, int):
                args[i].rank = -1
                args[i].shape[0] = t
                continue
            t = t.contiguous()
            keep.append(t)
            args[i] = _tensor(t)
        first = next((t for t in tensors if not isinstance(t, int)), None)
        self._check_call(self._lib.cellc_cuda_launch, self._handle,
                         int(kernel.endswith("_bwd")), int(variant == "save"), args,
                         len(tensors), batch, self._stream(first) if first is not None else None)

    # The calls -----------------------------------------------------------------

    def layout(self, mode, has_lengths):
        """What a call returns and keeps, as cellc.Cell.layout says: the
        outputs' and final states' (width, dtype), the kept buffers (per
        chunk, width, dtype) of a training forward in `mode`, and the outputs
        it reads as states' histories."""
        import torch
        key = (mode, bool(has_lengths))
        if key in self._layouts:
            return self._layouts[key]
        # Room for a buffer a state and the gates.
        capacity = len(self.states) + 1
        layout = (ctypes.c_int64 * (3 * capacity))()
        count, num_read = ctypes.c_int64(), ctypes.c_int64()
        read = (ctypes.c_int64 * max(1, len(self.outputs)))()
        self._check_call(self._lib.cellc_cuda_kept_layout, self._handle, mode.encode(),
                         int(bool(has_lengths)), layout, capacity, ctypes.byref(count), read,
                         len(read), ctypes.byref(num_read))
        if count.value > capacity:
            raise CudaError(f"{self.package.cell}: a layout of {count.value} kept buffers, "
                            f"past one a state and the gates")
        codes = {code: name for name, code in _CODES.items()}
        self._layouts[key] = {
            "outputs": [(n, self.storage) for _, n in self.outputs],
            "states": [(n, torch.float32) for _, n in self.states],
            "kept": [(bool(layout[3 * i]), layout[3 * i + 1], _dtype(codes[layout[3 * i + 2]]))
                     for i in range(min(count.value, capacity))],
            "read": list(read[:num_read.value])}
        return self._layouts[key]

    def _run(self, backward, key, call, device):
        """One C call in a workspace of the size the last call of its kind
        needed; where that is too small, nothing ran, and it runs again in
        one of the size it says."""
        import torch
        fn = self._lib.cellc_cuda_backward if backward else self._lib.cellc_cuda_forward
        buf = _error_buffer()
        size = self._needed.get(key, 0)
        for _ in range(2):
            workspace = torch.empty(size, dtype=torch.uint8, device=device)
            if self.emulate:
                _poison([workspace])
            call.workspace = workspace.data_ptr() or None
            call.workspace_bytes = size
            status = fn(self._handle, ctypes.byref(call), buf, len(buf))
            if status != _TOO_SMALL:
                break
            size = call.needed
            self._needed[key] = size
        if status == _TOO_SMALL:
            raise CudaError(f"{self.package.cell}: a call asked for a workspace of "
                            f"{call.needed} bytes after one of {call.workspace_bytes}; its "
                            "dry run and its real run differ")
        if status:
            _raise(buf)

    def _call(self, mode, inputs, params, states, resets, lengths, T, B):
        call = _Call(mode=mode.encode(), steps=T, batch=B, training=0)
        keep = []
        for field, tensors in (("inputs", inputs), ("params", params), ("initial", states)):
            setattr(call, field, self._tensors(tensors, keep))
        call.resets = _tensor(resets)
        n = (ctypes.c_int64 * max(1, len(lengths)))(*lengths)
        keep.append(n)
        call.lengths = n
        call.num_lengths = len(lengths)
        call.stream = self._stream(inputs[0])
        return call, keep

    @staticmethod
    def _tensors(tensors, keep):
        listed, items = _list(tensors)
        keep.append(items)
        return listed

    def forward_kept(self, mode, inputs, params, states, resets, lengths, outputs, finals,
                     kept):
        """One forward into the caller's `outputs`, `finals` and, when `kept`
        is not None, kept buffers (a training forward): one C call. Every
        tensor is contiguous; `states` may be empty (zeros), `lengths` a
        list."""
        T, B = inputs[0].shape[:2]
        if self.emulate:
            _poison([*outputs, *finals, *(kept or [])])
        call, keep = self._call(mode, inputs, params, states, resets, lengths, T, B)
        call.outputs = self._tensors(outputs, keep)
        call.finals = self._tensors(finals, keep)
        call.kept = self._tensors(kept or [], keep)
        call.training = int(kept is not None)
        self._run(False, ("forward", mode, T, B, bool(lengths), kept is not None), call,
                  inputs[0].device)
        self.saved_bytes = sum(k.numel() * k.element_size() for k in kept or [])

    def backward_kept(self, mode, inputs, params, states, resets, lengths, outputs, kept,
                      grad_outputs, grad_finals, grad_inputs, grad_params, grad_states):
        """The backward of a `forward_kept`, from its kept buffers and the
        outputs it reads (None where not read): gradients written into the
        caller's (None: not wanted): one C call."""
        T, B = inputs[0].shape[:2]
        if self.emulate:
            _poison([*grad_inputs, *grad_params, *(grad_states or [])])
        call, keep = self._call(mode, inputs, params, states, resets, lengths, T, B)
        call.outputs = self._tensors(outputs, keep)
        call.kept = self._tensors(kept, keep)
        n_states = len(self.states)
        for field, tensors in (("grad_outputs", grad_outputs), ("grad_finals", grad_finals),
                               ("grad_inputs", grad_inputs), ("grad_params", grad_params),
                               ("grad_initial", grad_states or [None] * n_states)):
            setattr(call, field, self._tensors(tensors, keep))
        wanted = tuple(g is not None for g in [*grad_inputs, *grad_params,
                                              *(grad_states or [])])
        self._run(True, ("backward", mode, T, B, bool(lengths), wanted), call,
                  inputs[0].device)

    def _front(self):
        """What a call is checked against (cellc._front.Fixed), made once."""
        front = self.__dict__.get("_front_of_calls")
        if front is None:
            ops = _front_door()
            dims = self.package.meta.get("state_dims", {})
            # It runs this cell, held weakly: a cycle would leave the cell to
            # the garbage collector, to go at a random later time.
            front = ops.Fixed(weakref.proxy(self), "CudaCell", [(n, [w]) for n, w in self.inputs],
                              self.params, [(n, dims.get(n, [w])) for n, w in self.states],
                              [n for n, _ in self.outputs],
                              "emulator" if self.emulate else "cuda", storage=self.storage)
            front._key = ops.front_key(front, {"package": self.package.directory})
            self._front_of_calls = front
        return front

    def __call__(self, inputs, params, states=None, resets=None, recompute="none",
                 lengths=None):
        """Runs the sequence under autograd, as cellc.Cell's call does (one
        checker, one glue: cellc._front and cellc._ops). inputs {name: [T, B,
        n]}, params {name: tensor}, states {name: [B, n]} (a matrix state in
        its declared dims, `[B, NH, K, V]`, or flat) or None: both the start
        states and the values that rows reset to. `recompute`: 'none' saves
        the gates, 'full' only the states and replays each step in backward,
        'chunk:K' the states every K steps and replays a chunk before its
        backward. Returns (outputs {name: [T, B, n]}, final states {name:
        [B, n]}, a matrix state in its declared dims)."""
        front = self._front()
        if not isinstance(inputs, dict):
            raise TypeError("inputs must be a dict from input names to tensors")
        out, final = _front_door().call(front, inputs, params, states, resets=resets,
                                        recompute=recompute, lengths=lengths)
        self.saved_bytes = front.saved_bytes
        if not isinstance(out, dict):
            out = {front.outputs[0]: out}
        return out, final

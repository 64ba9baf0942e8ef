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


def recompute_mode(save_gates, recompute):
    """The recompute mode of a call, as the runtime parses it: `recompute`
    ("none", "full" or "chunk:K"), or without it "none" where gates are
    saved and "full" where not. The runtime checks the words and says what
    it takes; here only that it is a string."""
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


#: What differentiating a cellc gradient again says.
TWICE = ("cellc computes first derivatives only; its gradient cannot be differentiated "
         "again (a gradient penalty, a Hessian-vector product or MAML needs a second "
         "derivative of the cell)")


def not_differentiable_again(gradients):
    """The gradients a cellc backward computed, as it returns them under
    create_graph: each carries a node that raises TWICE when it is
    differentiated. torch's `once_differentiable` does this only where an
    incoming gradient requires grad, and a gradient penalty's (the ones of
    `out.sum()`) does not: the penalty's own gradient through the cell would
    then be a silent zero. The gradients depend on the inputs and params
    whatever the incoming ones are, so every call under create_graph gets
    the node. Without create_graph they are returned as they are."""
    import torch
    if not torch.is_grad_enabled():
        return gradients
    given = [g.detach().requires_grad_() for g in gradients if isinstance(g, torch.Tensor)]
    if not given:
        return gradients
    errors = iter(torch._C._functions.DelayedError(TWICE.encode(), len(given))(*given))
    return type(gradients)(next(errors) if isinstance(g, torch.Tensor) else g
                           for g in gradients)


def first_derivative(backward):
    """An autograd.Function's backward that computes without a graph and whose
    gradients raise TWICE when differentiated (not_differentiable_again)."""
    import functools

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        import torch
        with torch.no_grad():
            gradients = backward(ctx, *grads)
        return not_differentiable_again(tuple(gradients))
    return wrapper


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

    def _check_tensors(self, tensors):
        import torch
        device = tensors[0].device
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"expected tensors, got {type(t).__name__}")
            if t.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"CudaCell's kernels take float32 or bfloat16 tensors, "
                                f"got {t.dtype}")
            if t.is_cuda == self.emulate:
                raise ValueError(f"CudaCell runs on {self._device_kind} tensors; got a tensor "
                                 f"on {t.device}")
            if t.device != device:
                raise ValueError(f"all tensors must be on one device; got {device} and {t.device}")

    def __call__(self, inputs, params, states=None, resets=None, recompute="none",
                 lengths=None):
        """Runs the sequence under autograd. inputs {name: [T, B, n]}, params
        {name: tensor}, states {name: [B, n]} (a matrix state in its declared
        dims, `[B, NH, K, V]`, or flat) or None: both the start states
        and the values that rows reset to. `recompute`: 'none' saves the
        gates, 'full' only the states and replays each step in backward,
        'chunk:K' the states every K steps and replays a chunk before its
        backward. Returns (outputs {name: [T, B, n]}, final states {name:
        [B, n]}, a matrix state in its declared dims)."""
        import torch
        recompute = recompute_mode(True, recompute)
        first = next(iter(inputs.values()))
        if first.dim() != 3:
            raise ValueError(f"inputs must be [T, B, n], got {list(first.shape)}")
        T, B = first.shape[:2]
        self._check_tensors(list(inputs.values()) + list(params.values())
                            + list((states or {}).values()))
        if resets is not None and (not isinstance(resets, torch.Tensor)
                                   or tuple(resets.shape) != (T, B)):
            raise ValueError(f"resets must be a bool tensor of shape {[T, B]}")
        if resets is not None and resets.device != first.device:
            raise ValueError(f"resets are on {resets.device}, but the other tensors are on "
                             f"{first.device}")
        for n, x in inputs.items():
            if x.dtype != self.storage:
                raise TypeError(f"input {n!r} is {x.dtype}, but this package stores "
                                f"its sequences as {self.storage} (cellc --storage)")
        # A matrix state is given as [B, NH, K, V] (its declared dims) or
        # [B, NH*K*V]; the kernels take the flat vector.
        dims = self.package.meta.get("state_dims", {})
        given = bool(states)
        states = dict(states or {})
        for n, size in self.states if given else ():
            if n not in states:
                states[n] = first.new_zeros(B, size, dtype=torch.float32)
                continue
            t, declared = states[n], [B, *dims.get(n, [size])]
            if list(t.shape) not in ([B, size], declared):
                raise ValueError(f"state {n!r} must be {declared}, got {list(t.shape)}")
            states[n] = t.reshape(B, size)
        # A param the cell never reads may be left out: the runtime names a
        # missing one that the kernels read.
        params = {n: params[n] if n in params else first.new_empty(0, dtype=torch.float32)
                  for n, _ in self.params}
        # Without states, the runtime starts from zeros (no buffer of ours).
        flat = ([inputs[n] for n, _ in self.inputs] + [params[n] for n, _ in self.params]
                + ([states[n] for n, _ in self.states] if given else []))
        r = resets.to(torch.uint8).contiguous() if resets is not None else None
        results = _Sequence.apply(self, recompute, r, list(lengths or []), *flat)
        outs = results[:len(self.outputs)]
        finals = results[len(self.outputs):]
        return (dict(zip([n for n, _ in self.outputs], outs)),
                shaped_states(dict(zip([n for n, _ in self.states], finals)), dims))


def _sequence_class():
    import torch

    class Sequence(torch.autograd.Function):
        """A CudaCell's call under autograd (torch without the custom
        operators; cellc._ops runs forward_kept and backward_kept with
        torch >= 2.4): the kept buffers are tensors saved for the backward."""

        @staticmethod
        def forward(ctx, cell, mode, resets, lengths, *flat):
            n_in, n_par = len(cell.inputs), len(cell.params)
            inputs = [t.contiguous() for t in flat[:n_in]]
            params = [p.detach().contiguous() for p in flat[n_in:n_in + n_par]]
            states = [s.detach().contiguous() for s in flat[n_in + n_par:]]
            T, B = inputs[0].shape[:2]
            # Inside forward autograd is off: whether a gradient is wanted is
            # in needs_input_grad (cell, mode, resets and lengths first).
            training = any(ctx.needs_input_grad[4:])
            layout = cell.layout(mode, bool(lengths))
            x0 = inputs[0]
            outputs = [x0.new_empty(T, B, n, dtype=dtype) for n, dtype in layout["outputs"]]
            finals = [x0.new_empty(B, n, dtype=dtype) for n, dtype in layout["states"]]
            kept = None
            if training:
                lead = T
                if mode.startswith("chunk:"):
                    K = int(mode[len("chunk:"):])
                    lead = (T + K - 1) // K
                kept = [x0.new_empty(lead if per_chunk else T, B, n, dtype=dtype)
                        for per_chunk, n, dtype in layout["kept"]]
            cell.forward_kept(mode, inputs, params, states, resets, lengths, outputs, finals,
                              kept)
            ctx.cell, ctx.mode, ctx.resets, ctx.lengths = cell, mode, resets, lengths
            ctx.n_states = len(states)
            ctx.read = layout["read"] if training else []
            # Saved, so that autograd catches an in-place change of an output
            # the backward reads, and frees what forward kept after the
            # backward (unless the graph is retained).
            if training:
                ctx.save_for_backward(*inputs, *params, *states,
                                      *[outputs[i] for i in ctx.read], *kept)
            return tuple(outputs) + tuple(finals)

        @staticmethod
        @first_derivative
        def backward(ctx, *grads):
            cell = ctx.cell
            n_in, n_par, n_st = len(cell.inputs), len(cell.params), ctx.n_states
            saved = ctx.saved_tensors
            inputs, params = saved[:n_in], saved[n_in:n_in + n_par]
            states = saved[n_in + n_par:n_in + n_par + n_st]
            rest = saved[n_in + n_par + n_st:]
            outputs = [None] * len(cell.outputs)
            for i, t in zip(ctx.read, rest):
                outputs[i] = t
            kept = list(rest[len(ctx.read):])
            n_out = len(cell.outputs)
            g_out = [g.to(inputs[0].dtype).contiguous() if g is not None else None
                     for g in grads[:n_out]]
            g_fin = [g.float().contiguous() if g is not None else None
                     for g in grads[n_out:]]
            # Contiguous, whatever the strides of what they are the gradients
            # of (a transposed param): the driver writes into them. Only those
            # autograd wants (cell, mode, resets and lengths come first).
            wanted = ctx.needs_input_grad[4:]
            grads_of = lambda ts, first: [
                torch.empty(t.shape, dtype=t.dtype, device=t.device) if wanted[first + i]
                else None for i, t in enumerate(ts)]
            d_in = grads_of(inputs, 0)
            d_par = grads_of(params, n_in)
            d_st = grads_of(states, n_in + n_par)
            cell.backward_kept(ctx.mode, list(inputs), list(params), list(states), ctx.resets,
                               ctx.lengths, outputs, kept, g_out, g_fin, d_in, d_par,
                               d_st if states else None)
            return (None,) * 4 + tuple(d_in) + tuple(d_par) + tuple(d_st)

    return Sequence


class _LazySequence:
    """torch is imported on first use, so this module imports without it."""
    cls = None

    @classmethod
    def apply(cls, *args):
        if cls.cls is None:
            cls.cls = _sequence_class()
        return cls.cls.apply(*args)


_Sequence = _LazySequence

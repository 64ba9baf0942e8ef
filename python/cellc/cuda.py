"""Runs AOT-compiled cellc CUDA kernels (a package from `cellc --emit=package`).

This module needs neither MLIR/LLVM nor the `_cellc` extension: it talks to
`libcellc_runtime.so` (runtime/: the driver and runtime/cuda, which loads libcuda with dlopen) through
ctypes, and leaves the hoisted GEMMs to torch. It imports on machines without
a GPU; using it there raises `CudaUnavailable` with the reason.
"""

import ctypes
import json
import os
import warnings

__all__ = ["CudaUnavailable", "CudaError", "available", "Package", "CudaCell"]


class CudaUnavailable(RuntimeError):
    """No CUDA driver or GPU (or no libcellc_runtime.so) on this machine."""


class CudaError(RuntimeError):
    """A CUDA call failed; the message names the kernel and the error."""


_LIB = None


class _View(ctypes.Structure):
    """cellc_view: elements of a backend buffer, named by its id."""
    _fields_ = [("buffer", ctypes.c_int64), ("offset", ctypes.c_int64),
                ("element", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4)]


class _Arg(ctypes.Structure):
    _fields_ = [("is_index", ctypes.c_int32), ("index", ctypes.c_int64), ("view", _View)]


_VP = ctypes.POINTER(_View)
_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
                             ctypes.POINTER(ctypes.c_int64))
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_int64)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                           ctypes.POINTER(_Arg), ctypes.c_int64)
_GEMM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_int64, _VP, ctypes.c_int64, _VP,
                         ctypes.c_int64, ctypes.c_double, _VP, ctypes.c_int64)
_COLUMN_SUMS = ctypes.CFUNCTYPE(ctypes.c_int, _VP, ctypes.c_int64, ctypes.c_int64, _VP)
_FILL_ROWS = ctypes.CFUNCTYPE(ctypes.c_int, _VP, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int32, _VP)
_BINARY = ctypes.CFUNCTYPE(ctypes.c_int, _VP, _VP)


class _Callbacks(ctypes.Structure):
    _fields_ = [("allocate", _ALLOCATE), ("release", _RELEASE), ("launch", _LAUNCH),
                ("gemm", _GEMM), ("column_sums", _COLUMN_SUMS), ("fill_rows", _FILL_ROWS),
                ("copy", _BINARY), ("add", _BINARY)]


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
    lib.cellc_cuda_available.argtypes = err
    lib.cellc_cuda_load.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                    ctypes.POINTER(ctypes.c_void_p)] + err
    lib.cellc_cuda_unload.argtypes = [ctypes.c_void_p]
    lib.cellc_cuda_launch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint,
                                      ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                      ctypes.c_int, ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_void_p)] + err
    lib.cellc_cuda_registers.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_int)] + err
    # The SIMT emulator (runtime/emu/Simt.h).
    lib.cellc_emu_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)] + err
    lib.cellc_emu_unload.argtypes = [ctypes.c_void_p]
    lib.cellc_emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                     ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int64), ctypes.c_int64,
                                     ctypes.c_uint64] + err
    # The sequence driver (runtime/driver/DriverC.h).
    V = ctypes.POINTER(_View)
    lib.cellc_element.argtypes = [ctypes.c_char_p]
    lib.cellc_element.restype = ctypes.c_int32
    lib.cellc_interface_new.argtypes = [ctypes.c_char_p]
    lib.cellc_interface_new.restype = ctypes.c_void_p
    lib.cellc_interface_arg.argtypes = ([ctypes.c_void_p, ctypes.c_int32] + [ctypes.c_char_p] * 4
                                        + [ctypes.c_int64, ctypes.c_int32, ctypes.c_char_p,
                                           ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]
                                        + err)
    lib.cellc_interface_kernel.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                           ctypes.c_int64]
    lib.cellc_interface_free.argtypes = [ctypes.c_void_p]
    lib.cellc_driver_new.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Callbacks)] + err
    lib.cellc_driver_new.restype = ctypes.c_void_p
    lib.cellc_driver_free.argtypes = [ctypes.c_void_p]
    lengths = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    lib.cellc_driver_forward.argtypes = ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                                          ctypes.c_int64] + [V] * 4 + lengths + [V] * 2
                                         + [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
                                         + err)
    lib.cellc_driver_backward.argtypes = ([ctypes.c_void_p, ctypes.c_void_p] + [V] * 4
                                          + lengths + [V] * 5 + err)
    I64 = ctypes.POINTER(ctypes.c_int64)
    lib.cellc_driver_kept_layout.argtypes = ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                              I64, ctypes.c_int64, I64, I64, I64] + err)
    lib.cellc_driver_forward_kept.argtypes = ([ctypes.c_void_p, ctypes.c_char_p,
                                               ctypes.c_int64, ctypes.c_int64] + [V] * 4
                                              + lengths + [V] * 3 + [ctypes.c_int64] + err)
    lib.cellc_driver_adopt.argtypes = ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                                        ctypes.c_int64] + [V] * 4 + lengths + [V] * 2
                                       + [ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)]
                                       + err)
    lib.cellc_saved_bytes.argtypes = [ctypes.c_void_p]
    lib.cellc_saved_bytes.restype = ctypes.c_int64
    lib.cellc_saved_free.argtypes = [ctypes.c_void_p]
    lib.cellc_saved_outputs_read.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                             ctypes.c_int64]
    lib.cellc_saved_outputs_read.restype = ctypes.c_int64
    lib.cellc_driver_memory_stats.argtypes = [ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_int64)]
    lib.cellc_driver_memory_stats.restype = None
    _LIB = lib
    return lib


def available():
    """(True, "") when a CUDA driver and device are there, else (False, why)."""
    try:
        lib = _library()
    except CudaUnavailable as e:
        return False, str(e)
    buf = ctypes.create_string_buffer(1024)
    ok = lib.cellc_cuda_available(buf, len(buf))
    return bool(ok), buf.value.decode()


class Package:
    """An AOT package: kernels.json and the PTX of both SAVE_GATES variants."""

    def __init__(self, directory):
        self.directory = directory
        path = os.path.join(directory, "kernels.json")
        try:
            with open(path) as f:
                self.meta = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a cellc package ({e})") from None
        if self.meta.get("format") != 2:
            raise ValueError(f"{path}: unknown package format {self.meta.get('format')}; "
                             "this runtime reads format 2 (rebuild the package with this "
                             "cellc)")
        self.cell = self.meta["cell"]
        self.kernels = self.meta["kernels"]
        self.ptx = {}
        for variant, name in self.meta["ptx"].items():
            with open(os.path.join(directory, name)) as f:
                self.ptx[variant] = f.read()

    def args(self, kernel):
        return self.kernels[kernel]["args"]


def _torch_dtype(arg):
    """The torch dtype of a package argument's buffer."""
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "i8": torch.uint8, "i32": torch.int32,
            "f64": torch.float64}[arg.get("element", "f32")]


def _check(status, buf):
    if status != 0:
        message = buf.value.decode()
        if message.startswith("no CUDA driver/GPU"):
            raise CudaUnavailable(message)
        raise CudaError(message)


class CudaCell:
    """A package's kernels loaded on one device, launched on torch's stream.

    Calling it runs the whole sequence under autograd: the input projections
    as torch GEMMs, then the forward kernel; in backward, the backward kernel
    and the weight and input gradients as torch GEMMs. Its buffers are torch
    tensors (the kernels allocate nothing), so it can be captured in a graph.

    With `emulate`, the same kernels run on the CPU in the SIMT emulator
    (runtime/emu): the package's `simt` objects, every CUDA thread a fiber,
    with its race, bounds and deadlock checks. The tensors are then CPU
    tensors, and everything else (the driver, the arguments, the grids) is
    as on a GPU. `shuffle_seed` (nonzero) shuffles the threads' order
    between sync points.
    """

    #: Whether the kernels run in the SIMT emulator.
    emulate = False

    def __init__(self, package, device=0, emulate=False, shuffle_seed=0):
        self.package = package
        self.emulate = emulate
        self.shuffle_seed = shuffle_seed
        lib = _library()
        self._lib = lib
        self.modules = {}
        buf = ctypes.create_string_buffer(8192)
        if emulate:
            objects = package.meta.get("simt")
            if not objects:
                raise ValueError(f"{package.directory}: the package has no kernels for the "
                                 "SIMT emulator (cellc --emit=package --simt)")
            for variant, name in objects.items():
                handle = ctypes.c_void_p()
                path = os.path.join(package.directory, name)
                _check(lib.cellc_emu_load(path.encode(), ctypes.byref(handle), buf,
                                          len(buf)), buf)
                self.modules[variant] = handle
        else:
            for variant, ptx in package.ptx.items():
                handle = ctypes.c_void_p()
                _check(lib.cellc_cuda_load(device, ptx.encode(), ctypes.byref(handle),
                                           buf, len(buf)), buf)
                self.modules[variant] = handle
        #: Bytes the last call kept for its backward (0 without autograd).
        self.saved_bytes = 0
        precision = package.meta.get("precision", "ieee")
        if precision != "ieee" and package.meta.get("mma_sites") == 0:
            warnings.warn(f"{package.cell}: precision={precision!r}, but no product runs on "
                          "the tensor cores at these sizes: they need 16 rows a tile and a "
                          f"depth that {8 if precision == 'tf32' else 16} divides, and the "
                          "products run on fp32 FMAs instead", stacklevel=2)

    def __del__(self):
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        unload = lib.cellc_emu_unload if self.emulate else lib.cellc_cuda_unload
        for handle in getattr(self, "modules", {}).values():
            unload(handle)

    def memory_stats(self):
        """The bytes the driver held in the last forward and backward, as
        cellc.Cell.memory_stats says for the CPU (the buffers come from torch's
        allocator: torch.cuda.max_memory_allocated counts them too)."""
        out = (ctypes.c_int64 * 4)()
        _library().cellc_driver_memory_stats(self._driver()[0], out)
        return dict(zip(["kept_bytes", "forward_peak_bytes", "backward_peak_bytes",
                         "live_bytes"], out))

    def registers(self, kernel, variant="save"):
        if self.emulate:
            raise CudaError("registers are the CUDA driver's figure; the SIMT emulator "
                            "has none")
        n = ctypes.c_int()
        buf = ctypes.create_string_buffer(1024)
        _check(self._lib.cellc_cuda_registers(self.modules[variant], kernel.encode(),
                                              ctypes.byref(n), buf, len(buf)), buf)
        return n.value

    # Launching ---------------------------------------------------------------

    def launch(self, kernel, variant, tensors, batch, stream=None):
        """Launches `kernel` with one tensor (or int) per argument of the
        package, in order; memrefs are passed as MLIR's expanded descriptors.
        Batch-tiled kernels get a CTA per batch tile; persistent ones
        `ctas` CTAs per tile, launched cooperatively unless split by heads."""
        import torch
        info = self.package.kernels[kernel]
        args = info["args"]
        if len(tensors) != len(args):
            raise ValueError(f"{kernel} takes {len(args)} arguments, got {len(tensors)}")
        keep, ptrs, buffers = [], [], []

        def push(value):
            keep.append(value)
            ptrs.append(ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))

        for arg, t in zip(args, tensors):
            if not arg["memref"]:
                push(ctypes.c_int64(int(t)))
                continue
            shape = arg["shape"]
            if t.dim() != len(shape) or any(s not in (-1, d) for s, d in zip(shape, t.shape)):
                raise ValueError(f"{kernel}: argument {arg['kind']} {arg['name']} "
                                 f"needs shape {shape}, got {list(t.shape)}")
            if t.is_cuda == self.emulate or not t.is_contiguous():
                raise ValueError(f"{kernel}: argument {arg['name']} must be a "
                                 f"contiguous {self._device_kind} tensor")
            if t.dtype != _torch_dtype(arg):
                raise TypeError(f"{kernel}: argument {arg['kind']} {arg['name']} "
                                f"must be {_torch_dtype(arg)}, got {t.dtype}")
            buffers += [t.data_ptr(), t.numel() * t.element_size()]
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_int64(0))
            for d in t.shape:
                push(ctypes.c_int64(d))
            for s in t.stride():
                push(ctypes.c_int64(s))
        params = (ctypes.c_void_p * len(ptrs))(*ptrs)
        tiles = max(1, -(-batch // info["batch_tile"]))
        if "ctas" in info:  # persistent: the CTAs of a tile along x, tiles along y
            # Split by heads, a tile's CTAs do not wait for each other.
            grid, cooperative = (info["ctas"], tiles), int("heads" not in info)
        else:
            grid, cooperative = (tiles, 1), 0
        buf = ctypes.create_string_buffer(1024)
        if self.emulate:
            ranges = (ctypes.c_int64 * max(1, len(buffers)))(*buffers)
            _check(self._lib.cellc_emu_launch(
                self.modules[variant], kernel.encode(), grid[0], grid[1], info["threads"],
                info.get("dynamic_shared_bytes", 0), cooperative, params, ranges,
                len(buffers) // 2, self.shuffle_seed, buf, len(buf)), buf)
            return
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        _check(self._lib.cellc_cuda_launch(self.modules[variant], kernel.encode(),
                                           grid[0], grid[1], info["threads"],
                                           info.get("dynamic_shared_bytes", 0),
                                           cooperative, ctypes.c_void_p(stream),
                                           params, buf, len(buf)), buf)

    @property
    def _device_kind(self):
        return "CPU (the SIMT emulator's)" if self.emulate else "CUDA"

    @property
    def storage(self):
        """The dtype of x, h and the gates in memory: float32 or bfloat16."""
        return _torch_dtype(self.package.args(self.package.cell + "_fwd")[0])

    def _check_tensors(self, tensors, inputs=()):
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

    # The sequence, under autograd -----------------------------------------------

    def _driver(self):
        """The sequence driver over this package's kernels, with a backend of
        torch tensors; made on first use."""
        if getattr(self, "_driver_handle", None):
            return self._driver_handle, self._backend
        lib = _library()
        interface = lib.cellc_interface_new(b"f32")
        buf = ctypes.create_string_buffer(1024)
        try:
            for backward in (0, 1):
                kernel = self.package.cell + ("_bwd" if backward else "_fwd")
                info = self.package.kernels[kernel]
                for arg in info["args"]:
                    shape = (ctypes.c_int64 * max(1, len(arg["shape"])))(*arg["shape"])
                    element = arg.get("element", "") if arg["memref"] else ""
                    _check(lib.cellc_interface_arg(
                        interface, backward, arg["kind"].encode(), arg["name"].encode(),
                        arg.get("input", "").encode(), ",".join(arg.get("biases", [])).encode(),
                        arg.get("same_as", -1), int(arg.get("zero", False)), element.encode(),
                        len(arg["shape"]), shape, buf, len(buf)), buf)
                lib.cellc_interface_kernel(interface, backward, info["batch_tile"],
                                           info.get("workspace_bytes", 0))
            self._backend = _TorchBackend(self)
            handle = lib.cellc_driver_new(interface, ctypes.byref(self._backend.callbacks),
                                          buf, len(buf))
            if not handle:
                raise CudaError(buf.value.decode())
        finally:
            lib.cellc_interface_free(interface)
        self._driver_handle = handle
        return handle, self._backend

    def __call__(self, inputs, params, states=None, resets=None, recompute="none",
                 lengths=None):
        """Runs the sequence under autograd. inputs {name: [T, B, n]}, params
        {name: tensor}, states {name: [B, n]} (a matrix state in its declared
        dims, `[B, NH, K, V]`, or flat) or None: both the start states
        and the values that rows reset to. `recompute`: 'none' saves the
        gates, 'full' only the states and replays each step in backward,
        'chunk:K' the states every K steps and replays a chunk before its
        backward. Returns (outputs {name: [T, B, n]}, final states {name:
        [B, n]}, a matrix state in its declared dims).

        The sequence driver (runtime/driver, in C++) runs around the kernels:
        projections, chunks, replays, carried gradients and the gradients'
        GEMMs, on torch tensors and GEMMs through callbacks."""
        import torch
        if not isinstance(recompute, str):
            raise ValueError(f"recompute must be 'none', 'full' or 'chunk:K' with K > 0, "
                             f"not {recompute!r}")
        first = next(iter(inputs.values()))
        if first.dim() != 3:
            raise ValueError(f"inputs must be [T, B, n], got {list(first.shape)}")
        T, B = first.shape[:2]
        self._check_tensors(list(inputs.values()) + list(params.values())
                            + list((states or {}).values()))
        if resets is not None and (not isinstance(resets, torch.Tensor)
                                   or tuple(resets.shape) != (T, B)):
            raise ValueError(f"resets must be a bool tensor of shape {[T, B]}")
        for n, x in inputs.items():
            if x.dtype != self.storage:
                raise TypeError(f"input {n!r} is {x.dtype}, but this package stores "
                                f"its sequences as {self.storage} (cellc --storage)")
        interface = _Slots(self.package.meta["slots"])
        # A matrix state is given as [B, NH, K, V] (its declared dims) or
        # [B, NH*K*V]; the kernels take the flat vector.
        dims = self.package.meta.get("state_dims", {})
        states = dict(states or {})
        for n, size in interface.states:
            if n not in states:
                states[n] = first.new_zeros(B, size, dtype=torch.float32)
                continue
            t, declared = states[n], [B, *dims.get(n, [size])]
            if list(t.shape) not in ([B, size], declared):
                raise ValueError(f"state {n!r} must be {declared}, got {list(t.shape)}")
            states[n] = t.reshape(B, size)
        missing = [n for n, _ in interface.params if n not in params]
        if missing:
            raise ValueError(f"missing param {missing[0]!r}")
        flat = ([inputs[n] for n, _ in interface.inputs]
                + [params[n] for n, _ in interface.params]
                + [states[n] for n, _ in interface.states])
        results = _Sequence.apply(self, recompute, resets, list(lengths or []), interface,
                                  *flat)
        outs = results[:len(interface.outputs)]
        finals = results[len(interface.outputs):]
        from ._autograd import _shaped_states
        return (dict(zip([n for n, _ in interface.outputs], outs)),
                _shaped_states(dict(zip([n for n, _ in interface.states], finals)), dims))


    # The sequence as a torch operator (cellc::sequence) runs it --------------

    def layout(self, mode, has_lengths):
        """What a call returns and keeps, as cellc.Cell.layout says: the
        outputs' and final states' (width, dtype), the kept buffers (per
        chunk, width, dtype) of a training forward in `mode`, and the outputs
        it reads as states' histories."""
        import torch
        handle, backend = self._driver()
        slots = _Slots(self.package.meta["slots"])
        capacity = 16
        layout = (ctypes.c_int64 * (3 * capacity))()
        count, num_read = ctypes.c_int64(), ctypes.c_int64()
        read = (ctypes.c_int64 * max(1, len(slots.outputs)))()
        backend.call(_library().cellc_driver_kept_layout, handle, mode.encode(),
                     int(bool(has_lengths)), layout, capacity, ctypes.byref(count), read,
                     ctypes.byref(num_read))
        dtypes = _TorchBackend._DTYPES
        return {"outputs": [(n, self.storage) for _, n in slots.outputs],
                "states": [(n, torch.float32) for _, n in slots.states],
                "kept": [(bool(layout[3 * i]), layout[3 * i + 1], dtypes[layout[3 * i + 2]])
                         for i in range(min(count.value, capacity))],
                "read": list(read[:num_read.value])}

    def _register_call(self, backend, inputs, params, states, resets):
        backend.device = inputs[0].device
        return ([backend.register(t) for t in inputs],
                [backend.register(p.detach()) for p in params],
                [backend.register(t.detach() if t is not None else None) for t in states],
                [backend.register(resets)])

    def forward_kept(self, mode, inputs, params, states, resets, lengths, outputs, finals,
                     kept):
        """One forward into the caller's `outputs`, `finals` and, when `kept`
        is not None, kept buffers (a training forward). `states` may be
        empty (zeros), `lengths` a list."""
        handle, backend = self._driver()
        T, B = inputs[0].shape[:2]
        views = self._register_call(backend, inputs, params,
                                    states or [None] * len(self.layout_states()), resets)
        views += ([backend.register(t) for t in outputs],
                  [backend.register(t) for t in finals],
                  [backend.register(t) for t in kept or []])
        n = (ctypes.c_int64 * max(1, len(lengths)))(*lengths)
        lib = _library()
        try:
            if kept is None:
                backend.call(lib.cellc_driver_forward, handle, mode.encode(), T, B,
                             *[_views(v) for v in views[:4]], n, len(lengths),
                             _views(views[4]), _views(views[5]), None, 0)
            else:
                backend.call(lib.cellc_driver_forward_kept, handle, mode.encode(), T, B,
                             *[_views(v) for v in views[:4]], n, len(lengths),
                             *[_views(v) for v in views[4:]], len(kept))
        finally:
            for v in views:
                backend.unregister(v)

    def backward_kept(self, mode, inputs, params, states, resets, lengths, outputs, kept,
                      grad_outputs, grad_finals, grad_inputs, grad_params, grad_states):
        """The backward of a `forward_kept`: its Saved made again from the
        caller's kept buffers and outputs (None: not read), gradients written
        into the caller's (None: not wanted)."""
        handle, backend = self._driver()
        T, B = inputs[0].shape[:2]
        n_states = len(self.layout_states())
        views = self._register_call(backend, inputs, params, states or [None] * n_states,
                                    resets)
        rest = ([backend.register(t) for t in outputs],
                [backend.register(t) for t in kept],
                [backend.register(g) for g in grad_outputs],
                [backend.register(g) for g in grad_finals],
                [backend.register(g) for g in grad_inputs],
                [backend.register(g) for g in grad_params],
                [backend.register(g) for g in grad_states or [None] * n_states])
        n = (ctypes.c_int64 * max(1, len(lengths)))(*lengths)
        lib = _library()
        saved = ctypes.c_void_p()
        try:
            backend.call(lib.cellc_driver_adopt, handle, mode.encode(), T, B,
                         *[_views(v) for v in views], n, len(lengths), _views(rest[0]),
                         _views(rest[1]), len(kept), ctypes.byref(saved))
            backend.call(lib.cellc_driver_backward, handle, saved, *[_views(v) for v in views],
                         n, len(lengths), *[_views(v) for v in rest[2:]])
        finally:
            if saved.value:
                lib.cellc_saved_free(saved)
            for v in views + rest:
                backend.unregister(v)

    def layout_states(self):
        return _Slots(self.package.meta["slots"]).states


class _Slots:
    """A package's inputs, params, states and outputs with their sizes, in
    the driver's order (kernels.json's "slots", written by the compiler)."""

    def __init__(self, slots):
        self.inputs = [(n, shape[-1]) for n, shape in slots["inputs"]]
        self.params = [(n, shape) for n, shape in slots["params"]]
        self.states = [(n, shape[-1]) for n, shape in slots["states"]]
        self.outputs = [(n, shape[-1]) for n, shape in slots["outputs"]]


class _TorchBackend:
    """The sequence driver's backend on torch tensors: memory from torch's
    allocator (so its peak counts it), GEMMs and element-wise work in torch,
    kernels launched through the CudaCell (or a stand-in, in tests). Buffers
    are named by ids; the caller's tensors are registered for a call."""

    _DTYPES = None

    def __init__(self, cell):
        import torch
        self.cell = cell
        self.buffers = {}
        self.next_id = 0
        self.device = None
        self.error = None
        if _TorchBackend._DTYPES is None:
            lib = _library()
            _TorchBackend._DTYPES = {
                lib.cellc_element(name.encode()): dtype
                for name, dtype in (("f32", torch.float32), ("f64", torch.float64),
                                    ("bf16", torch.bfloat16), ("i8", torch.uint8),
                                    ("i32", torch.int32))}
        self.codes = {dtype: code for code, dtype in _TorchBackend._DTYPES.items()}

        def guard(fn):
            def run(*args):
                try:
                    r = fn(*args)
                    return 0 if r is None else r
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                    if self.error is None:
                        self.error = e
                    return 1
            return run

        self.callbacks = _Callbacks(
            _ALLOCATE(guard(self._allocate)), _RELEASE(self._release),
            _LAUNCH(guard(self._launch)), _GEMM(guard(self._gemm)),
            _COLUMN_SUMS(guard(self._column_sums)), _FILL_ROWS(guard(self._fill_rows)),
            _BINARY(guard(self._copy)), _BINARY(guard(self._add)))

    # Buffers ------------------------------------------------------------------

    def register(self, tensor):
        """A view of the caller's `tensor` (None: no view) for one call."""
        if tensor is None:
            return _View(buffer=-1)
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        self.next_id += 1
        self.buffers[self.next_id] = tensor.reshape(-1)
        view = _View(buffer=self.next_id, offset=0, element=self.codes[tensor.dtype],
                     rank=tensor.dim())
        for i, d in enumerate(tensor.shape):
            view.shape[i] = d
        return view

    def unregister(self, views):
        for v in views:
            self.buffers.pop(v.buffer, None)

    def tensor(self, view):
        v = view.contents if hasattr(view, "contents") else view
        flat = self.buffers[v.buffer]
        shape = [v.shape[i] for i in range(v.rank)]
        n = 1
        for d in shape:
            n *= d
        # Detached: the kernels (or a stand-in's in-place copies) write it
        # outside autograd.
        return flat[v.offset:v.offset + n].view(shape).detach()

    def matrix(self, view, ld, rows, cols):
        """The `rows x cols` matrix at the view's first element, rows `ld`
        apart (a block of a wider matrix when `ld > cols`)."""
        v = view.contents if hasattr(view, "contents") else view
        flat = self.buffers[v.buffer]
        return flat.as_strided((rows, cols), (ld, 1), flat.storage_offset() + v.offset).detach()

    def _allocate(self, elements, element, zero, out):
        import torch
        make = torch.zeros if zero else torch.empty
        self.next_id += 1
        self.buffers[self.next_id] = make(elements, dtype=_TorchBackend._DTYPES[element],
                                          device=self.device)
        out[0] = self.next_id

    def _release(self, buffer):
        self.buffers.pop(buffer, None)

    # Work ---------------------------------------------------------------------

    def _launch(self, backward, save_gates, nargs, args, batch):
        values = []
        for i in range(nargs):
            a = args[i]
            values.append(int(a.index) if a.is_index else self.tensor(a.view))
        kernel = self.cell.package.cell + ("_bwd" if backward else "_fwd")
        self.cell.launch(kernel, "save" if save_gates else "replay", values, batch)

    def _gemm(self, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
        A = self.matrix(a, lda, k, m) if ta else self.matrix(a, lda, m, k)
        B = self.matrix(b, ldb, n, k) if tb else self.matrix(b, ldb, k, n)
        C = self.matrix(c, ldc, m, n)
        A = A.t() if ta else A
        B = B.t() if tb else B
        product = (A @ B.to(A.dtype)).to(C.dtype)
        if beta == 0:
            C.copy_(product)
        else:
            C.mul_(beta).add_(product)

    def _column_sums(self, m, rows, cols, acc):
        import torch
        M = self.tensor(m).reshape(rows, cols)
        out = self.tensor(acc).reshape(-1)
        out.add_(M.to(torch.float32).sum(0).to(out.dtype))

    def _fill_rows(self, m, rows, cols, n, vectors):
        M = self.tensor(m).reshape(rows, cols)
        if n == 0:
            M.zero_()
            return
        total = sum(self.tensor(vectors[i]).reshape(-1).to(M.dtype) for i in range(n))
        M.copy_(total.expand(rows, cols))

    def _copy(self, src, dst):
        to = self.tensor(dst)
        to.copy_(self.tensor(src).reshape(to.shape))

    def _add(self, src, dst):
        to = self.tensor(dst)
        to.add_(self.tensor(src).reshape(to.shape).to(to.dtype))

    # Calls --------------------------------------------------------------------

    def call(self, fn, *args):
        """Calls a driver entry point; an error in a callback is raised as
        itself, and one in the driver as a CudaError (a ValueError for a bad
        recompute mode)."""
        buf = ctypes.create_string_buffer(2048)
        self.error = None
        status = fn(*args, buf, len(buf))
        if status:
            error, self.error = self.error, None
            if error is not None:
                raise error
            message = buf.value.decode()
            if message.startswith("unknown recompute mode"):
                raise ValueError(message.replace("unknown recompute mode",
                                                 "recompute must be 'none', 'full' or "
                                                 "'chunk:K' with K > 0, not") )
            raise CudaError(message)


class _Saved:
    """What a forward keeps for its backward (the driver's Saved), with the
    registrations of the outputs it reads as states' histories: freed when
    autograd frees the graph, so that a second backward (retain_graph) finds
    it."""

    def __init__(self, handle, backend, outputs):
        self.handle, self.backend, self.outputs = handle, backend, outputs
        self._lib = _library()

    def outputs_read(self):
        n = len(self.outputs)
        indices = (ctypes.c_int64 * max(1, n))()
        count = self._lib.cellc_saved_outputs_read(self.handle, indices, n)
        return list(indices[:count])

    def __del__(self):
        if self.handle:
            self._lib.cellc_saved_free(self.handle)
            self.backend.unregister(self.outputs)
            self.handle = None


def _views(views):
    return (_View * max(1, len(views)))(*views)


def _sequence_class():
    import torch

    from ._autograd import keep_until_backward

    class Sequence(torch.autograd.Function):
        @staticmethod
        def forward(ctx, cell, mode, resets, lengths, slots, *flat):
            handle, backend = cell._driver()
            n_in, n_par = len(slots.inputs), len(slots.params)
            inputs, params, states = flat[:n_in], flat[n_in:n_in + n_par], flat[n_in + n_par:]
            T, B = inputs[0].shape[:2]
            backend.device = inputs[0].device
            outputs = [inputs[0].new_empty(T, B, n) for _, n in slots.outputs]
            finals = [states[i].new_empty(B, n) for i, (_, n) in enumerate(slots.states)]
            r = resets.to(torch.uint8).contiguous() if resets is not None else None
            views = ([backend.register(t) for t in inputs],
                     [backend.register(p.detach()) for p in params],
                     [backend.register(s.detach()) for s in states],
                     [backend.register(r)],
                     [backend.register(o) for o in outputs],
                     [backend.register(f) for f in finals])
            # Inside forward autograd is off: whether a gradient is wanted is
            # in needs_input_grad (cell, mode, resets, lengths and slots first).
            training = any(ctx.needs_input_grad[5:])
            ctx_lengths = lengths
            lengths = (ctypes.c_int64 * max(1, len(lengths)))(*lengths)
            saved = ctypes.c_void_p()
            try:
                # An output that is a state is that state's history: its
                # buffer stays registered as long as what forward keeps.
                backend.call(_library().cellc_driver_forward, handle, mode.encode(), T, B,
                             _views(views[0]), _views(views[1]), _views(views[2]),
                             _views(views[3]), lengths, len(ctx_lengths),
                             _views(views[4]), _views(views[5]),
                             ctypes.byref(saved) if training else None, 1)
            finally:
                for v in views[:4] + views[5:]:
                    backend.unregister(v)
                if not saved.value:
                    backend.unregister(views[4])
            ctx.cell, ctx.resets, ctx.slots = cell, r, slots
            kept = _Saved(saved, backend, views[4]) if saved.value else None
            ctx.lengths = ctx_lengths
            cell.saved_bytes = _library().cellc_saved_bytes(saved) if saved.value else 0
            read = kept.outputs_read() if kept else []
            # Saved, so that autograd catches an in-place change of them; what
            # forward kept last, so that autograd frees it after the backward.
            ctx.save_for_backward(*flat, *[outputs[i] for i in read],
                                  *([keep_until_backward(kept)] if kept else []))
            return tuple(outputs) + tuple(finals)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            cell, slots = ctx.cell, ctx.slots
            handle, backend = cell._driver()
            n_in, n_par = len(slots.inputs), len(slots.params)
            # The kept outputs (read through what forward kept) come next,
            # and what forward kept last.
            flat = ctx.saved_tensors[:n_in + n_par + len(slots.states)]
            kept = ctx.saved_tensors[-1].cellc_kept
            inputs, params, states = flat[:n_in], flat[n_in:n_in + n_par], flat[n_in + n_par:]
            n_out = len(slots.outputs)
            g_out = [g.to(inputs[0].dtype).contiguous() if g is not None else None
                     for g in grads[:n_out]]
            g_fin = [g.to(states[i].dtype).contiguous() if g is not None else None
                     for i, g in enumerate(grads[n_out:])]
            # Contiguous, whatever the strides of what they are the gradients
            # of (a transposed param): the driver writes into them. Only those
            # autograd wants (cell, mode, resets, lengths and slots come first).
            wanted = ctx.needs_input_grad[5:]
            grads_of = lambda ts, first: [
                torch.empty(t.shape, dtype=t.dtype, device=t.device) if wanted[first + i]
                else None for i, t in enumerate(ts)]
            d_in = grads_of(inputs, 0)
            d_par = grads_of(params, n_in)
            d_st = grads_of(states, n_in + n_par)
            backend.device = inputs[0].device
            views = ([backend.register(t) for t in inputs],
                     [backend.register(p.detach()) for p in params],
                     [backend.register(s.detach()) for s in states],
                     [backend.register(ctx.resets)],
                     [backend.register(g) for g in g_out],
                     [backend.register(g) for g in g_fin],
                     [backend.register(t) for t in d_in],
                     [backend.register(t) for t in d_par],
                     [backend.register(t) for t in d_st])
            try:
                lengths = (ctypes.c_int64 * max(1, len(ctx.lengths)))(*ctx.lengths)
                backend.call(_library().cellc_driver_backward, handle, kept.handle,
                             *[_views(v) for v in views[:4]], lengths, len(ctx.lengths),
                             *[_views(v) for v in views[4:]])
            finally:
                for v in views:
                    backend.unregister(v)
            return (None,) * 5 + tuple(d_in) + tuple(d_par) + tuple(d_st)

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

"""Runs AOT-compiled cellc CUDA kernels (a package from `cellc --emit=package`).

This module needs neither MLIR/LLVM nor the `_cellc` extension: it talks to
`libcellc_cuda.so` (runtime/cuda, which loads libcuda with dlopen) through
ctypes, and leaves the hoisted GEMMs to torch. It imports on machines without
a GPU; using it there raises `CudaUnavailable` with the reason.
"""

import ctypes
import json
import os

__all__ = ["CudaUnavailable", "CudaError", "available", "Package", "CudaCell"]


class CudaUnavailable(RuntimeError):
    """No CUDA driver or GPU (or no libcellc_cuda.so) on this machine."""


class CudaError(RuntimeError):
    """A CUDA call failed; the message names the kernel and the error."""


_LIB = None


def _library():
    global _LIB
    if _LIB is not None:
        return _LIB
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("CELLC_CUDA_LIB", ""),
                  os.path.join(here, "libcellc_cuda.so"),
                  os.path.join(here, "..", "..", "lib", "libcellc_cuda.so")]
    for path in candidates:
        if path and os.path.exists(path):
            lib = ctypes.CDLL(path)
            break
    else:
        raise CudaUnavailable(
            "libcellc_cuda.so not found (build runtime/cuda, or set CELLC_CUDA_LIB)")
    err = [ctypes.c_char_p, ctypes.c_size_t]
    lib.cellc_cuda_available.argtypes = err
    lib.cellc_cuda_load.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                    ctypes.POINTER(ctypes.c_void_p)] + err
    lib.cellc_cuda_unload.argtypes = [ctypes.c_void_p]
    lib.cellc_cuda_launch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint,
                                      ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_void_p)] + err
    lib.cellc_cuda_registers.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_int)] + err
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
        if self.meta.get("format") != 1:
            raise ValueError(f"{path}: unknown package format {self.meta.get('format')}")
        self.cell = self.meta["cell"]
        self.kernels = self.meta["kernels"]
        self.ptx = {}
        for variant, name in self.meta["ptx"].items():
            with open(os.path.join(directory, name)) as f:
                self.ptx[variant] = f.read()

    def args(self, kernel):
        return self.kernels[kernel]["args"]


def _check(status, buf):
    if status != 0:
        message = buf.value.decode()
        if message.startswith("no CUDA driver/GPU"):
            raise CudaUnavailable(message)
        raise CudaError(message)


class CudaCell:
    """A package's kernels loaded on one device, launched on torch's stream.

    `forward` runs the whole sequence: the input projections as torch GEMMs,
    then the forward kernel, one CTA per batch tile. It allocates its outputs
    with torch (the kernel itself allocates nothing).
    """

    def __init__(self, package, device=0):
        self.package = package
        lib = _library()
        self._lib = lib
        self.modules = {}
        for variant, ptx in package.ptx.items():
            handle = ctypes.c_void_p()
            buf = ctypes.create_string_buffer(8192)
            _check(lib.cellc_cuda_load(device, ptx.encode(), ctypes.byref(handle),
                                       buf, len(buf)), buf)
            self.modules[variant] = handle

    def __del__(self):
        for handle in getattr(self, "modules", {}).values():
            self._lib.cellc_cuda_unload(handle)

    def registers(self, kernel, variant="save"):
        n = ctypes.c_int()
        buf = ctypes.create_string_buffer(1024)
        _check(self._lib.cellc_cuda_registers(self.modules[variant], kernel.encode(),
                                              ctypes.byref(n), buf, len(buf)), buf)
        return n.value

    def launch(self, kernel, variant, tensors, batch, stream=None):
        """Launches `kernel` with one tensor (or int) per argument of the
        package, in order; memrefs are passed as MLIR's expanded descriptors."""
        import torch
        info = self.package.kernels[kernel]
        args = info["args"]
        if len(tensors) != len(args):
            raise ValueError(f"{kernel} takes {len(args)} arguments, got {len(tensors)}")
        keep, ptrs = [], []

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
            if not t.is_cuda or not t.is_contiguous():
                raise ValueError(f"{kernel}: argument {arg['name']} must be a "
                                 "contiguous CUDA tensor")
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_int64(0))
            for d in t.shape:
                push(ctypes.c_int64(d))
            for s in t.stride():
                push(ctypes.c_int64(s))
        params = (ctypes.c_void_p * len(ptrs))(*ptrs)
        tile = info["batch_tile"]
        grid = max(1, (batch + tile - 1) // tile)
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(1024)
        _check(self._lib.cellc_cuda_launch(self.modules[variant], kernel.encode(), grid,
                                           info["threads"], 0, ctypes.c_void_p(stream),
                                           params, buf, len(buf)), buf)

    def forward(self, inputs, params, states=None, resets=None, save_gates=True):
        """inputs: {name: [T, B, n]}, params: {name: tensor}, states: {name:
        [B, n]} or None. Returns (outputs {name: [T, B, n]}, history {name:
        [T, B, n]}, gates [T, B, S])."""
        import torch
        kernel = self.package.cell + "_fwd"
        args = self.package.args(kernel)
        first = next(iter(inputs.values()))
        T, B = first.shape[0], first.shape[1]
        device, dtype = first.device, first.dtype
        states = states or {}
        tensors, outputs, history, gates = [], {}, {}, None
        for arg in args:
            kind, name, shape = arg["kind"], arg["name"], arg["shape"]
            if kind == "input":
                tensors.append(inputs[name].contiguous())
            elif kind == "projection":
                x = inputs[arg["input"]]
                p = x @ params[name].t()
                for bias in arg.get("biases", []):
                    p = p + params[bias]
                tensors.append(p.contiguous())
            elif kind == "resets":
                r = resets if resets is not None else torch.zeros(T, B, dtype=torch.bool, device=device)
                tensors.append(r.to(torch.uint8).contiguous())
            elif kind in ("initial_state", "start_state"):
                s = states.get(name)
                tensors.append(s.contiguous() if s is not None
                               else torch.zeros(B, shape[-1], device=device, dtype=dtype))
            elif kind == "param":
                tensors.append(params[name].contiguous())
            elif kind == "output":
                outputs[name] = torch.empty(T, B, shape[-1], device=device, dtype=dtype)
                tensors.append(outputs[name])
            elif kind == "state_history":
                history[name] = torch.empty(T, B, shape[-1], device=device, dtype=dtype)
                tensors.append(history[name])
            elif kind == "gates":
                # The replaying variant never touches it: an empty buffer.
                gates = torch.empty(T if save_gates else 0, B, shape[-1],
                                    device=device, dtype=dtype)
                tensors.append(gates)
            elif kind == "batch_begin":
                tensors.append(0)
            elif kind == "batch_end":
                tensors.append(B)
            else:
                raise ValueError(f"{kernel}: unexpected argument kind {kind}")
        self.launch(kernel, "save" if save_gates else "replay", tensors, B)
        return outputs, history, gates

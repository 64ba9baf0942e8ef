"""The chunk form's kernel templates on CUDA kernels (runtime/cuda/ChunkKernels.cu,
through the runtime's C interface, cellc_cuda_chunk_* and _delta_*): on a
GPU, or in the SIMT emulator for the CUDA target's emulated calls. The same
arguments, results and adjoints as cellc._chunkcore's _DiagonalCore and
_DeltaCore, in float32, on the time-major arrays the CPU's kernels take."""

import atexit
import ctypes
import os
import shutil
import tempfile

import torch

from . import cuda as _cuda


class _Shape(ctypes.Structure):
    """cellc_chunk_shape (runtime/cuda/CudaC.h)."""
    _fields_ = [("BH", ctypes.c_int64), ("T", ctypes.c_int64), ("K", ctypes.c_int32),
                ("V", ctypes.c_int32), ("L", ctypes.c_int32), ("reads", ctypes.c_int32),
                ("tensor_cores", ctypes.c_int32)]


#: The kernels' products on the tensor cores (3xTF32, about f32's
#: precision) where the shape tiles (K and L multiples of 16, V of 8);
#: False: on FMAs.
TENSOR_CORES = True


_TYPED = False


def _lib():
    global _TYPED
    lib = _cuda._library()
    if not _TYPED:
        P, err = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_size_t]
        shape = ctypes.POINTER(_Shape)
        lib.cellc_cuda_chunk_open.argtypes = [ctypes.c_int32, ctypes.c_char_p,
                                              ctypes.c_uint64] + err
        lib.cellc_cuda_chunk_open.restype = P
        lib.cellc_cuda_chunk_free.argtypes = [P]
        lib.cellc_cuda_chunk_admit.argtypes = [P, shape, ctypes.c_int32] + err
        lib.cellc_cuda_chunk_forward.argtypes = [P, shape] + [P] * 10 + err
        lib.cellc_cuda_chunk_backward.argtypes = [P, shape] + [P] * 15 + err
        lib.cellc_cuda_delta_forward.argtypes = [P, shape] + [P] * 10 + err
        lib.cellc_cuda_delta_backward.argtypes = [P, shape] + [P] * 16 + err
        _TYPED = True
    return lib


class _Kernels:
    """The kernels opened on one device (a GPU's index, or None: the
    emulator)."""

    def __init__(self, index, seed):
        lib = _lib()
        path = None
        if index is None:
            path = _simt_object()
        buf = _cuda._error_buffer()
        self._lib = lib
        self._handle = lib.cellc_cuda_chunk_open(-1 if index is None else index,
                                                 None if path is None else path.encode(),
                                                 seed, buf, len(buf))
        if not self._handle:
            _cuda._raise(buf)
        self.emulated = index is None
        #: fitting()'s answers, by shape.
        self._fits = {}

    def __del__(self):
        if getattr(self, "_handle", None):
            self._lib.cellc_cuda_chunk_free(self._handle)
            self._handle = None

    def admits(self, shape, delta=False):
        buf = _cuda._error_buffer()
        return self._lib.cellc_cuda_chunk_admit(self._handle, ctypes.byref(shape), int(delta),
                                                buf, len(buf)) == 0

    def fitting(self, shape, delta=False):
        """`shape` as the kernels run it on this device: with its products on
        the tensor cores where asked and their kernels fit, else on FMAs
        where those fit (the tensor cores' take more shared memory); None
        where neither does."""
        key = (shape.BH, shape.T, shape.K, shape.V, shape.L, shape.reads,
               shape.tensor_cores, bool(delta))
        if key not in self._fits:
            found = None
            for tc in ([1, 0] if shape.tensor_cores else [0]):
                s = _Shape(shape.BH, shape.T, shape.K, shape.V, shape.L, shape.reads, tc)
                if self.admits(s, delta):
                    found = s
                    break
            self._fits[key] = found
        return self._fits[key]

    def call(self, name, shape, tensors, like):
        stream = (None if self.emulated
                  else torch.cuda.current_stream(like.device).cuda_stream)
        buf = _cuda._error_buffer()
        fn = getattr(self._lib, "cellc_cuda_" + name)
        if fn(self._handle, ctypes.byref(shape), *[t.data_ptr() for t in tensors], stream,
              buf, len(buf)):
            _cuda._raise(buf)


_OBJECT = None


def _simt_object():
    """The emulator's object of the kernels, written once a process by the
    compiler (cellc._cellc.chunk_kernels_simt) from the IR whose PTX a GPU
    runs."""
    global _OBJECT
    if _OBJECT is None:
        from . import _cellc
        where = tempfile.mkdtemp(prefix="cellc-chunk-simt-")
        atexit.register(shutil.rmtree, where, True)
        path = os.path.join(where, "chunk_kernels.simt.so")
        _cellc.chunk_kernels_simt(path)
        _OBJECT = path
    return _OBJECT


_OPEN = {}


def kernels(device, seed=0):
    """The kernels for tensors on `device`: a CUDA device's, or the
    emulator's for CPU tensors (the CUDA target's emulated calls)."""
    index = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, seed)
    if key not in _OPEN:
        _OPEN[key] = _Kernels(index, seed)
    return _OPEN[key]


def _shape(T, BH, K, V, L, reads):
    return _Shape(BH, T, K, V, L, reads, int(TENSOR_CORES))


def usable(device, T, BH, K, V, L, reads, dtype, seed=0, delta=False):
    """Whether the kernels run this core (the diagonal template, or the
    delta rule's): float32, and their shared memory within what the device
    grants a CTA, on the tensor cores or on FMAs (fitting())."""
    if dtype != torch.float32:
        return False
    return kernels(device, seed).fitting(_shape(T, BH, K, V, L, reads), delta) is not None


def _fitted(kern, shape, delta):
    """The shape the kernels run (fitting()), or the device's refusal."""
    fit = kern.fitting(shape, delta)
    if fit is None:
        buf = _cuda._error_buffer()
        kern._lib.cellc_cuda_chunk_admit(kern._handle, ctypes.byref(shape), int(delta), buf,
                                         len(buf))
        raise _cuda.CudaError(buf.value.decode())
    return fit


def _time_major(t):
    return t.permute(2, 0, 1, 3).contiguous()


class DiagonalCore(torch.autograd.Function):
    """_DiagonalCore (cellc._chunkcore) on the CUDA kernels: a [B, H, T, K]
    (a scalar gate spread over K), k and each q [B, H, T, K], v [B, H, T, V],
    S0 [B, H, K, V]; the reads' outputs [B, H, T, V] and the end state."""

    @staticmethod
    def forward(ctx, seed, a, k, v, S0, L, *qs):
        Bn, H, T, K = a.shape
        V = v.shape[-1]
        R, NC = len(qs), -(-T // L)
        shape = _shape(T, Bn * H, K, V, L, R)
        a, k, v = _time_major(a), _time_major(k), _time_major(v)
        q = torch.stack([_time_major(x) for x in qs])
        S0 = S0.contiguous()
        out = v.new_empty((R, T, Bn, H, V))
        starts, end = v.new_empty((Bn, H, NC, K, V)), v.new_empty((Bn, H, K, V))
        pairs = v.new_empty((Bn * H, NC, R, L, L))
        kern = kernels(a.device, seed)
        shape = _fitted(kern, shape, False)
        kern.call("chunk_forward", shape, [a, k, v, S0, q, out, starts, end, pairs], v)
        ctx.save_for_backward(a, k, v, starts, end, pairs, q)
        ctx.shape, ctx.kern = shape, kern
        return (*[o.permute(1, 2, 0, 3) for o in out], end)

    @staticmethod
    def backward(ctx, *grads):
        a, k, v, starts, end, pairs, q = ctx.saved_tensors
        douts = torch.stack([torch.zeros_like(v) if g is None else _time_major(g)
                             for g in grads[:-1]])
        dEnd = torch.zeros_like(end) if grads[-1] is None else grads[-1].contiguous()
        da, dk, dv = torch.empty_like(a), torch.empty_like(k), torch.empty_like(v)
        dS0, dq = torch.empty_like(end), torch.empty_like(q)
        ctx.kern.call("chunk_backward", ctx.shape,
                      [a, k, v, starts, end, pairs, q, douts, dEnd, da, dk, dv, dS0, dq], v)
        bhtk = lambda t: t.permute(1, 2, 0, 3)
        return (None, bhtk(da), bhtk(dk), bhtk(dv), dS0, None, *[bhtk(d) for d in dq])


class DeltaCore(torch.autograd.Function):
    """_DeltaCore (cellc._chunkcore) on the CUDA kernels: a [B, H, T] (a
    scalar log-gate a step), k and each q [B, H, T, K], the targets w
    [B, H, T, V], beta [B, H, T, 1], S0 [B, H, K, V]; the reads' outputs
    [B, H, T, V] and the end state."""

    @staticmethod
    def forward(ctx, seed, a, k, w, beta, S0, L, *qs):
        Bn, H, T, K = k.shape
        V = w.shape[-1]
        R, NC = len(qs), -(-T // L)
        shape = _shape(T, Bn * H, K, V, L, R)
        a = a.permute(2, 0, 1).contiguous()
        beta = beta[..., 0].permute(2, 0, 1).contiguous()
        k, w = _time_major(k), _time_major(w)
        q = torch.stack([_time_major(x) for x in qs])
        S0 = S0.contiguous()
        out = w.new_empty((R, T, Bn, H, V))
        starts, end = w.new_empty((Bn, H, NC, K, V)), w.new_empty((Bn, H, K, V))
        kern = kernels(k.device, seed)
        shape = _fitted(kern, shape, True)
        kern.call("delta_forward", shape, [a, k, w, beta, S0, q, out, starts, end], w)
        ctx.save_for_backward(a, k, w, beta, starts, end, q)
        ctx.shape, ctx.kern = shape, kern
        return (*[o.permute(1, 2, 0, 3) for o in out], end)

    @staticmethod
    def backward(ctx, *grads):
        a, k, w, beta, starts, end, q = ctx.saved_tensors
        douts = torch.stack([torch.zeros_like(w) if g is None else _time_major(g)
                             for g in grads[:-1]])
        dEnd = torch.zeros_like(end) if grads[-1] is None else grads[-1].contiguous()
        da, dk, dw = torch.empty_like(a), torch.empty_like(k), torch.empty_like(w)
        dbeta, dS0, dq = torch.empty_like(beta), torch.empty_like(end), torch.empty_like(q)
        ctx.kern.call("delta_backward", ctx.shape,
                      [a, k, w, beta, starts, end, q, douts, dEnd, da, dk, dw, dbeta, dS0,
                       dq], w)
        bhtk = lambda t: t.permute(1, 2, 0, 3)
        return (None, da.permute(1, 2, 0), bhtk(dk), bhtk(dw),
                dbeta.permute(1, 2, 0)[..., None], dS0, None, *[bhtk(d) for d in dq])

"""Runs AOT-compiled cellc CUDA kernels (a package from `cellc --emit=package`).

This module needs neither MLIR/LLVM nor the `_cellc` extension: it talks to
`libcellc_cuda.so` (runtime/cuda, which loads libcuda with dlopen) through
ctypes, and leaves the hoisted GEMMs to torch. It imports on machines without
a GPU; using it there raises `CudaUnavailable` with the reason.
"""

import ctypes
import json
import os

__all__ = ["CudaUnavailable", "CudaError", "available", "Package", "CudaCell",
           "parse_recompute"]


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
                                      ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                      ctypes.c_int, ctypes.c_void_p,
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


def parse_recompute(recompute):
    """'none', 'full' or 'chunk:K' as (kind, K)."""
    if recompute in ("none", "full"):
        return recompute, 0
    if isinstance(recompute, str) and recompute.startswith("chunk:"):
        try:
            k = int(recompute[6:])
        except ValueError:
            k = 0
        if k > 0:
            return "chunk", k
    raise ValueError(f"recompute must be 'none', 'full' or 'chunk:K' with K > 0, "
                     f"not {recompute!r}")


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
        #: Bytes the last call kept for its backward (0 without autograd).
        self.saved_bytes = 0

    def __del__(self):
        for handle in getattr(self, "modules", {}).values():
            self._lib.cellc_cuda_unload(handle)

    def registers(self, kernel, variant="save"):
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
        `ctas` CTAs per tile, launched cooperatively."""
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
            if t.dtype != _torch_dtype(arg):
                raise TypeError(f"{kernel}: argument {arg['kind']} {arg['name']} "
                                f"must be {_torch_dtype(arg)}, got {t.dtype}")
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_void_p(t.data_ptr()))
            push(ctypes.c_int64(0))
            for d in t.shape:
                push(ctypes.c_int64(d))
            for s in t.stride():
                push(ctypes.c_int64(s))
        params = (ctypes.c_void_p * len(ptrs))(*ptrs)
        tiles = max(1, -(-batch // info["batch_tile"]))
        if info.get("strategy") == "persistent":
            grid, cooperative = (info["ctas"], tiles), 1
        else:
            grid, cooperative = (tiles, 1), 0
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(1024)
        _check(self._lib.cellc_cuda_launch(self.modules[variant], kernel.encode(),
                                           grid[0], grid[1], info["threads"],
                                           info.get("dynamic_shared_bytes", 0),
                                           cooperative, ctypes.c_void_p(stream),
                                           params, buf, len(buf)), buf)

    @property
    def storage(self):
        """The dtype of x, h and the gates in memory: float32 or bfloat16."""
        import torch
        return torch.bfloat16 if self.package.meta.get("storage") == "bf16" else torch.float32

    def _check_tensors(self, tensors, inputs=()):
        import torch
        device = tensors[0].device
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"expected tensors, got {type(t).__name__}")
            if t.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"CudaCell's kernels take float32 or bfloat16 tensors, "
                                f"got {t.dtype}")
            if not t.is_cuda:
                raise ValueError(f"CudaCell runs on CUDA tensors; got a tensor on {t.device}")
            if t.device != device:
                raise ValueError(f"all tensors must be on one device; got {device} and {t.device}")

    def _arguments(self, kernel, value, B, device):
        """One tensor per argument of `kernel`: `value(arg)` for the caller's,
        the workspace and barrier words of a persistent kernel here."""
        import torch
        info = self.package.kernels[kernel]
        tiles = max(1, -(-B // info["batch_tile"]))
        out = []
        for arg in info["args"]:
            kind = arg["kind"]
            if kind == "workspace":
                out.append(torch.empty(tiles * info["workspace_bytes"] // 4,
                                       dtype=torch.float32, device=device))
            elif kind == "grid_barrier":
                out.append(torch.zeros(2 * tiles, dtype=torch.int32, device=device))
            elif kind == "batch_begin":
                out.append(0)
            elif kind == "batch_end":
                out.append(B)
            else:
                out.append(value(arg))
        return out

    def _projection(self, arg, inputs, params):
        x = inputs[arg["input"]]
        p = x @ params[arg["name"]].t().to(x.dtype)
        for bias in arg.get("biases", []):
            p = p + params[bias].to(x.dtype)
        return p.to(_torch_dtype(arg)).contiguous()

    # The sequence, without autograd --------------------------------------------

    def forward(self, inputs, params, states=None, resets=None, save_gates=True,
                initial=None):
        """inputs: {name: [T, B, n]}, params: {name: tensor}, states: {name:
        [B, n]} or None (zeros), the start states; `initial` the reset values
        (default: `states`). Returns (outputs {name: [T, B, n]}, history
        {name: [T, B, n]}, gates [T, B, S], empty when not saved)."""
        import torch
        kernel = self.package.cell + "_fwd"
        first = next(iter(inputs.values()))
        T, B = first.shape[0], first.shape[1]
        device, dtype = first.device, first.dtype
        states = states or {}
        initial = states if initial is None else initial
        outputs, history, gates = {}, {}, None

        def zeros(n):
            return torch.zeros(B, n, device=device, dtype=dtype)

        def value(arg):
            nonlocal gates
            kind, name, shape = arg["kind"], arg["name"], arg["shape"]
            if kind == "input":
                return inputs[name].contiguous()
            if kind == "projection":
                return self._projection(arg, inputs, params)
            if kind == "resets":
                r = resets if resets is not None else torch.zeros(T, B, dtype=torch.bool,
                                                                  device=device)
                return r.to(torch.uint8).contiguous()
            if kind in ("initial_state", "start_state"):
                s = (initial if kind == "initial_state" else states).get(name)
                return (s.to(_torch_dtype(arg)).contiguous() if s is not None
                        else zeros(shape[-1]).to(_torch_dtype(arg)))
            if kind == "param":
                return params[name].to(_torch_dtype(arg)).contiguous()
            if kind == "output":
                outputs[name] = torch.empty(T, B, shape[-1], device=device,
                                            dtype=_torch_dtype(arg))
                return outputs[name]
            if kind == "state_history":
                history[name] = torch.empty(T, B, shape[-1], device=device,
                                            dtype=_torch_dtype(arg))
                return history[name]
            if kind == "gates":
                # The replaying variant never touches it: an empty buffer.
                gates = torch.empty(T if save_gates else 0, B, shape[-1],
                                    device=device, dtype=_torch_dtype(arg))
                return gates
            raise ValueError(f"{kernel}: unexpected argument kind {kind}")

        tensors = self._arguments(kernel, value, B, device)
        self.launch(kernel, "save" if save_gates else "replay", tensors, B)
        return outputs, history, gates

    def backward(self, inputs, params, start, initial, resets, history, gates,
                 grad_outputs, grad_final, save_gates):
        """One backward kernel over the steps of `inputs`, with the GEMMs for
        the weight, bias and input gradients. `start` are the states before
        the first step, `initial` the reset values, `gates` what the forward
        saved (with `save_gates`). Returns (d_inputs, d_params, d_initial,
        d_start): dicts of tensors, the params' accumulated over B and T."""
        import torch
        kernel = self.package.cell + "_bwd"
        first = next(iter(inputs.values()))
        T, B = first.shape[0], first.shape[1]
        device, dtype = first.device, first.dtype
        written = []

        def zeros(*shape):
            return torch.zeros(*shape, device=device, dtype=dtype)

        def value(arg):
            kind, name, shape = arg["kind"], arg["name"], arg["shape"]
            if kind == "input":
                return inputs[name].contiguous()
            if kind == "projection":
                if save_gates:  # read only by the replay
                    return torch.empty(0, B, shape[-1], device=device,
                                       dtype=_torch_dtype(arg))
                return self._projection(arg, inputs, params)
            if kind == "resets":
                r = resets if resets is not None else torch.zeros(T, B, dtype=torch.bool,
                                                                  device=device)
                return r.to(torch.uint8).contiguous()
            want = _torch_dtype(arg)
            if kind in ("initial_state", "start_state"):
                s = (initial if kind == "initial_state" else start)[name]
                return s.to(want).contiguous()
            if kind == "param":
                return params[name].to(want).contiguous()
            if kind == "state_history":
                return history[name].contiguous()
            if kind == "gates":
                return gates if save_gates else torch.empty(0, B, shape[-1], device=device,
                                                            dtype=want)
            if kind == "output_grad":
                g = grad_outputs.get(name)
                return (g.to(want).contiguous() if g is not None
                        else zeros(T, B, shape[-1]).to(want))
            if kind == "final_state_grad":
                g = grad_final.get(name)
                return (g.to(want).contiguous() if g is not None
                        else zeros(B, shape[-1]).to(want))
            # Something the kernel writes.
            dims = [T if (len(shape) == 3 and d == 0) else B if n < 0 else n
                    for d, n in enumerate(shape)]
            t = torch.empty(*dims, device=device, dtype=want)
            written.append((kind, name, t))
            return t

        tensors = self._arguments(kernel, value, B, device)
        self.launch(kernel, "save" if save_gates else "replay", tensors, B)

        # Accumulated in float32, whatever the storage; GEMMs in the storage's
        # dtype (bf16 GEMMs accumulate in float32).
        d_inputs = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in inputs.items()}
        d_params = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in params.items()}
        d_initial, d_start = {}, {}
        projections = [a for a in self.package.args(kernel) if a["kind"] == "projection"]
        k = 0
        while k < len(written):
            kind, name, r = written[k]
            if kind == "initial_state_grad":
                d_initial[name] = r
            elif kind == "start_state_grad":
                d_start[name] = r
            elif kind == "input_grad":
                d_inputs[name] += r
            elif kind == "projection_grad":
                p = next(a for a in projections if a["name"] == name)
                x = inputs[p["input"]]
                rows = r.reshape(-1, r.shape[-1])
                d_params[name] += rows.t() @ x.reshape(-1, x.shape[-1]).to(r.dtype)
                d_inputs[p["input"]] += r @ params[name].to(r.dtype)
                for bias in p.get("biases", []):
                    d_params[bias] += rows.float().sum(0)
            elif kind == "weight_rows":
                # The next written buffer holds the matching vectors.
                vectors = written[k + 1][2]
                d_params[name] += (r.reshape(-1, r.shape[-1]).t()
                                   @ vectors.reshape(-1, vectors.shape[-1]).to(r.dtype))
                k += 1
            elif kind == "param_grad":
                d_params[name] += r.sum(0)
            k += 1
        d_inputs = {n: g.to(inputs[n].dtype) for n, g in d_inputs.items()}
        d_params = {n: g.to(params[n].dtype) for n, g in d_params.items()}
        return d_inputs, d_params, d_initial, d_start

    # The sequence, under autograd -----------------------------------------------

    def __call__(self, inputs, params, states=None, resets=None, recompute="none"):
        """Runs the sequence under autograd. inputs {name: [T, B, n]}, params
        {name: tensor}, states {name: [B, n]} or None: both the start states
        and the values that rows reset to. `recompute`: 'none' saves the
        gates, 'full' only the states and replays each step in backward,
        'chunk:K' the states every K steps and replays a chunk before its
        backward. Returns (outputs {name: [T, B, n]}, final states {name:
        [B, n]})."""
        import torch
        kind, k = parse_recompute(recompute)
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
        state_names = [a["name"] for a in self.package.args(self.package.cell + "_fwd")
                       if a["kind"] == "start_state"]
        sizes = {a["name"]: a["shape"][-1]
                 for a in self.package.args(self.package.cell + "_fwd")
                 if a["kind"] == "start_state"}
        states = dict(states or {})
        for n in state_names:
            if n not in states:
                states[n] = first.new_zeros(B, sizes[n])
        in_names, par_names = list(inputs), list(params)
        flat = ([inputs[n] for n in in_names] + [params[n] for n in par_names]
                + [states[n] for n in state_names])
        out_names = [a["name"] for a in self.package.args(self.package.cell + "_fwd")
                     if a["kind"] == "output"]
        results = _Sequence.apply(self, (kind, k), resets,
                                  (in_names, par_names, state_names, out_names), *flat)
        outs = results[:len(out_names)]
        finals = results[len(out_names):]
        return dict(zip(out_names, outs)), dict(zip(state_names, finals))


def _chunks(T, kind, k):
    if kind != "chunk":
        return [(0, T)]
    return [(t, min(t + k, T)) for t in range(0, T, k)]


def _sequence_class():
    import torch

    class Sequence(torch.autograd.Function):
        @staticmethod
        def forward(ctx, cell, mode, resets, names, *flat):
            in_names, par_names, state_names, out_names = names
            n_in, n_par = len(in_names), len(par_names)
            inputs = dict(zip(in_names, flat[:n_in]))
            params = dict(zip(par_names, flat[n_in:n_in + n_par]))
            initial = dict(zip(state_names, flat[n_in + n_par:]))
            kind, k = mode
            T = flat[0].shape[0]
            save = kind == "none"
            outputs, starts, finals, kept = {n: [] for n in out_names}, [], {}, {}
            start = initial
            for t0, t1 in _chunks(T, kind, k):
                part = {n: x[t0:t1] for n, x in inputs.items()}
                r = resets[t0:t1] if resets is not None else None
                outs, hist, gates = cell.forward(part, params, start, r,
                                                 save_gates=save, initial=initial)
                starts.append(start)
                for n in out_names:
                    outputs[n].append(outs[n])
                # Copies: the chunk's history may go, and outputs must not be views.
                start = {n: hist[n][-1].to(initial[n].dtype, copy=True) for n in state_names}
                if kind != "chunk":
                    kept = {"history": hist, "gates": gates}
            finals = start
            outs = [torch.cat(outputs[n]) if len(outputs[n]) > 1 else outputs[n][0]
                    for n in out_names]
            ctx.cell, ctx.mode, ctx.resets, ctx.names = cell, mode, resets, names
            ctx.inputs, ctx.params, ctx.initial = inputs, params, initial
            ctx.starts, ctx.kept = starts, kept
            saved = sum(t.numel() * t.element_size()
                        for t in list(kept.get("history", {}).values())
                        + ([kept["gates"]] if kept.get("gates") is not None else []))
            saved += sum(t.numel() * t.element_size() for s in starts[1:] for t in s.values())
            cell.saved_bytes = saved
            return tuple(outs) + tuple(finals[n] for n in state_names)

        @staticmethod
        def backward(ctx, *grads):
            cell, (kind, k), resets = ctx.cell, ctx.mode, ctx.resets
            in_names, par_names, state_names, out_names = ctx.names
            inputs, params, initial = ctx.inputs, ctx.params, ctx.initial
            T = next(iter(inputs.values())).shape[0]
            g_out = dict(zip(out_names, grads[:len(out_names)]))
            carry = {n: g for n, g in zip(state_names, grads[len(out_names):])
                     if g is not None}
            d_inputs = {n: [] for n in in_names}
            d_params = {n: torch.zeros_like(p) for n, p in params.items()}
            d_initial = {n: torch.zeros_like(s) for n, s in initial.items()}
            chunks = _chunks(T, kind, k)
            for c in reversed(range(len(chunks))):
                t0, t1 = chunks[c]
                part = {n: x[t0:t1] for n, x in inputs.items()}
                r = resets[t0:t1] if resets is not None else None
                start = ctx.starts[c]
                if kind == "chunk":
                    # Replay the chunk's forward, saving its gates.
                    _, hist, gates = cell.forward(part, params, start, r,
                                                  save_gates=True, initial=initial)
                    save = True
                else:
                    hist, gates = ctx.kept["history"], ctx.kept["gates"]
                    save = kind == "none"
                go = {n: g[t0:t1] for n, g in g_out.items() if g is not None}
                di, dp, dinit, dstart = cell.backward(part, params, start, initial, r, hist,
                                                      gates, go, carry, save)
                for n in in_names:
                    d_inputs[n].insert(0, di[n])
                for n in par_names:
                    d_params[n] += dp[n]
                for n in state_names:
                    d_initial[n] += dinit[n].reshape(d_initial[n].shape).to(d_initial[n].dtype)
                carry = dstart
            for n in state_names:
                d_initial[n] += carry[n].to(d_initial[n].dtype)
            grads_in = [torch.cat(d_inputs[n]) if len(d_inputs[n]) > 1 else d_inputs[n][0]
                        for n in in_names]
            return ((None, None, None, None) + tuple(grads_in)
                    + tuple(d_params[n] for n in par_names)
                    + tuple(d_initial[n] for n in state_names))

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

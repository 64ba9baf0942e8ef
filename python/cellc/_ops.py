"""A cell's sequence as torch operators (torch >= 2.4): `cellc::sequence` and
`cellc::sequence_backward`, with fake implementations that give the exact
shapes from the cell's interface and an autograd formula. torch.compile and
torch.export see one op a call: no graph break, and T and B stay symbolic.

The forward returns the outputs, the final states and what the backward
needs (the kept buffers of `CpuCell::keptLayout`: states' histories or chunk
starts, and gates), allocated by torch so that autograd holds them; the
outputs that are states' histories are saved as outputs. Nothing in here
reads a tensor's values while tracing: the lengths' values are checked in
the real implementation, which runs the same driver as torch 1.13's
autograd.Function (core._CellFunction)."""

import itertools
import json
import weakref
from typing import List, Optional

import torch
from torch import Tensor

from .cuda import not_differentiable_again

#: Whether this torch can register cellc's operators.
AVAILABLE = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

_ELEMENTS = {"f32": torch.float32, "f64": torch.float64}

# The cells that ops name, by key (cell_key), while they live. A key whose
# cell is gone (an exported program loaded in another process) makes its
# cell again from the key itself.
_CELLS = weakref.WeakValueDictionary()
_NEXT = itertools.count()


def cell_key(cell):
    """The string that names `cell` in its ops: its source and options, and
    which Cell it is (each keeps its own memory_stats)."""
    key = json.dumps({"source": cell.source, "file": cell.file_name,
                      "target": cell.target, "threads": cell.threads,
                      "unit_slices": cell.unit_slices,
                      "cuda": sorted(cell.cuda_options.items()), "id": next(_NEXT)},
                     sort_keys=True)
    _CELLS[key] = cell
    return key


#: Makes the Cell of an op's key (its decoded spec) where none lives: set by
#: the package (cellc/__init__.py), which sits above both this module and
#: cellc.core, so that an exported program runs in a process that has only
#: imported cellc.
make_cell = None


def _cell(key):
    cell = _CELLS.get(key)
    if cell is None:
        cell = make_cell(json.loads(key))
        _CELLS[key] = cell
    return cell


def _sizes(cell, sizes):
    """The size symbols' values from the ops' list (-1: not bound)."""
    return {n: v for n, v in zip(cell.size_symbols, sizes) if v >= 0}


def _lead(mode, T):
    """The leading dimension of a per-chunk kept buffer."""
    if mode.startswith("chunk:"):
        K = int(mode[len("chunk:"):])
        return (T + K - 1) // K
    return T


def _empty_outputs(cell, sizes, mode, training, x0, has_lengths):
    """The op's results, allocated (fake or real): outputs [T, B, n], final
    states [B, n], and the kept buffers when training."""
    T, B = x0.shape[0], x0.shape[1]
    layout = cell.layout(sizes, x0.dtype, mode, has_lengths, x0.device)
    results = [x0.new_empty(T, B, n, dtype=dtype) for n, dtype in layout["outputs"]]
    results += [x0.new_empty(B, n, dtype=dtype) for n, dtype in layout["states"]]
    if training:
        results += [x0.new_empty(_lead(mode, T) if per_chunk else T, B, n, dtype=dtype)
                    for per_chunk, n, dtype in layout["kept"]]
    return results


def _contiguous(*lists):
    """Each list's tensors, contiguous (the driver reads dense buffers). The
    caller holds the copies while the driver runs."""
    return [[t.contiguous() if t is not None else None for t in ts] for ts in lists]


def _buffers(tensors):
    return [(t.data_ptr(), list(t.shape)) if t is not None else (0, []) for t in tensors]


class CpuRunner:
    """The JIT-compiled cell as the operators run it (CudaCell has the same
    three methods)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def memory_stats(self):
        return self.compiled.memory_stats()

    def layout(self, mode, has_lengths):
        kept, read = self.compiled.kept_layout(mode, has_lengths)
        return {"outputs": [(shape[0], None) for _, shape in self.compiled.outputs],
                "states": [(shape[0], None) for _, shape in self.compiled.states],
                "kept": [(per_chunk, n, _ELEMENTS[e]) for per_chunk, n, e in kept],
                "read": read}

    def forward_kept(self, mode, inputs, params, states, resets, lengths, outputs, finals,
                     kept):
        T, B = inputs[0].shape[:2]
        self.compiled.forward(_buffers(inputs), _buffers(params), _buffers(states),
                              resets.data_ptr() if resets is not None else 0, T, B, False,
                              _buffers(outputs), _buffers(finals), mode, kept is not None,
                              lengths, outputs_outlive_saved=True,
                              kept=_buffers(kept) if kept is not None else None)

    def backward_kept(self, mode, inputs, params, states, resets, lengths, outputs, kept,
                      grad_outputs, grad_finals, grad_inputs, grad_params, grad_states):
        T, B = inputs[0].shape[:2]
        self.compiled.backward_kept(
            _buffers(inputs), _buffers(params), _buffers(states),
            resets.data_ptr() if resets is not None else 0, T, B, mode, lengths,
            _buffers(outputs), _buffers(kept), _buffers(grad_outputs), _buffers(grad_finals),
            _buffers(grad_inputs), _buffers(grad_params),
            _buffers(grad_states if states else [None] * len(self.compiled.states)))


if AVAILABLE:
    @torch.library.custom_op("cellc::sequence", mutates_args=())
    def sequence(cell: str, mode: str, sizes: List[int], training: bool,
                 inputs: List[Tensor], params: List[Tensor], states: List[Tensor],
                 resets: Optional[Tensor], lengths: Optional[Tensor]) -> List[Tensor]:
        """Runs the cell over time-major `inputs`: its outputs, final states and,
        when `training`, the kept buffers for `sequence_backward`."""
        from ._autograd import _check_lengths
        c = _cell(cell)
        inputs, params, states = _contiguous(inputs, params, states)
        x0 = inputs[0]
        T, B = x0.shape[0], x0.shape[1]
        values = _check_lengths(lengths, T, B)
        bound = _sizes(c, sizes)
        runner = c._runner(bound, x0.dtype, x0.device, batch=B, seq_len=T)
        results = _empty_outputs(c, bound, mode, training, x0, lengths is not None)
        n_out, n_st = len(c.outputs), len(c.states)
        runner.forward_kept(mode, inputs, params, states, resets, values, results[:n_out],
                            results[n_out:n_out + n_st],
                            results[n_out + n_st:] if training else None)
        c._last = runner
        return results

    @sequence.register_fake
    def _(cell, mode, sizes, training, inputs, params, states, resets, lengths):
        c = _cell(cell)
        return _empty_outputs(c, _sizes(c, sizes), mode, training, inputs[0],
                              lengths is not None)

    @torch.library.custom_op("cellc::sequence_backward", mutates_args=())
    def sequence_backward(cell: str, mode: str, sizes: List[int], inputs: List[Tensor],
                          params: List[Tensor], states: List[Tensor],
                          resets: Optional[Tensor], lengths: Optional[Tensor],
                          outputs: List[Optional[Tensor]], kept: List[Tensor],
                          grad_outputs: List[Optional[Tensor]],
                          grad_finals: List[Optional[Tensor]],
                          wanted: List[bool]) -> List[Tensor]:
        """The gradients of the inputs, params and states of a `sequence` call
        (empty where not `wanted`) from those of its outputs and final states
        (None: zeros), given its kept buffers and the outputs it reads."""
        from ._autograd import _check_lengths
        c = _cell(cell)
        # Held here while the driver reads them (an expanded gradient, such
        # as that of a sum, becomes a copy).
        inputs, params, states, outputs, kept, grad_outputs, grad_finals = _contiguous(
            inputs, params, states, outputs, kept, grad_outputs, grad_finals)
        x0 = inputs[0]
        T, B = x0.shape[0], x0.shape[1]
        values = _check_lengths(lengths, T, B)
        runner = c._runner(_sizes(c, sizes), x0.dtype, x0.device, batch=B, seq_len=T)
        grads = _empty_grads(inputs, params, states, wanted)
        want = [g if w else None for g, w in zip(grads, wanted)]
        n_in, n_par = len(inputs), len(params)
        runner.backward_kept(mode, inputs, params, states, resets, values, outputs, kept,
                             grad_outputs, grad_finals, want[:n_in], want[n_in:n_in + n_par],
                             want[n_in + n_par:])
        c._last = runner
        return grads

    def _empty_grads(inputs, params, states, wanted):
        tensors = [*inputs, *params, *states]
        return [torch.empty(t.shape, dtype=t.dtype, device=t.device) if w
                else t.new_empty(0) for t, w in zip(tensors, wanted)]

    @sequence_backward.register_fake
    def _(cell, mode, sizes, inputs, params, states, resets, lengths, outputs, kept,
          grad_outputs, grad_finals, wanted):
        return _empty_grads(inputs, params, states, wanted)

    def _setup_context(ctx, inputs, output):
        cell, mode, sizes, training, ins, params, states, resets, lengths = inputs
        c = _cell(cell)
        layout = c.layout(_sizes(c, sizes), ins[0].dtype, mode, lengths is not None,
                          ins[0].device)
        n_out, n_st = len(layout["outputs"]), len(layout["states"])
        kept = output[n_out + n_st:]
        if kept:
            ctx.mark_non_differentiable(*kept)
        # Gradients nobody produced stay None: the driver reads null as zeros.
        ctx.set_materialize_grads(False)
        read = layout["read"] if training else []
        ctx.counts = (len(ins), len(params), len(states), read, n_out, n_st)
        ctx.call = (cell, mode, sizes, training)
        # An output that is a state's history is saved: autograd then refuses
        # a backward after an in-place change to it.
        ctx.save_for_backward(*ins, *params, *states, *[output[i] for i in read], *kept,
                              resets, lengths)

    def _backward(ctx, grads):
        cell, mode, sizes, training = ctx.call
        if not training:
            raise RuntimeError("cellc: this call ran without autograd (no tensor required "
                               "a gradient, or grad mode was off); it cannot backward")
        n_in, n_par, n_st, read, n_out, n_states = ctx.counts
        saved = ctx.saved_tensors
        ins, params = list(saved[:n_in]), list(saved[n_in:n_in + n_par])
        states = list(saved[n_in + n_par:n_in + n_par + n_st])
        rest = saved[n_in + n_par + n_st:]
        outputs = [None] * n_out
        for i, t in zip(read, rest):
            outputs[i] = t
        kept, (resets, lengths) = list(rest[len(read):-2]), rest[-2:]
        needs = ctx.needs_input_grad
        wanted = [*needs[4], *needs[5], *needs[6]]
        with torch.no_grad():
            result = torch.ops.cellc.sequence_backward(
                cell, mode, sizes, ins, params, states, resets, lengths, outputs, kept,
                list(grads[:n_out]), list(grads[n_out:n_out + n_states]), wanted)
        # Under create_graph the kernels' gradients raise when differentiated
        # again, never a silent zero (cuda.not_differentiable_again).
        result = not_differentiable_again([g if w else None for g, w in zip(result, wanted)])
        return (None, None, None, None, result[:n_in], result[n_in:n_in + n_par],
                result[n_in + n_par:], None, None)

    sequence.register_autograd(_backward, setup_context=_setup_context)

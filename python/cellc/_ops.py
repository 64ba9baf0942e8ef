"""The one autograd glue of a cellc call: the torch operators
`cellc::sequence` and `cellc::sequence_backward` (torch >= 2.4), with fake
implementations that give the exact shapes from the cell's interface and an
autograd formula. torch.compile and torch.export see one op a call: no graph
break, and T and B stay symbolic. On a torch without custom operators (the
Debian torch 1.13 that `make test` runs), `_Shim` runs the same
implementation, setup_context and backward under an autograd.Function.

The forward returns the outputs, the final states and what the backward
needs (the kept buffers of the runner's layout: states' histories or chunk
starts, and gates), allocated by torch so that autograd holds them; the
outputs that are states' histories are saved as outputs. Nothing in here
reads a tensor's values while tracing: the lengths' values are checked in
the real implementation.

`call` runs a front's checked call (cellc._front) through them: compiled
cells, CPU packages and CUDA packages alike. This file imports torch, the
standard library and cellc._front alone (a GPU machine loads it beside
cuda.py)."""

import itertools
import json
import math
import warnings
import weakref
from typing import List, Optional

import torch
from torch import Tensor
from torch.utils.dlpack import from_dlpack

# Fixed: the front of a package, for cellc.cuda.
from ._front import Fixed, _check_lengths, _compiling, check, shaped_states  # noqa: F401

#: Whether this torch can register cellc's operators.
AVAILABLE = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

_ELEMENTS = {"f32": torch.float32, "f64": torch.float64}
_ELEMENT_OF = {dtype: e for e, dtype in _ELEMENTS.items()}

# The cells that ops name, by key (cell_key), while they live. A key whose
# cell is gone (an exported program loaded in another process) makes its
# cell again from the key itself.
_CELLS = weakref.WeakValueDictionary()
_NEXT = itertools.count()


def cell_key(cell):
    """The string that names `cell` in its ops: its source and options, and
    which Cell it is (each keeps its own memory_stats)."""
    return front_key(cell, {"source": cell.source, "file": cell.file_name,
                            "target": cell.target, "threads": cell.threads,
                            "unit_slices": cell.unit_slices,
                            "cuda": sorted(cell.cuda_options.items())})


def front_key(front, spec):
    """Registers `front` (cellc._front) under a key made of `spec` (a dict)
    and a number of its own, and returns the key."""
    key = json.dumps(dict(spec, id=next(_NEXT)), sort_keys=True)
    _CELLS[key] = front
    return key


#: Makes the Cell of an op's key (its decoded spec) where none lives: set by
#: the package (cellc/__init__.py), which sits above both this module and
#: cellc.core, so that an exported program runs in a process that has only
#: imported cellc.
make_cell = None


def _cell(key):
    cell = _CELLS.get(key)
    if cell is None:
        spec = json.loads(key)
        if "source" not in spec or make_cell is None:
            raise RuntimeError(f"cellc: the package {spec.get('package')!r} of this call is "
                               "not loaded in this process; load it before running the call")
        cell = make_cell(spec)
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


def _empty_outputs(cell, sizes, mode, training, x0, has_lengths, runner=None):
    """The op's results, allocated (fake or real): outputs [T, B, n], final
    states [B, n], and the kept buffers when training (the `runner`'s own
    where it lends them: CpuRunner.empty)."""
    T, B = x0.shape[0], x0.shape[1]
    layout = cell.layout(sizes, x0.dtype, mode, has_lengths, x0.device)
    empty = getattr(runner, "empty", None)
    if getattr(cell, "lend_outputs", False) and empty is not None:
        # The chunk form's prologue: its outputs live as long as the call's
        # backward, as the kept buffers do (CpuRunner.empty).
        results = [empty((T, B, n), dtype or x0.dtype) for n, dtype in layout["outputs"]]
    else:
        results = [x0.new_empty(T, B, n, dtype=dtype) for n, dtype in layout["outputs"]]
    results += [x0.new_empty(B, n, dtype=dtype) for n, dtype in layout["states"]]
    if training:
        for per_chunk, n, dtype in layout["kept"]:
            shape = (_lead(mode, T) if per_chunk else T, B, n)
            results.append(empty(shape, dtype) if empty is not None
                           else x0.new_empty(*shape, dtype=dtype))
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

    def empty(self, shape, dtype):
        """A kept buffer on the runtime's pages, which go back to its cache
        when autograd frees the tensor: the next training call of these sizes
        runs on them instead of faulting in fresh pages (a glibc block over
        32 MiB is fresh pages every call: an LSTM 256 x 50's gates)."""
        return from_dlpack(self.compiled.buffer(list(shape), _ELEMENT_OF[dtype]))

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
                              _buffers(outputs), _buffers(finals), mode, lengths,
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


def _sequence(cell: str, mode: str, sizes: List[int], training: bool,
              inputs: List[Tensor], params: List[Tensor], states: List[Tensor],
              resets: Optional[Tensor], lengths: Optional[Tensor]) -> List[Tensor]:
    """Runs the cell over time-major `inputs`: its outputs, final states and,
    when `training`, the kept buffers for `sequence_backward`."""
    c = _cell(cell)
    inputs, params, states = _contiguous(inputs, params, states)
    x0 = inputs[0]
    T, B = x0.shape[0], x0.shape[1]
    values = _check_lengths(lengths, T, B)
    bound = _sizes(c, sizes)
    runner = c._runner(bound, x0.dtype, x0.device, batch=B, seq_len=T)
    results = _empty_outputs(c, bound, mode, training, x0, lengths is not None, runner)
    n_out, n_st = len(c.outputs), len(c.states)
    runner.forward_kept(mode, inputs, params, states, resets, values, results[:n_out],
                        results[n_out:n_out + n_st],
                        results[n_out + n_st:] if training else None)
    c._last = runner
    return results


def _sequence_fake(cell, mode, sizes, training, inputs, params, states, resets, lengths):
    c = _cell(cell)
    return _empty_outputs(c, _sizes(c, sizes), mode, training, inputs[0], lengths is not None)


def _sequence_backward(cell: str, mode: str, sizes: List[int], inputs: List[Tensor],
                       params: List[Tensor], states: List[Tensor],
                       resets: Optional[Tensor], lengths: Optional[Tensor],
                       outputs: List[Optional[Tensor]], kept: List[Tensor],
                       grad_outputs: List[Optional[Tensor]],
                       grad_finals: List[Optional[Tensor]],
                       wanted: List[bool]) -> List[Tensor]:
    """The gradients of the inputs, params and states of a `sequence` call
    (empty where not `wanted`) from those of its outputs and final states
    (None: zeros), given its kept buffers and the outputs it reads."""
    c = _cell(cell)
    # Held here while the driver reads them (an expanded gradient, such as
    # that of a sum, becomes a copy).
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


def _sequence_backward_fake(cell, mode, sizes, inputs, params, states, resets, lengths,
                            outputs, kept, grad_outputs, grad_finals, wanted):
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
    # An output that is a state's history is saved: autograd then refuses a
    # backward after an in-place change to it.
    ctx.save_for_backward(*ins, *params, *states, *[output[i] for i in read], *kept,
                          resets, lengths)


def _backward(ctx, grads):
    cell, mode, sizes, training = ctx.call
    if not training:
        raise RuntimeError("cellc: this call ran without autograd (no tensor required a "
                           "gradient, or grad mode was off); it cannot backward")
    n_in, n_par, n_st, read, n_out, n_states = ctx.counts
    saved = ctx.saved_tensors
    ins, params = list(saved[:n_in]), list(saved[n_in:n_in + n_par])
    states = list(saved[n_in + n_par:n_in + n_par + n_st])
    rest = saved[n_in + n_par + n_st:]
    outputs = [None] * n_out
    for i, t in zip(read, rest):
        outputs[i] = t
    kept, (resets, lengths) = list(rest[len(read):-2]), rest[-2:]
    wanted = getattr(ctx, "wanted", None)
    if wanted is None:  # the operator's: one tuple of flags per list
        needs = ctx.needs_input_grad
        wanted = [*needs[4], *needs[5], *needs[6]]
    with torch.no_grad():
        result = sequence_backward(
            cell, mode, sizes, ins, params, states, resets, lengths, outputs, kept,
            list(grads[:n_out]), list(grads[n_out:n_out + n_states]), list(wanted))
    # Under create_graph the kernels' gradients raise when differentiated
    # again, never a silent zero (not_differentiable_again).
    result = not_differentiable_again([g if w else None for g, w in zip(result, wanted)])
    # torch >= 2.4 matches the returned structure to the inputs': None stands
    # for a list of ints (the sizes), but an empty list (a package's sizes)
    # must be returned as one.
    return (None, None, None if sizes else [], None, result[:n_in],
            result[n_in:n_in + n_par], result[n_in + n_par:], None, None)


class _Shim(torch.autograd.Function):
    """The operators' implementation, setup_context and backward under an
    autograd.Function, for a torch without custom operators: the same code
    runs on every torch."""

    @staticmethod
    def forward(ctx, cell, mode, sizes, training, counts, resets, lengths, *tensors):
        n_in, n_par = counts
        args = (cell, mode, sizes, training, list(tensors[:n_in]),
                list(tensors[n_in:n_in + n_par]), list(tensors[n_in + n_par:]), resets,
                lengths)
        output = _sequence(*args)
        # The flags of the tensors, as the operator's backward reads them
        # (cell, mode, sizes, training, counts, resets and lengths come first).
        ctx.wanted = list(ctx.needs_input_grad[7:])
        _setup_context(ctx, args, output)
        return tuple(output)

    @staticmethod
    def backward(ctx, *grads):
        result = _backward(ctx, grads)
        return (None,) * 7 + tuple(result[4]) + tuple(result[5]) + tuple(result[6])


if AVAILABLE:
    sequence = torch.library.custom_op("cellc::sequence", mutates_args=())(_sequence)
    sequence.register_fake(_sequence_fake)
    sequence_backward = torch.library.custom_op("cellc::sequence_backward",
                                                mutates_args=())(_sequence_backward)
    sequence_backward.register_fake(_sequence_backward_fake)
    sequence.register_autograd(_backward, setup_context=_setup_context)
else:
    sequence_backward = _sequence_backward

    def sequence(cell, mode, sizes, training, inputs, params, states, resets, lengths):
        return list(_Shim.apply(cell, mode, sizes, training, (len(inputs), len(params)),
                                resets, lengths, *inputs, *params, *states))


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
    if not torch.is_grad_enabled():
        return gradients
    given = [g.detach().requires_grad_() for g in gradients if isinstance(g, torch.Tensor)]
    if not given:
        return gradients
    errors = torch._C._functions.DelayedError(TWICE.encode(), len(given))(*given)
    # One gradient comes back as a tensor, not a tuple of one (iterating it
    # would take its rows: the gradient of an input alone, params frozen).
    errors = iter((errors,) if isinstance(errors, torch.Tensor) else errors)
    return type(gradients)(next(errors) if isinstance(g, torch.Tensor) else g
                           for g in gradients)


#: The training forms a call takes: the step kernels, the chunkwise form of
#: a cell whose matrix states are gated linear recurrences (cellc._chunkwise),
#: or the one of them that cellc._chunkwise.choose expects to be faster.
FORMS = ("step", "chunk", "auto")


def check_form(form, chunk):
    """Raises ValueError unless `form` is one of FORMS and `chunk` is None or
    a positive number of steps."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(map(repr, FORMS))}, not {form!r}")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be a positive number of steps, not {chunk!r}")


def call(front, x, params, states=None, *, form="step", chunk=None, **options):
    """A call of `front` (cellc._front): checked there, run through the
    operators. Returns (output, final states): the output a tensor where the
    cell has one, else a dict; the final states a dict, a matrix state in
    its declared dims. `options`: save_gates, resets, recompute,
    batch_first, lengths, sizes. `form`: one of FORMS; `chunk`: the chunk
    form's chunk length."""
    check_form(form, chunk)
    c = check(front, x, params, states, **options)
    if c is None:
        return _empty_batch(front, x, params, states, **options)
    if form == "auto":
        from . import _chunkwise
        form = _chunkwise.choose(front, c, chunk)
    if form == "chunk":
        return _chunk_call(front, c, chunk)
    x0 = c.inputs[0]
    state_list = []
    if c.states is not None:
        for n, _ in front.states:
            t = c.states.get(n)
            # The CUDA kernels' states are float32 whatever the storage.
            state_list.append(t if t is not None else x0.new_zeros(
                c.B, math.prod(front.shape(n, c.sizes)),
                dtype=torch.float32 if c.cuda else x0.dtype))
    inputs, params, state_list = ([t.contiguous() for t in ts]
                                  for ts in (c.inputs, c.params, state_list))
    training = torch.is_grad_enabled() and any(
        t.requires_grad for t in (*inputs, *params, *state_list))
    # The sizes key the kernels; the fake implementation reads them too.
    # (Under torch.compile, int() makes a size that Dynamo would leave
    # symbolic a constant; T and B stay symbolic.)
    values = [int(c.sizes[n]) if n in c.sizes else -1 for n in front.size_symbols]
    results = sequence(front._key, c.mode, values, training, inputs, params, state_list,
                       c.resets, c.lengths)
    n_out, n_st = len(front.outputs), len(front.states)
    if not _compiling():
        front.saved_bytes = sum(k.numel() * k.element_size() for k in results[n_out + n_st:])
    return _returned(front, c, list(results[:n_out]), results[n_out:n_out + n_st])


def _chunk_call(front, c, chunk):
    """A call in the chunk form (cellc._chunkwise), in the call's recompute
    mode."""
    from . import _cellc_runtime, _chunkwise
    if c.cuda and c.inputs[0].dtype != torch.float32:
        raise NotImplementedError("form='chunk' with the CUDA kernels takes float32 "
                                  f"storage, not {c.inputs[0].dtype}; use form='step'")
    _cellc_runtime.check_mode(c.mode)
    outs, finals = _chunkwise.call(front, c, chunk)
    return _returned(front, c, outs, finals)


def _returned(front, c, outs, finals):
    """A call's outputs ([T, B, n] each) and final states ([B, n]) as the
    call returns them."""
    n_out = len(front.outputs)
    outs = shaped_outputs(front, c.sizes, list(outs))
    outs = [o.transpose(0, 1) if c.batch_first else o for o in outs]
    out = outs[0] if n_out == 1 else dict(zip(front.outputs, outs))
    final = {n: t for (n, _), t in zip(front.states, finals)}
    return out, shaped_states(final, {n: front.shape(n, c.sizes) for n, dims in front.states
                                      if len(dims) > 1})


#: True: a state output of several dims comes flat, `[T, B, NH*K*V]`, as
#: before it came in its declared dims (deprecated: set it only while code
#: that reads the flat shape is changed; it goes in a later release).
flat_matrix_outputs = False


def shaped_outputs(front, sizes, outs, lead=2):
    """The outputs (each with `lead` leading dims, then its units) in their
    declared dims where they are states of several."""
    dims = front.output_dims(sizes)
    if not any(dims):
        return outs
    if flat_matrix_outputs:
        warnings.warn("cellc._ops.flat_matrix_outputs is deprecated: a state output of "
                      "several dims comes as [T, B, *dims]; use .flatten(2) for the flat "
                      "shape", DeprecationWarning, stacklevel=3)
        return outs
    return [o.reshape(*o.shape[:lead], *d) if d else o for o, d in zip(outs, dims)]


def _empty_batch(front, x, params, states, *, resets=None, batch_first=False, **options):
    """A call over B = 0 rows, as torch's RNNs take one: empty outputs and
    final states, and gradients of zeros for the params. One row of zeros
    runs in the batch's place and is cut away, so that the call and its
    backward take the usual path."""
    dim = 0 if batch_first else 1

    def pad(t, at=dim):
        return torch.cat([t, t.new_zeros(*t.shape[:at], 1, *t.shape[at + 1:])], at)

    x = {n: pad(t) for n, t in x.items()} if isinstance(x, dict) else pad(x)
    options.pop("lengths", None)
    out, final = call(front, x, params,
                      None if states is None else {n: pad(t, 0) for n, t in states.items()},
                      resets=None if resets is None else pad(resets),
                      batch_first=batch_first, **options)
    cut = lambda t, at=dim: t.narrow(at, 0, 0)
    out = {n: cut(o) for n, o in out.items()} if isinstance(out, dict) else cut(out)
    return out, {n: cut(t, 0) for n, t in final.items()}
